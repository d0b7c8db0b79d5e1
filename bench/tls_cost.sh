#!/usr/bin/env bash
# What TLS 1.3 between tasks costs, alternating TLS (the default: a PSK
# derived from the cluster secret) with plaintext (cluster.insecure) on the
# same machine: the 2-process ring all-reduce's busbw (bench_remote_allreduce
# through the gate, 16 and 64 MB) and the 2-process example's samples/s
# (examples/fashion_mnist_mirrored_2proc.json, EPOCHS epochs).
#
#   bench/tls_cost.sh [ROUNDS=3] [EPOCHS=2]      (BUILD=build/release)
#
# Prints JSON lines: {"bench":"remote_allreduce",...,"transport":...} and
# {"bench":"tls_cost_example","transport":...,"samples_per_second":...}.
set -euo pipefail
ROUNDS=${1:-3}
EPOCHS=${2:-2}
BUILD=${BUILD:-build/release}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TROUPE_SECRET=${TROUPE_SECRET:-$(openssl rand -hex 16)}
python3 - examples/fashion_mnist_mirrored_2proc.json "$work" "$EPOCHS" <<'PY'
import json, sys
src, work, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
for mode in ("tls13", "plaintext"):
    j = json.load(open(src))
    j["training"]["epochs"] = epochs
    j["logging"] = {"output_dir": f"{work}/out-{mode}"}
    if mode == "plaintext":
        j["cluster"]["insecure"] = True
    json.dump(j, open(f"{work}/{mode}.json", "w"))
PY
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(date -u +%F)" >&2
for _ in $(seq "$ROUNDS"); do
  for mode in plaintext tls13; do
    tls=psk
    [ "$mode" = plaintext ] && tls=insecure
    "$BUILD/bench/bench_remote_allreduce" --sizes-mb=16,64 --iters=10 --gate=1 --tls=$tls 2>/dev/null
    "$BUILD/troupe" launch "$work/$mode.json" --overwrite >"$work/log-$mode" 2>&1 ||
      { cat "$work/log-$mode" >&2; exit 1; }
    python3 - "$work/out-$mode/summary.json" "$mode" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"bench": "tls_cost_example", "transport": sys.argv[2],
                  "samples_per_second": round(s["samples_per_second"]),
                  "test_accuracy": s.get("test_accuracy")}))
PY
  done
done
