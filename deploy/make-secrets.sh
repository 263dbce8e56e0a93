#!/bin/sh
# Creates deploy/secrets/ (mode 0700) with the first cluster admin's token (stoker_admin_token),
# a worker join token (stoker_join_token; the server makes both known at its first start, the join
# token usable for an hour), Grafana's admin password and a self-signed TLS pair, unless they
# exist. The files are 0444 so the non-root containers can read
# their bind mounts; the directory's 0700 keeps other host users out.
# STOKER_SECRETS_DIR writes them elsewhere (compose reads the same variable).
set -eu
dir="${STOKER_SECRETS_DIR:-$(cd "$(dirname "$0")" && pwd)/secrets}"
mkdir -p "$dir"
chmod 0700 "$dir"
# 256 random bits in hex behind the kind's prefix (docs/authorization.md).
for entry in stoker_admin_token:stku_ stoker_join_token:stkj_ grafana_admin_password:; do
  name=${entry%%:*} prefix=${entry#*:}
  if [ ! -s "$dir/$name" ]; then
    printf '%s%s\n' "$prefix" "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" > "$dir/$name"
    chmod 0444 "$dir/$name"
    echo "wrote $dir/$name"
  fi
done
# TLS: a self-signed pair for host name "server" (the workers' address), also valid for the
# host's 127.0.0.1 and localhost.
command -v openssl >/dev/null ||
  { echo "make-secrets: openssl is missing (apt-get install openssl)" >&2; exit 1; }
if [ ! -s "$dir/stoker_tls_cert.pem" ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=server" \
    -addext "subjectAltName=DNS:server,DNS:localhost,IP:127.0.0.1" \
    -keyout "$dir/stoker_tls_key.pem" -out "$dir/stoker_tls_cert.pem" 2>/dev/null
  chmod 0444 "$dir/stoker_tls_key.pem" "$dir/stoker_tls_cert.pem"
  echo "wrote $dir/stoker_tls_cert.pem and stoker_tls_key.pem"
fi
