#!/usr/bin/env bash
# troupe's actor/learner RL against PyTorch peers on the same environments and
# seeds, alternating: in each round, for each seed, troupe's run and then
# PyTorch's (bench/pytorch_impala.py).
#
#   bench/compare_rl.sh [--setup impala|apex (impala)] [--env CartPole-v1|Acrobot-v1]
#                       [--rounds N (1)] [--seeds LIST (1,2,3,4,5)] [--threads T (1)]
#                       [--troupe PATH (build/release/troupe)] [--timeout S (300)]
#                       [--raw FILE]
#   bench/compare_rl.sh --table FILE
#
# --setup impala: examples/cartpole_impala.json (or acrobot_impala.json)
#   against `pytorch_impala.py impala` (the same network, V-trace, costs,
#   Adam and batch; one process, acting and learning in turn).
# --setup apex: examples/cartpole_apex.json (or acrobot_apex.json) against
#   `pytorch_impala.py dqn` (double DQN, n-step, target network, Ape-X's
#   epsilons, uniform replay).
# Both sides run to the example's target_return (the mean of the last 100
# episodes) or its max_env_steps; a run past --timeout seconds counts as not
# solved. troupe's time is the job's (from its start, building the actors
# included); PyTorch's runs from its first env step.
#
# --threads T: PyTorch's intra-op threads (1 by default: for these small
# networks a second thread only adds hand-overs, and on 2 busy cores its
# OpenMP spinning made a run 20x slower).
#
# PyTorch and Gymnasium run in a private venv,
# ${TROUPE_BENCH_VENV:-$HOME/.cache/troupe-bench-venv}, created and filled from
# the package registry (pip install torch numpy gymnasium==1.4.0) on first use.
#
# Prints one JSON line per run (also into --raw FILE), then a markdown table:
# per side the runs solved, the median and worst seconds to solve, the median
# env steps/s, and the ratio of PyTorch's median time to troupe's.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/compare_common.sh

setup=impala env=CartPole-v1 rounds=1 seeds=1,2,3,4,5 threads=1
troupe=build/release/troupe timeout_s=300 raw="" table=""
while [ $# -gt 0 ]; do
  case "$1" in
    --setup) setup=$2; shift 2 ;;
    --env) env=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --troupe) troupe=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --raw) raw=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    *) echo "compare_rl: unknown argument '$1' (see the head of $0)" >&2; exit 2 ;;
  esac
done

print_table() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cpu = next((r["cpu"] for r in runs if "cpu" in r), "?")
print(f"\n{cpu}\n")
print("| side | solved | median s to solve | worst s | median env steps/s |")
print("| --- | --- | --- | --- | --- |")
medians = {}
for side in sorted({r["side"] for r in runs}):
    rs = [r for r in runs if r["side"] == side]
    times = sorted(r["seconds"] if r["solved"] else float("inf") for r in rs)
    med = times[len(times) // 2]
    medians[side] = med
    rate = statistics.median(r["env_steps_per_second"] for r in rs)
    fmt = lambda t: "not solved" if t == float("inf") else f"{t:.2f}"
    print(f"| {side} | {sum(r['solved'] for r in rs)}/{len(rs)} | {fmt(med)} | "
          f"{fmt(times[-1])} | {rate:,.0f} |")
sides = sorted(medians)
if len(sides) == 2 and medians[sides[1]] > 0:
    print(f"\nPyTorch's median time / troupe's: {medians[sides[0]] / medians[sides[1]]:.1f}x")
EOF
}

if [ -n "$table" ]; then print_table "$table"; exit 0; fi

case "$setup" in
  impala) algo=impala ;;
  apex) algo=dqn ;;
  *) echo "compare_rl: --setup: expected impala or apex, got '$setup'" >&2; exit 2 ;;
esac
case "$env" in
  CartPole-v1) config=examples/cartpole_$setup.json ;;
  Acrobot-v1) config=examples/acrobot_$setup.json ;;
  *) echo "compare_rl: --env: expected CartPole-v1 or Acrobot-v1, got '$env'" >&2; exit 2 ;;
esac
[ -f "$config" ] || { echo "compare_rl: no example $config for --setup $setup" >&2; exit 2; }
[ -x "$troupe" ] || { echo "compare_rl: no troupe at $troupe (build it, or --troupe PATH)" >&2; exit 2; }

venv=${TROUPE_BENCH_VENV:-$HOME/.cache/troupe-bench-venv}
if ! "$venv/bin/python" -c 'import torch, gymnasium' 2>/dev/null; then
  echo "compare_rl: filling the venv $venv (torch, numpy, gymnasium 1.4.0)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch numpy gymnasium==1.4.0
fi

work=$(mktemp -d /tmp/troupe-compare-rl.XXXXXX)
raw=${raw:-$work/runs.jsonl}
echo "compare_rl: JSON lines in $raw" >&2
cpu=$(cpu_model)
target=$(json_of_config "$config" training.target_return)
max_steps=$(json_of_config "$config" training.max_env_steps)

run_troupe() { run_troupe_solve "$config" "$1"; }  # seed

run_pytorch() {  # seed
  local line
  if line=$(timeout "$timeout_s" "$venv/bin/python" bench/pytorch_impala.py "$algo" --env "$env" \
      --seed "$1" --threads "$threads" --target "$target" --max-env-steps "$max_steps" 2>"$work/pytorch.log"); then
    echo "$line" | tag_json "side='pytorch'"
  else
    echo "{\"side\": \"pytorch\", \"seed\": $1, \"solved\": false, \"seconds\": $timeout_s, \"env_steps\": 0, \"env_steps_per_second\": 0}"
  fi
}

for r in $(seq 1 "$rounds"); do
  for s in ${seeds//,/ }; do
    for side in troupe pytorch; do
      echo "compare_rl: round $r, seed $s, $side ($setup, $env)" >&2
      line=$("run_$side" "$s" | tag_json "round=$r" "setup='$setup'" "env='$env'" "cpu='''$cpu'''")
      echo "$line" | tee -a "$raw"
    done
  done
done
print_table "$raw"
