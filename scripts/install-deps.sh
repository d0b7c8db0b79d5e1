#!/usr/bin/env bash
# Installs every system dependency troupe needs from Debian packages.
# Idempotent: when everything is present it prints nothing and exits 0.
#   scripts/install-deps.sh               everything: build, tests, CI's tools
#   scripts/install-deps.sh --build-only  what building the troupe binary needs
#                                         (deploy/Dockerfile)
# The full install also makes a Python venv with Gymnasium, ale-py and
# mujoco, for the Gymnasium environments' tests (tests/test_gymnasium.cpp,
# tests/test_atari_mujoco.cpp), and lizard, for
# the function_sizes test (tests/function_sizes.cmake):
# ${TROUPE_VENV:-$HOME/.cache/troupe-venv}, never the system's Python.
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
  python3 python3-venv  # the Gymnasium venv below
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

# Gymnasium (NumPy comes with it), pinned to the version tests/gymnasium/
# recorded with; Atari and MuJoCo for tests/test_atari_mujoco.cpp and the
# Pong and HalfCheetah examples: ale-py (ships its ROMs), OpenCV for
# Gymnasium's AtariPreprocessing (headless: no GUI libraries), mujoco with
# what gymnasium[mujoco] adds (imageio, packaging); lizard, pinned to the
# version whose measures the function size limits were set with
# (docs/development.md).
GYMNASIUM=gymnasium==1.4.0
ATARI_MUJOCO=(ale-py==0.12.1 opencv-python-headless==5.0.0.93 mujoco==3.3.7
  imageio==2.38.1 packaging==26.4)
LIZARD=lizard==1.24.3
VENV=${TROUPE_VENV:-$HOME/.cache/troupe-venv}
python_venv() {
  [ "${1:-}" = --build-only ] && return 0
  if "$VENV/bin/python" -c 'import gymnasium, ale_py, cv2, mujoco' 2>/dev/null &&
    [ "$("$VENV/bin/lizard" --version 2>/dev/null)" = "${LIZARD#lizard==}" ]; then
    return 0
  fi
  echo "install-deps: making $VENV with $GYMNASIUM, ${ATARI_MUJOCO[*]} and $LIZARD"
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$GYMNASIUM" "${ATARI_MUJOCO[@]}" \
    "$LIZARD"
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  python_venv "${1:-}"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
python_venv "${1:-}"
echo "install-deps: done"
