#!/usr/bin/env bash
# The 2-process mirrored MLP over a real link instead of loopback: two
# network namespaces joined by a veth pair whose both ends a token bucket
# (tc tbf) holds to RATE, each process in its own namespace, as on two hosts.
# Alternates, per round, the setups of bench/cross_process.sh that cross
# processes (1 replica per process):
#   direct, direct_bf16, device_actors, reducer_ring
# and, when SETUPS names it, direct_plain (direct with cluster.insecure).
#
#   sudo bench/netns.sh [RATE=10gbit] [ROUNDS=3] [EPOCHS=1]    (BUILD=build/release)
#
# SETUPS="direct direct_bf16" runs only those.
# RATE: a tc rate (10gbit, 1gbit, ...) or "none" (the veth pair as it is).
# Needs root (ip netns, tc). Latency is not added: that needs tc's netem
# qdisc, which kernels without sch_netem (this VM's) lack; the script says
# so and goes on with the rate alone. Prints one JSON line per run.
set -euo pipefail
RATE=${1:-10gbit}
ROUNDS=${2:-3}
EPOCHS=${3:-1}
BUILD=${BUILD:-build/release}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/netns.sh: needs root (ip netns, tc)" >&2; exit 2; }
work=$(mktemp -d)
ns_a=troupe_bench_a ns_b=troupe_bench_b
cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add tb_a type veth peer name tb_b
ip link set tb_a netns "$ns_a"
ip link set tb_b netns "$ns_b"
ip -n "$ns_a" addr add 10.77.0.1/24 dev tb_a
ip -n "$ns_b" addr add 10.77.0.2/24 dev tb_b
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set tb_a up
ip -n "$ns_b" link set tb_b up
if [ "$RATE" != none ]; then
  tc -n "$ns_a" qdisc add dev tb_a root tbf rate "$RATE" burst 512kb latency 20ms
  tc -n "$ns_b" qdisc add dev tb_b root tbf rate "$RATE" burst 512kb latency 20ms
fi
if ! tc -n "$ns_a" qdisc add dev lo root netem delay 0ms 2>/dev/null; then
  echo "# no netem qdisc in this kernel: rate $RATE only, no added latency" >&2
fi
export TROUPE_SECRET=${TROUPE_SECRET:-$(openssl rand -hex 32)}
python3 - examples/fashion_mnist_mirrored_2proc.json "$work" "$EPOCHS" <<'PY'
import json, sys
src, work, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
for setup in ("direct", "direct_plain", "direct_bf16", "device_actors", "reducer_ring"):
    j = json.load(open(src))
    j["training"]["epochs"] = epochs
    j["checkpoint"] = {"every_steps": 0, "save_at_end": False}
    j["logging"] = {"output_dir": f"{work}/out-{setup}"}
    j["strategy"]["replicas"] = 2
    j["devices"] = ["cpu:0", "cpu:1"]
    j["cluster"]["tasks"] = {"chief": ["10.77.0.1:7470"], "worker": ["10.77.0.2:7471"]}
    j["cluster"]["hosts"] = {"chief:0": {"replicas": [0], "devices": ["cpu:0"]},
                             "worker:0": {"replicas": [1], "devices": ["cpu:1"]}}
    red = j["strategy"]["reducer"]
    if setup == "reducer_ring":
        red["algorithm"] = "ring"
    else:
        red["algorithm"] = "device"
        red["transport"] = "actors" if setup == "device_actors" else "direct"
        if setup == "direct_bf16":
            red["wire"] = "bf16"
    if setup == "direct_plain":
        j["cluster"]["insecure"] = True
    json.dump(j, open(f"{work}/{setup}.json", "w"))
PY
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(date -u +%F), rate $RATE" >&2
for _ in $(seq "$ROUNDS"); do
  for setup in ${SETUPS:-direct direct_bf16 device_actors reducer_ring}; do
    ip netns exec "$ns_b" "$BUILD/troupe" node --config "$work/$setup.json" --task worker:0 \
      --overwrite >"$work/worker-$setup.log" 2>&1 &
    worker=$!
    if ! ip netns exec "$ns_a" "$BUILD/troupe" node --config "$work/$setup.json" --task chief:0 \
      --overwrite >"$work/chief-$setup.log" 2>&1; then
      tail -n 5 "$work/chief-$setup.log" "$work/worker-$setup.log" >&2
      kill "$worker" 2>/dev/null || true
      exit 1
    fi
    wait "$worker" || true
    python3 - "$work/out-$setup/summary.json" "$setup" "$RATE" <<'PY'
import json, os, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"bench": "netns", "rate": sys.argv[3], "setup": sys.argv[2],
                  "samples_per_second": round(s["samples_per_second"]),
                  "test_accuracy": s.get("test_accuracy"),
                  "load": os.getloadavg()[0]}), flush=True)
PY
  done
done
