#!/usr/bin/env bash
# Prepares a Debian 12 machine to build and run deploy/ with podman instead of Docker (as root):
#   1. installs podman, runc, catatonit (compose's `init: true`), docker-compose, mmdebstrap, and
#      the network stack that gives compose services their names: netavark with aardvark-dns
#      (iptables for their NAT rules). These are named explicitly because Debian only recommends
#      them: podman installed with --no-install-recommends gets CNI without any DNS plugin, and
#      a compose worker then cannot resolve `server`;
#   2. checks which stack this podman store uses. A store podman had not used yet takes netavark
#      (installed above before its first use; podman records the choice in the store). A store
#      already on CNI (podman used before netavark was installed) keeps CNI: the CNI `dnsname`
#      plugin is installed for it, since moving the store to netavark needs `podman system
#      reset`, which deletes every container, image, volume and network; this script never runs
#      it, it only says how;
#   3. on machines without systemd as PID 1 or without a unified cgroup v2 hierarchy, writes the
#      drop-in /etc/containers/containers.conf.d/50-stoker.conf: cgroupfs as cgroup manager,
#      runc as runtime (crun refuses hybrid cgroups), no default ulimits (some sandboxes refuse
#      setrlimit);
#   4. makes the base images the Dockerfiles start from, debian:12 and debian:12-slim, when they
#      are missing: pulled from Docker Hub when it is reachable (--pull), else built from Debian's
#      own packages with mmdebstrap (the default; the apt sources are this machine's, so
#      `apt-get install` works in the image builds). The slim image leaves out manuals,
#      documentation and translations, as Docker's debian:12-slim does.
# Then it builds and runs a one-line image to show that podman works, and proves service-name
# resolution as compose uses it: on a fresh network, one container resolves another by a network
# alias (not its container name, with no /etc/hosts entries). It reports success only then.
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

install_missing() {  # PACKAGE...
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  ((${#missing[@]})) || return 0
  echo "podman-setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
# netavark and aardvark-dns before podman's first use, so that a fresh store chooses netavark.
install_missing podman runc catatonit docker-compose mmdebstrap iptables netavark aardvark-dns

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

# The network stack: podman decides once per store and records it (graphroot/defaultNetworkBackend).
backend=$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null) ||
  { echo "podman-setup: 'podman info' failed:" >&2; podman info >&2; exit 1; }
case "$backend" in
  netavark)
    echo "podman-setup: network stack netavark, service names through aardvark-dns" ;;
  cni)
    # A store that podman used before netavark was installed. Keep it (switching deletes all of
    # its containers, images and volumes) and give CNI its DNS plugin.
    install_missing golang-github-containernetworking-plugin-dnsname
    echo "podman-setup: network stack CNI (this store was set up with CNI before netavark was" \
         "installed), service names through the CNI dnsname plugin. To move it to netavark" \
         "instead: podman system reset (DELETES every container, image, volume and network of" \
         "this store), then run this script again."
    ;;
  *)
    echo "podman-setup: podman reports the network stack '$backend', which this script does not" \
         "know (netavark or cni expected)" >&2
    exit 1 ;;
esac

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
# Service names, as compose uses them: a fresh network (with DNS, which podman enables on a new
# network when the stack has it), a container known by a network alias, and a second container
# that resolves the alias through DNS alone (--no-hosts: podman writes no /etc/hosts entries).
# Networks made before the DNS pieces were installed have none, compose's among them.
stale=$(podman network ls --format '{{.Name}} {{.DNSEnabled}}' | awk '$1 != "podman" && $2 == "false" {print $1}')
if [[ -n "$stale" ]]; then
  echo "podman-setup: these networks were made without DNS, and containers on them cannot resolve" \
       "each other by name: $(echo $stale). A compose project's network is made again by" \
       "'docker-compose down' and 'up' (or: podman network rm NAME, once nothing uses it)."
fi
probe="stoker-dns-probe-$$"
cleanup_probe() {
  podman rm -f -t 0 "$probe-target" >/dev/null 2>&1 || true
  podman network rm -f "$probe" >/dev/null 2>&1 || true
}
trap 'cleanup_probe; rm -rf "${work:-}"' EXIT
podman network create "$probe" >/dev/null
podman run -d --name "$probe-target" --network "$probe" --network-alias stoker-dns-alias \
  debian:12-slim sleep 120 >/dev/null
resolved=""
for _ in 1 2 3 4 5; do
  resolved=$(podman run --rm --no-hosts --network "$probe" debian:12-slim \
               getent hosts stoker-dns-alias 2>&1) && break
  resolved=""
  sleep 1
done
cleanup_probe
if [[ -z "$resolved" ]]; then
  {
    echo "podman-setup: FAILED: a container on a fresh $backend network cannot resolve another by"
    echo "its network alias, so a compose worker would not find 'server'."
    if [[ "$backend" == netavark ]]; then
      echo "  netavark resolves names with aardvark-dns: apt-get install --no-install-recommends aardvark-dns"
      echo "  (found: $(ls /usr/lib/podman/aardvark-dns 2>/dev/null || echo none))"
    else
      echo "  CNI resolves names with the dnsname plugin: apt-get install --no-install-recommends" \
           "golang-github-containernetworking-plugin-dnsname (found: $(ls /usr/lib/cni/dnsname 2>/dev/null || echo none))"
      echo "  or move this store to netavark: podman system reset (deletes every container, image," \
           "volume and network), then this script again"
    fi
    echo "  deploy/README.md, 'With podman', says which pieces each stack needs."
  } >&2
  exit 1
fi
echo "podman-setup: service names resolve on a fresh $backend network (alias -> ${resolved%% *})"
echo "podman-setup: ready (base images debian:12, debian:12-slim); next: deploy/podman-build.sh"
