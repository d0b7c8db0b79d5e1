#!/usr/bin/env bash
# Installs the dependencies, builds troupe (release) and runs the whole test
# suite. This is the command the README gives and CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build --preset release -j"$jobs"
ctest --preset release -j"$jobs"
