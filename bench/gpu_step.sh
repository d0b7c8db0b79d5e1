#!/usr/bin/env bash
# The GPU step at the device's pace (one GPU): troupe one_device on cuda:0
# (the data set resident on the GPU, steps captured as CUDA graphs: the
# defaults) against PyTorch at its best (bench/pytorch_mlp.py --graph: the
# data set on the GPU, the whole step in one CUDA graph), alternating, for
# the MLP at batch 128 and 1024 and the convnet at 128.
#   bench/gpu_step.sh [ROUNDS] [MLP_EPOCHS] [CNN_EPOCHS]   (defaults: 3, 12, 3)
# Prints one JSON line a run, then a table of medians: steady-state samples/s
# (the epochs after the first), the first step, the job's wall time and the
# test accuracy, with the GPU's name. Needs a build with CUDA
# (scripts/test.sh) and a GPU; TROUPE=path overrides build/release/troupe.
# COMPILE=1 adds PyTorch with torch.compile(mode="max-autotune") (eager
# steps of the compiled model; its autotuning takes minutes a setup).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
mlp_epochs=${2:-12}
cnn_epochs=${3:-3}
troupe=${TROUPE:-build/release/troupe}
data=${TROUPE_DATA:-/usr/share/datasets/fashion-mnist}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
if [ -z "$gpu" ]; then
  echo "bench/gpu_step.sh: no GPU visible (nvidia-smi lists none)" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
raw="$out/runs.jsonl"

run_troupe() {  # model batch epochs round
  local base=examples/fashion_mnist_cuda.json name="troupe_$1_$2_$4"
  [ "$1" = cnn ] && base=examples/fashion_mnist_cnn.json
  python3 - "$base" "$out/$name.json" "$name" "$2" "$3" "$data" <<'PY'
import json, sys
base, cfg, name, batch, epochs, data = sys.argv[1:]
j = json.load(open(base))
j["name"] = name
j["devices"] = ["cuda:0"]
j["strategy"] = {"kind": "one_device"}
j["data"]["batch_size"] = int(batch)
j["data"]["path"] = data
j["training"] = {"epochs": int(epochs), "steps_per_execution": "auto", "eval_every_epochs": 0}
j["checkpoint"] = {"save_at_end": False}
json.dump(j, open(cfg, "w"))
PY
  "$troupe" run "$out/$name.json" --output "$out/$name" --quiet >/dev/null
  python3 - "$out/$name" "$1" "$2" <<'PY'
import json, sys
d, model, batch = sys.argv[1:]
s = json.load(open(d + "/summary.json"))
epochs = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"epoch"' in l]
epochs = [e for e in epochs if e.get("type") == "epoch"]
steady = None
if len(epochs) >= 2:
    per_epoch = s["samples"] / len(epochs)
    span = epochs[-1]["train_seconds"] - epochs[0]["train_seconds"]
    steady = per_epoch * (len(epochs) - 1) / span
print(json.dumps({"system": "troupe", "model": model, "batch": int(batch),
                  "samples_per_second": round(s["samples_per_second"]),
                  "steady_samples_per_second": round(steady) if steady else None,
                  "first_step_ms": round(1e3 * s.get("first_step_seconds", -1), 2),
                  "wall_seconds": round(s["wall_seconds"], 2),
                  "test_accuracy": s.get("test_accuracy")}))
PY
}

run_torch() {  # model batch epochs
  python3 bench/pytorch_mlp.py --data "$data" --model "$1" --batch "$2" --epochs "$3" --graph
  if [ "${COMPILE:-0}" = 1 ]; then
    python3 bench/pytorch_mlp.py --data "$data" --model "$1" --batch "$2" --epochs "$3" --compile --fused
  fi
}

for r in $(seq 1 "$rounds"); do
  for setup in "mlp 128 $mlp_epochs" "mlp 1024 $mlp_epochs" "cnn 128 $cnn_epochs"; do
    set -- $setup
    # Alternate which system goes first from round to round.
    if [ $((r % 2)) -eq 1 ]; then
      run_troupe "$1" "$2" "$3" "$r" | tee -a "$raw"
      run_torch "$1" "$2" "$3" | tee -a "$raw"
    else
      run_torch "$1" "$2" "$3" | tee -a "$raw"
      run_troupe "$1" "$2" "$3" "$r" | tee -a "$raw"
    fi
  done
done

python3 - "$raw" "$gpu" "$rounds" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"\n{sys.argv[2]}, {sys.argv[3]} alternating rounds (medians; min-max)")
print("| model | batch | system | steady samples/s | first step ms | accuracy |")
print("| --- | --- | --- | --- | --- | --- |")
best = {}
for key in sorted({(r["model"], r["batch"], r["system"]) for r in runs}):
    rs = [r for r in runs if (r["model"], r["batch"], r["system"]) == key]
    sps = [r["steady_samples_per_second"] for r in rs if r.get("steady_samples_per_second")]
    first = [r["first_step_ms"] for r in rs]
    acc = [r["test_accuracy"] for r in rs if r.get("test_accuracy") is not None]
    med = statistics.median(sps) if sps else 0
    best.setdefault(key[:2], {})[key[2]] = med
    print(f"| {key[0]} | {key[1]} | {key[2]} | {med/1e3:.0f}k ({min(sps)/1e3:.0f}k-{max(sps)/1e3:.0f}k) "
          f"| {statistics.median(first):.1f} | {statistics.median(acc) if acc else '-'} |")
for (model, batch), systems in sorted(best.items()):
    t = systems.get("troupe", 0)
    p = max((v for k, v in systems.items() if k != "troupe"), default=0)
    if t and p:
        print(f"{model} batch {batch}: troupe / PyTorch CUDA graph = {t / p:.2f}x")
PY
