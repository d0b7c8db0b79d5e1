#!/usr/bin/env bash
# Installs the dependencies, builds troupe (release) and runs a bundled example
# job (default: the main one). Extra arguments go to `troupe run`.
#   scripts/run-example.sh [examples/<job>.json] [troupe run options]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build --preset release -j"$jobs" --target troupe
example=examples/fashion_mnist_mirrored.json
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then example=$1; shift; fi
# --overwrite: rerunning the example starts over instead of refusing.
if [ $# -eq 0 ]; then set -- --overwrite; fi
# The venv install-deps.sh made comes first on the PATH, so that a Gymnasium
# example's python3 has Gymnasium.
export PATH="${TROUPE_VENV:-$HOME/.cache/troupe-venv}/bin:$PATH"
exec ./build/release/troupe run "$example" "$@"
