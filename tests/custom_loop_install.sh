#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds examples/custom_loop against
# that prefix alone, and runs it (it exits 1 below its accuracy target).
#   custom_loop_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/troupe-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
if grep -rqs -- "$src" "$tmp/prefix/lib/cmake/troupe"; then
  echo "FAIL: the installed package names the source tree ($src)"; exit 1
fi
# Only the public API is installed: no header of the runtime's (whose
# strategy interface is troupe::strategy) comes with it.
if grep -rqsE '\bclass strategy\b' "$tmp/prefix/include"; then
  echo "FAIL: the installed headers declare the runtime's troupe::strategy"; exit 1
fi
cmake -S "$src/examples/custom_loop" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" -j2 >/dev/null
# Both must hold: the program's exit code (0: it reached its target) and the
# accuracy it reports.
rc=0
out=$("$tmp/build/custom_loop" --replicas 2 --epochs 3 --min-accuracy 0.85 2>&1) || rc=$?
echo "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: custom_loop exited $rc"; exit 1
fi
if ! grep -Eq 'final test accuracy 0\.(8[5-9]|9)' <<<"$out"; then
  echo "FAIL: no 'final test accuracy' of 0.85 or more in custom_loop's output"; exit 1
fi
