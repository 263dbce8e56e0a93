#!/bin/sh
# Prints the Debian packages that own the shared libraries the given binaries load, one a line,
# so a runtime image installs exactly what the build linked (apt-get install $(cat list)).
# Handles merged /usr: ldd may print /lib/... where dpkg knows /usr/lib/... (or the reverse).
set -eu
for binary in "$@"; do
  ldd "$binary" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
  real=$(readlink -f "$lib")
  for candidate in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    if owner=$(dpkg -S "$candidate" 2>/dev/null); then
      echo "${owner%%:*}"
      break
    fi
  done
done | sort -u
