#!/usr/bin/env bash
# GPU training throughput: troupe's one_device on cuda:0 and mirrored (nccl)
# on every visible GPU, against PyTorch (its default foreach Adam, then fused
# Adam) on the same GPU, model (MODEL mlp: 784-256-256-10; cnn: the convnet of
# examples/fashion_mnist_cnn.json), optimizer (Adam, cosine schedule) and
# batch size.
#   bench/gpu_training.sh [EPOCHS] [BATCH] [MODEL]   (defaults: 3, 128, mlp)
# Prints one JSON line per run: {"system", "model", "strategy", "gpus",
# "batch", "samples_per_second", "test_accuracy"}. Needs a build (scripts/test.sh) and
# a GPU; PyTorch is optional (its lines are skipped when torch is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3}
batch=${2:-128}
model=${3:-mlp}
case "$model" in
  mlp) base=examples/fashion_mnist_cuda.json ;;
  cnn) base=examples/fashion_mnist_cnn.json ;;
  *) echo "bench/gpu_training.sh: MODEL must be mlp or cnn, got '$model'" >&2; exit 2 ;;
esac
troupe=build/release/troupe
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
if [ "${gpus:-0}" -lt 1 ]; then
  echo "bench/gpu_training.sh: no GPU visible (nvidia-smi -L lists none)" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run_troupe() {  # name strategy devices-json replicas algorithm
  local cfg="$out/$1.json"
  python3 - "$cfg" "$1" "$2" "$3" "$4" "$5" "$epochs" "$batch" "$base" <<'PY'
import json, sys
cfg, name, kind, devices, replicas, algo, epochs, batch, base = sys.argv[1:]
j = json.load(open(base))
j["name"] = name
j["strategy"] = {"kind": kind, "replicas": int(replicas)}
if algo:
    j["strategy"]["reducer"] = {"algorithm": algo}
j["devices"] = json.loads(devices)
j["training"] = {"epochs": int(epochs)}
j["data"]["batch_size"] = int(batch)
j["checkpoint"] = {"save_at_end": False}
json.dump(j, open(cfg, "w"))
PY
  "$troupe" run "$cfg" --output "$out/$1" --quiet >/dev/null
  python3 - "$out/$1/summary.json" "$2" "$4" "$batch" "$model" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"system": "troupe", "model": sys.argv[5], "strategy": sys.argv[2],
                  "gpus": int(sys.argv[3]),
                  "batch": int(sys.argv[4]), "samples_per_second": round(s["samples_per_second"]),
                  "test_accuracy": s["test_accuracy"]}))
PY
}

run_troupe one_device one_device '["cuda:0"]' 1 ""
if [ "$gpus" -ge 2 ]; then
  devs=$(python3 -c "import json; print(json.dumps(['cuda:%d' % i for i in range($gpus)]))")
  run_troupe mirrored_nccl mirrored "$devs" "$gpus" nccl
fi
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/pytorch_mlp.py --epochs "$epochs" --batch "$batch" --model "$model" --device cuda:0
  python3 bench/pytorch_mlp.py --epochs "$epochs" --batch "$batch" --model "$model" --device cuda:0 --fused
else
  echo '{"system": "pytorch", "skipped": "python3 cannot import torch"}'
fi
