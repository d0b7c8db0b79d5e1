#!/usr/bin/env bash
# Where a GPU training step's time goes: troupe one_device on cuda:0 under
# Nsight Compute (ncu), each kernel of a window of steady-state steps timed
# on its own (gpu__time_duration, clocks left alone), summed by kernel name
# and divided by the steps in the window (counted by the optimizer's launch,
# one a step). Prints a table: kernel, launches a step, us a step.
#   bench/gpu_kernels.sh [MODEL=mlp|cnn] [BATCH=128] [SKIP=600] [COUNT=200]
# SKIP: launches passed over (the warm-up step, the capture, the first
# replays); COUNT: launches timed. Needs ncu on the PATH (a lent GPU
# machine's image has it); the sum is the kernels' own time, without the
# gaps between them, so it is a floor under the step's period.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-mlp}
batch=${2:-128}
skip=${3:-600}
count=${4:-200}
troupe=${TROUPE:-build/release/troupe}
data=${TROUPE_DATA:-/usr/share/datasets/fashion-mnist}
command -v ncu >/dev/null || {
  echo "bench/gpu_kernels.sh: ncu is not on the PATH" >&2
  exit 1
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
base=examples/fashion_mnist_cuda.json
[ "$model" = cnn ] && base=examples/fashion_mnist_cnn.json
python3 - "$base" "$out/job.json" "$batch" "$data" <<'PY'
import json, sys
base, cfg, batch, data = sys.argv[1:]
j = json.load(open(base))
j["devices"] = ["cuda:0"]
j["strategy"] = {"kind": "one_device"}
j["data"]["batch_size"] = int(batch)
j["data"]["path"] = data
j["training"] = {"epochs": 1, "steps_per_execution": "auto", "eval_every_epochs": 0}
j["checkpoint"] = {"save_at_end": False}
json.dump(j, open(cfg, "w"))
PY
ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$skip" \
  --launch-count "$count" --log-file "$out/ncu.csv" \
  "$troupe" run "$out/job.json" --output "$out/run" --quiet >/dev/null
python3 - "$out/ncu.csv" "$model" "$batch" <<'PY'
import csv, collections, re, sys
path, model, batch = sys.argv[1:]
lines = [l for l in open(path) if l.startswith('"')]
rows = list(csv.DictReader(lines))
per_name = collections.defaultdict(list)
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"\(.*", "", r["Kernel Name"])[:70]
    unit = r.get("Metric Unit", "ns")
    v = float(r["Metric Value"].replace(",", ""))
    v *= {"ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
    per_name[name].append(v)
steps = sum(len(v) for k, v in per_name.items() if "adam" in k.lower()) or 1
print(f"{model} batch {batch}: {len(rows)} kernels timed over {steps} steps")
print("| kernel | launches a step | us a step |")
print("| --- | --- | --- |")
total = 0.0
for name, vs in sorted(per_name.items(), key=lambda kv: -sum(kv[1])):
    total += sum(vs) / steps
    print(f"| `{name}` | {len(vs) / steps:.1f} | {sum(vs) / steps:.1f} |")
print(f"| all | {sum(len(v) for v in per_name.values()) / steps:.1f} | {total:.1f} |")
PY
