#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run troupe's GPU checks into .carry/
# (git-ignored): the release binaries named below, the shared libraries they
# load that such a machine lacks (CAF, spdlog, fmt, oneDNN: not the CUDA
# libraries or the C/C++ runtime, which its image has), and the Fashion-MNIST
# files, compressed to fit a transfer. bench/device_run.sh unpacks it there.
#   bench/device_bundle.sh [BINARY...]   (default: troupe and the GPU tests)
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(troupe tests/test_gpu_training tests/test_cuda tests/test_cuda_layers)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .carry
for b in "${bins[@]}"; do
  cp "build/release/$b" "$stage/bin/"
  ldd "build/release/$b" | awk '/=> \//{print $3}' >>"$stage/libs.txt"
done
# The device's image brings the CUDA libraries, the driver and the C/C++ runtime.
sort -u "$stage/libs.txt" | grep -v '^/usr/local/cuda' |
  grep -Ev '/(libcu[a-zA-Z]*|libnccl|libnvrtc|libnvJitLink|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux|libz)[.-]' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
XZ_OPT="-T2 -6" tar -C "$stage" -cJf .carry/troupe-bundle.tar.xz bin lib
cp /usr/share/datasets/fashion-mnist/*.gz .carry/ 2>/dev/null || true
du -sh .carry
