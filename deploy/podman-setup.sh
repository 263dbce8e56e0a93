#!/usr/bin/env bash
# Prepares a Debian 12 machine to build and run deploy/ with podman instead of Docker (as root):
#   1. installs podman, runc, catatonit (compose's `init: true`), docker-compose and mmdebstrap;
#   2. on machines without systemd as PID 1 or without a unified cgroup v2 hierarchy, writes the
#      drop-in /etc/containers/containers.conf.d/50-stoker.conf: cgroupfs as cgroup manager,
#      runc as runtime (crun refuses hybrid cgroups), no default ulimits (some sandboxes refuse
#      setrlimit);
#   3. makes the base images the Dockerfiles start from, debian:12 and debian:12-slim, when they
#      are missing: pulled from Docker Hub when it is reachable (--pull), else built from Debian's
#      own packages with mmdebstrap (the default; the apt sources are this machine's, so
#      `apt-get install` works in the image builds). The slim image leaves out manuals,
#      documentation and translations, as Docker's debian:12-slim does.
# Then it builds and runs a one-line image to show that podman works.
#
#   deploy/podman-setup.sh [--pull]        (idempotent)
set -euo pipefail
pull=0
case "${1:-}" in
  --pull) pull=1 ;;
  "") ;;
  *) echo "usage: deploy/podman-setup.sh [--pull]" >&2; exit 2 ;;
esac
[[ $(id -u) -eq 0 ]] || { echo "podman-setup: run as root (rootless podman is not set up here)" >&2; exit 1; }

missing=()
for package in podman runc catatonit docker-compose mmdebstrap; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]})); then
  echo "podman-setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

dropin=/etc/containers/containers.conf.d/50-stoker.conf
if [[ "$(ps -p 1 -o comm=)" != systemd || "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]]; then
  if [[ ! -e "$dropin" ]]; then
    mkdir -p "$(dirname "$dropin")"
    cat > "$dropin" <<'CONF'
# Written by Stoker's deploy/podman-setup.sh: no systemd as PID 1 or no unified cgroup v2.
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
CONF
    echo "podman-setup: wrote $dropin (cgroupfs, runc, no default ulimits)"
  fi
fi

have_image() { podman image exists "$1"; }
if ! have_image debian:12 || ! have_image debian:12-slim; then
  if ((pull)); then
    podman pull docker.io/library/debian:12
    podman pull docker.io/library/debian:12-slim
  else
    sources=$(ls /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
    [[ -n "$sources" ]] || sources=/etc/apt/sources.list
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if ! have_image debian:12; then
      echo "podman-setup: debian:12 from Debian's packages (mmdebstrap, apt sources $sources)"
      mmdebstrap --quiet --variant=apt --include=ca-certificates \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$work/debian-12.tar" "$sources"
      podman import --quiet "$work/debian-12.tar" localhost/debian:12 >/dev/null
    fi
    if ! have_image debian:12-slim; then
      echo "podman-setup: debian:12-slim (without manuals, documentation and translations)"
      mmdebstrap --quiet --variant=apt --include=ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$work/debian-12-slim.tar" "$sources"
      podman import --quiet "$work/debian-12-slim.tar" localhost/debian:12-slim >/dev/null
    fi
  fi
fi

smoke=$(mktemp -d)
printf 'FROM debian:12-slim\nRUN echo podman works > /ok\nCMD ["cat", "/ok"]\n' > "$smoke/Dockerfile"
podman build --quiet --isolation chroot -t localhost/stoker-podman-smoke "$smoke" >/dev/null
result=$(podman run --rm localhost/stoker-podman-smoke)
podman rmi --force localhost/stoker-podman-smoke >/dev/null
rm -rf "$smoke"
[[ "$result" == "podman works" ]] || { echo "podman-setup: the smoke test printed '$result'" >&2; exit 1; }
echo "podman-setup: ready (base images debian:12, debian:12-slim); next: deploy/podman-build.sh"
