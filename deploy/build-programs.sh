#!/bin/sh
# Build stage, step 2: builds only the named programs (no tests) of the tree in /src in BUILD_DIR
# (a cache mount, so a rebuild after a source change compiles only what changed), copies them
# to /out/bin and writes the Debian packages they need at run time to /out/runtime-packages.txt.
#
# Usage: build-programs.sh BUILD_DIR TARGET...   (JOBS, default nproc, bounds the compile jobs)
set -eu
build_dir=$1
shift
cd /src
# Only the program parts: tests/, bench/ and tests/observability are not configured.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DSTOKER_PARTS=data;engine;cuda;metrics;server_metrics;worker;server;client" >/dev/null
cmake --build "$build_dir" -j"${JOBS:-$(nproc)}" --target "$@"
rm -rf /out
mkdir -p /out/bin
for target in "$@"; do
  # -L: copy the program, should a build tree hold it as a link.
  path=$(find "$build_dir" -name "$target" \( -type f -o -type l \) -perm -u+x | head -n 1)
  test -n "$path" || { echo "build-programs: $target not found in $build_dir" >&2; exit 1; }
  cp -L "$path" /out/bin/
done
/src/deploy/runtime-packages.sh /out/bin/* > /out/runtime-packages.txt
echo "runtime packages:"
sed 's/^/  /' /out/runtime-packages.txt
