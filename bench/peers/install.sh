#!/usr/bin/env bash
# Installs the pinned benchmark peers (requirements.txt: torch 2.15, torchvision 0.29, DALI 2.4,
# SPDL 0.8; FFCV 1.0.2 when it builds) from PyPI into a virtual environment of their own,
# $STOKER_PEERS_VENV or bench/peers/venv, made with Debian's python3 (needs python3-venv).
# Never run by the build, the README's commands, the tests or CI: only the bench/run_*.sh scripts
# use what it installs, and they say how to get it when it is missing.
#   bench/peers/install.sh            install or update to the pins
#   bench/peers/install.sh --no-ffcv  skip FFCV (it builds from source with OpenCV and numba)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${STOKER_PEERS_VENV:-$here/venv}"
with_ffcv=1
for arg in "$@"; do
  case "$arg" in
    --no-ffcv) with_ffcv=0 ;;
    *) echo "usage: $0 [--no-ffcv]" >&2; exit 2 ;;
  esac
done
# Debian packages the peers need besides python3-venv: SPDL 0.8's wheel loads the system's FFmpeg
# libraries at run time (Debian 12: FFmpeg 5.1, which it finds only with libavdevice59 and
# libavfilter8 installed; without them every spdl.io call fails); FFCV's build finds OpenCV and
# libjpeg-turbo with pkg-config (without libopencv-dev: "Could not find required package: opencv4").
packages=(python3-venv libavdevice59 libavfilter8)
[[ "$with_ffcv" == 1 ]] && packages+=(pkg-config libopencv-dev libturbojpeg0-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating $venv with $(/usr/bin/python3 --version)"
  /usr/bin/python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
echo "installing the pinned peers into $venv (torch's wheel brings its CUDA libraries: several GiB)"
"$venv/bin/python" -m pip install --disable-pip-version-check -r "$here/requirements.txt"
if [[ "$with_ffcv" == 1 ]]; then
  # FFCV 1.0.2 ships only a source archive: it compiles against libjpeg-turbo and OpenCV (the
  # Debian packages above), and brings numba and opencv-python.
  if "$venv/bin/python" -m pip install --disable-pip-version-check -r "$here/requirements-ffcv.txt"; then
    echo "ffcv installed"
  else
    echo "ffcv 1.0.2 did not install: its rows will say so (see the log above)" >&2
  fi
fi
"$venv/bin/python" "$here/versions.py"
