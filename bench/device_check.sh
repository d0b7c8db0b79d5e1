#!/usr/bin/env bash
# A lent GPU machine's whole check, in one call (inside bench/device_run.sh):
# the GPU tests, compute-sanitizer's memcheck and racecheck on a short job
# whose steps replay as CUDA graphs (where the machine's runtime lets the
# sanitizer run), CartPole with the learner and the inference server on
# cuda:0, then bench/gpu_step.sh with ROUNDS rounds.
#   bench/device_run.sh bench/device_check.sh [ROUNDS=3]
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep "Model name"
missing=$(ldd build/release/troupe | grep "not found")
[ -z "$missing" ] || echo "missing libraries: $missing"
for t in test_cuda test_cuda_layers test_gpu_training; do
  echo "== $t"
  timeout 300 "build/release/tests/$t" 2>&1 | tail -4
done
tmp=$(mktemp -d)
python3 - "$tmp/small.json" <<'PY'
import json, sys
j = json.load(open("examples/fashion_mnist_cuda.json"))
j["data"]["train_limit"] = 4096
j["training"] = {"epochs": 2, "steps_per_execution": 8}
j["checkpoint"] = {"save_at_end": False}
json.dump(j, open(sys.argv[1], "w"))
PY
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool (a job whose steps replay as CUDA graphs)"
  timeout 240 compute-sanitizer --tool "$tool" --print-limit 5 \
    build/release/troupe run "$tmp/small.json" --output "$tmp/$tool" --quiet 2>&1 | tail -4
done
echo "== actor_learner on cuda:0: the learner and the central inference server (SEED)"
timeout 120 build/release/bench/bench_rl solve examples/cartpole_seed_gpu.json 3 2>&1 | grep '^{'
echo "== bench/gpu_step.sh $rounds"
timeout 420 bench/gpu_step.sh "$rounds" 12 3
