#!/bin/sh
# Build stage, step 1: installs the build packages with scripts/setup.sh -- the host's installer,
# with its OpenCL workaround (docs/toolchain.md) -- before any source is copied, so that the
# packages are one image layer that a source change does not invalidate.
#
# setup.sh installs the missing packages and then configures and builds the tree it sits in. At
# this point of the image build there is no tree yet, only scripts/setup.sh, so a placeholder
# CMake project stands in for it: setup.sh installs, configures that, builds nothing, and the
# placeholder is removed. (Packages-only mode in setup.sh itself would make this unnecessary.)
set -eu
cd /src
test -x scripts/setup.sh
test ! -e CMakeLists.txt || { echo "install-build-packages: /src already has sources" >&2; exit 1; }
printf 'cmake_minimum_required(VERSION 3.25)\nproject(stoker_packages_only NONE)\n' > CMakeLists.txt
scripts/setup.sh
rm -rf CMakeLists.txt build
apt-get clean
rm -rf /var/lib/apt/lists/*
