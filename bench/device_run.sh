#!/usr/bin/env bash
# On a lent GPU machine, in the repository's copy there: unpacks
# .carry/troupe-bundle.tar.xz (bench/device_bundle.sh) into build/release and
# .carry/lib, points the loader at it and at the image's CUDA libraries,
# and runs the command given (default: the GPU tests).
#   bench/device_run.sh [COMMAND...]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build/release/tests .carry/unpacked
tar -C .carry/unpacked -xJf .carry/troupe-bundle.tar.xz
for b in .carry/unpacked/bin/*; do
  case "$(basename "$b")" in
    troupe) cp "$b" build/release/troupe ;;
    *) cp "$b" build/release/tests/ ;;
  esac
done
# Where the tests and examples look for Fashion-MNIST (the Debian package's place).
mkdir -p /usr/share/datasets/fashion-mnist .carry/data
cp .carry/*.gz /usr/share/datasets/fashion-mnist/ 2>/dev/null || true
cp .carry/*.gz .carry/data/ 2>/dev/null || true
cuda_libs=$(find / -xdev \( -name 'libcudnn.so.9' -o -name 'libnccl.so.2' -o -name 'libcublas.so.13' -o -name 'libcudart.so.13' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$PWD/.carry/unpacked/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
export TROUPE_DATA="$PWD/.carry/data"
if [ $# -eq 0 ]; then
  for t in test_cuda test_cuda_layers test_gpu_training; do build/release/tests/$t; done
else
  "$@"
fi
