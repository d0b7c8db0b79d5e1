#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: config, cluster, manifest, idx,
# npy, npz, csv, gate, gatecert, enrol, message, basp, tls)
# with clang in build/fuzz and runs each for SECONDS (default 20) from the
# seed corpus in tests/fuzz/corpus/<target>. New inputs go to
# build/fuzz/corpus/<target>, findings (crash-*, leak-*, timeout-*) to
# build/fuzz/findings/<target>; exits non-zero on the first finding.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }
cxx=${CXX_FUZZ:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (libFuzzer needs clang)" >&2; exit 2; }
jobs=$(nproc 2>/dev/null || echo 2)
targets=(config cluster manifest idx npy npz csv gate gatecert enrol message basp tls)
cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DTROUPE_FUZZ=ON -DTROUPE_TESTS=OFF -DTROUPE_BENCH=OFF -DTROUPE_CUDA=OFF \
  -DTROUPE_WERROR=OFF >/dev/null  # the gcc build is the warnings gate; clang knows other flags
cmake --build build/fuzz -j"$jobs" --target "${targets[@]/#/fuzz_}"
for t in "${targets[@]}"; do
  mkdir -p "build/fuzz/corpus/$t" "build/fuzz/findings/$t"
  echo "fuzz_$t: ${seconds}s"
  set +e
  ASAN_OPTIONS=detect_leaks=1 "build/fuzz/tests/fuzz/fuzz_$t" -max_total_time="$seconds" \
    -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build/fuzz/findings/$t/" \
    "build/fuzz/corpus/$t" "tests/fuzz/corpus/$t" 2>&1 | tail -n 12
  rc=${PIPESTATUS[0]}
  set -e
  [[ $rc -eq 0 ]] || { echo "fuzz_$t: finding in build/fuzz/findings/$t" >&2; exit 1; }
done
