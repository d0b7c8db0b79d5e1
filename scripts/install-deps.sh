#!/usr/bin/env bash
# Installs every system dependency troupe needs from Debian packages.
# Idempotent: when everything is present it prints nothing and exits 0.
#   scripts/install-deps.sh               everything: build, tests, CI's tools
#   scripts/install-deps.sh --build-only  what building the troupe binary needs
#                                         (deploy/Dockerfile)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkgconf
  ccache                # CI's four builds reuse each other's unchanged objects
  libcaf-dev            # CAF 0.17.6: actors, middleman (BASP), openssl
  libspdlog-dev libfmt-dev
  nlohmann-json3-dev
  doctest-dev
  zlib1g-dev
  libssl-dev openssl    # TLS 1.3 between tasks; the tests make their certificates with openssl
  libdnnl-dev           # oneDNN: the CPU matrix products, dispatched on CPUID features
  dataset-fashion-mnist # /usr/share/datasets/fashion-mnist
  clang-format
  clang libclang-rt-dev # libFuzzer targets (scripts/fuzz.sh, run by CI)
  openmpi-bin libopenmpi-dev  # MPI_Allreduce comparison in `troupe bench allreduce`
  chromium              # the report test opens `troupe report`'s page headless
)

BUILD_ONLY=(
  build-essential cmake pkgconf libcaf-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  doctest-dev zlib1g-dev libssl-dev libdnnl-dev
)
case "${1:-}" in
  "") ;;
  --build-only) PACKAGES=("${BUILD_ONLY[@]}") ;;
  *) echo "usage: scripts/install-deps.sh [--build-only]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
