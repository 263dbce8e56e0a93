#!/bin/sh
# Creates deploy/secrets/ (mode 0700) with a random bearer token and Grafana admin password,
# unless they exist. The files are 0444 so the non-root containers can read their bind mounts;
# the directory's 0700 keeps other host users out.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
mkdir -p "$dir"
chmod 0700 "$dir"
for name in stoker_token grafana_admin_password; do
  if [ ! -s "$dir/$name" ]; then
    head -c 32 /dev/urandom | base64 | tr -d '/+=\n' > "$dir/$name"
    chmod 0444 "$dir/$name"
    echo "wrote $dir/$name"
  fi
done
# TLS (when enabled in docker-compose.yml): a self-signed pair for host name "server".
if [ ! -s "$dir/stoker_tls_cert.pem" ] && command -v openssl >/dev/null; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=server" \
    -addext "subjectAltName=DNS:server,DNS:localhost,IP:127.0.0.1" \
    -keyout "$dir/stoker_tls_key.pem" -out "$dir/stoker_tls_cert.pem" 2>/dev/null
  chmod 0444 "$dir/stoker_tls_key.pem" "$dir/stoker_tls_cert.pem"
  echo "wrote $dir/stoker_tls_cert.pem and stoker_tls_key.pem"
fi
