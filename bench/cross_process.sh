#!/usr/bin/env bash
# The mirrored MLP across two processes against the same job in one process,
# alternating in one session: examples/fashion_mnist_mirrored_2proc.json with
# R replicas in each process (2R in all), and per round
#   inprocess       the same 2R replicas in one process (device collectives)
#   direct          2 processes, device collectives, the processes' sum over
#                   direct links (strategy.reducer.transport "direct") as the
#                   defaults have them: shared rings between processes of one
#                   host (strategy.reducer.same_host "shm")
#   direct_shm      the same with same_host "shm" written out
#   direct_unix     the same over Unix sockets (same_host "unix")
#   direct_tcp      the same over TCP with TLS 1.3, as between hosts
#                   (strategy.reducer.same_host "tcp")
#   direct_tcp_plain  the same with cluster.insecure (plain bytes)
#   device_actors   2 processes, device collectives, the sum through the CAF
#                   ring nodes (transport "actors")
#   reducer_ring    2 processes, the reducer actors' ring (algorithm "ring",
#                   the example as it was shipped before direct links)
#   ddp             PyTorch DDP, 2 processes x 1 thread, gloo, fused Adam
#                   (bench/pytorch_cpu_mlp.py --ddp 2 --fused, R=1 only, with
#                   $PYTHON, default ~/.cache/troupe-bench-venv/bin/python);
#                   not in the default list
#
#   bench/cross_process.sh [ROUNDS=3] [EPOCHS=2] [R=1] [SPE=1]   (BUILD=build/release)
#
# SPE: training.steps_per_execution for every setup (a number or "auto");
# SETUPS="inprocess direct" runs only those.
#
# Prints one JSON line per run: {"bench":"cross_process","setup":...,
# "samples_per_second":...,"test_accuracy":...,"load":...} (load: the 1-minute
# load average after the run; other sessions may share the machine).
set -euo pipefail
ROUNDS=${1:-3}
EPOCHS=${2:-2}
R=${3:-1}
SPE=${4:-1}
BUILD=${BUILD:-build/release}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TROUPE_SECRET=${TROUPE_SECRET:-$(openssl rand -hex 32)}
python3 - examples/fashion_mnist_mirrored_2proc.json "$work" "$EPOCHS" "$R" "$SPE" <<'PY'
import json, sys
src, work, epochs, r = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spe = sys.argv[5] if sys.argv[5] == "auto" else int(sys.argv[5])
devices = [f"cpu:{i}" for i in range(2 * r)]
def base(setup):
    j = json.load(open(src))
    j["training"]["epochs"] = epochs
    j["training"]["steps_per_execution"] = spe
    j["checkpoint"] = {"every_steps": 0, "save_at_end": False}
    j["logging"] = {"output_dir": f"{work}/out-{setup}"}
    j["strategy"]["replicas"] = 2 * r
    j["devices"] = devices
    j["cluster"]["hosts"] = {
        "chief:0": {"replicas": list(range(r)), "devices": devices[:r]},
        "worker:0": {"replicas": list(range(r, 2 * r)), "devices": devices[r:]}}
    return j
for setup in ("direct", "direct_shm", "direct_unix", "direct_tcp", "direct_tcp_plain", "device_actors",
              "reducer_ring", "inprocess"):
    j = base(setup)
    red = j["strategy"]["reducer"]
    if setup == "reducer_ring":
        red["algorithm"] = "ring"
    else:
        red["algorithm"] = "device"
        red["transport"] = "actors" if setup == "device_actors" else "direct"
    if setup.startswith("direct_tcp"):
        red["same_host"] = "tcp"
    if setup == "direct_shm":
        red["same_host"] = "shm"
    if setup == "direct_unix":
        red["same_host"] = "unix"
    if setup == "direct_tcp_plain":
        j["cluster"]["insecure"] = True
    if setup == "inprocess":
        del j["cluster"]
    json.dump(j, open(f"{work}/{setup}.json", "w"))
PY
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(date -u +%F), R=$R, SPE=$SPE" >&2
for _ in $(seq "$ROUNDS"); do
  for setup in ${SETUPS:-inprocess direct direct_unix direct_tcp direct_tcp_plain device_actors reducer_ring}; do
    if [ "$setup" = ddp ]; then
      # the same global batch of 128, epochs and seed; one JSON line of its own
      "${PYTHON:-$HOME/.cache/troupe-bench-venv/bin/python}" bench/pytorch_cpu_mlp.py \
        --ddp 2 --fused --epochs "$EPOCHS" >"$work/log-ddp" 2>&1 ||
        { cat "$work/log-ddp" >&2; exit 1; }
      python3 - "$work/log-ddp" <<'PY'
import json, os, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
print(json.dumps({"bench": "cross_process", "setup": "ddp", "replicas_per_process": 1,
                  "samples_per_second": round(s["samples_per_second"]),
                  "test_accuracy": s.get("final_test_accuracy"),
                  "load": os.getloadavg()[0]}), flush=True)
PY
      continue
    fi
    if [ "$setup" = inprocess ]; then
      cmd=("$BUILD/troupe" run "$work/$setup.json" --overwrite --quiet)
    else
      cmd=("$BUILD/troupe" launch "$work/$setup.json" --overwrite)
    fi
    "${cmd[@]}" >"$work/log-$setup" 2>&1 || { cat "$work/log-$setup" >&2; exit 1; }
    python3 - "$work/out-$setup/summary.json" "$setup" "$R" <<'PY'
import json, os, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"bench": "cross_process", "setup": sys.argv[2],
                  "replicas_per_process": int(sys.argv[3]),
                  "samples_per_second": round(s["samples_per_second"]),
                  "test_accuracy": s.get("test_accuracy"),
                  "load": os.getloadavg()[0]}), flush=True)
PY
  done
done
