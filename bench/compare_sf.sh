#!/usr/bin/env bash
# troupe against Sample Factory 2.1.1 (APPO) on the same 2 cores, alternating
# side by side: CartPole-v1 time to a mean return of 475 seed by seed, and
# Atari Pong frames/s over a fixed budget with each side's learner running.
#
#   bench/compare_sf.sh [--what cartpole,pong] [--seeds LIST (1,2,3)] [--rounds N (2)]
#                       [--pong-env-steps N (20000)] [--pong-setup appo|atari|appo,atari (appo)]
#                       [--troupe PATH (build/release/troupe)]
#                       [--bench-rl PATH (build/release/bench/bench_rl)]
#                       [--timeout S (300)] [--wait-load L (0)] [--raw FILE]
#   bench/compare_sf.sh --table FILE
#
# CartPole: examples/cartpole_impala.json (troupe run) against
# `sample_factory_run.py cartpole` (SF's own CartPole example, 2 rollout
# workers); --rounds passes over --seeds. Pong: `bench_rl frames
# examples/pong_impala.json N 4` against `sample_factory_run.py pong` (the same
# ALE/Pong-v5 wrappers, SF's Nature CNN, 2 workers x 8 envs), --rounds
# alternated rounds of each --pong-setup. Pong figures are frames/s: env steps
# x 4 (AtariPreprocessing's frame skip) on both sides; bench/sample_factory_run.py
# says what each Sample Factory setup is and how its figures are read.
#
# Sample Factory runs in a private venv, ${TROUPE_SF_VENV:-$HOME/.cache/troupe-sf-venv},
# filled from the package registry on first use (sample-factory 2.1.1,
# gymnasium 0.29.1, numpy<2, torch), with gymnasium 1.4.0 and ale-py 0.12.1
# (Atari ROMs bundled) in its atari/ folder, put first on PYTHONPATH for Pong
# only. troupe's Pong needs Gymnasium and ale-py on PATH:
# ${TROUPE_VENV:-$HOME/.cache/troupe-venv}/bin goes first.
#
# Prints one JSON line per run (also into --raw FILE) with uptime's 1-minute
# load average as the run starts (`load`), then markdown tables. --wait-load L:
# before each run, wait (at most 3 minutes) for that load average to fall to
# L or below, as Sample Factory's processes leave a load of ~3 behind them and
# the 2 cores are shared.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/compare_common.sh

what=cartpole,pong seeds=1,2,3 rounds=2 pong_steps=20000 pong_setups=appo
troupe=build/release/troupe bench_rl=build/release/bench/bench_rl timeout_s=300 raw="" table=""
wait_load=0
while [ $# -gt 0 ]; do
  case "$1" in
    --what) what=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --pong-env-steps) pong_steps=$2; shift 2 ;;
    --pong-setup) pong_setups=$2; shift 2 ;;
    --troupe) troupe=$2; shift 2 ;;
    --bench-rl) bench_rl=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --wait-load) wait_load=$2; shift 2 ;;
    --raw) raw=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    *) echo "compare_sf: unknown argument '$1' (see the head of $0)" >&2; exit 2 ;;
  esac
done

print_table() {
  python3 - "$1" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cpu = next((r["cpu"] for r in runs if "cpu" in r), "?")
print(f"\n{cpu}\n")
loads = lambda rs: f"{min(r['load'] for r in rs):.1f}–{max(r['load'] for r in rs):.1f}"
cart = [r for r in runs if r["env"] == "CartPole-v1"]
if cart:
    print("| CartPole-v1 | solved | median s to 475 | worst s | median env steps/s | load average |")
    print("| --- | --- | --- | --- | --- | --- |")
    med = {}
    for side in sorted({r["side"] for r in cart}, reverse=True):
        rs = [r for r in cart if r["side"] == side]
        times = sorted(r["seconds"] if r["solved"] else float("inf") for r in rs)
        med[side] = times[len(times) // 2]
        fmt = lambda t: "not solved" if t == float("inf") else f"{t:.2f}"
        rate = statistics.median(r["env_steps_per_second"] for r in rs)
        print(f"| {side} | {sum(r['solved'] for r in rs)}/{len(rs)} | {fmt(med[side])} | "
              f"{fmt(times[-1])} | {rate:,.0f} | {loads(rs)} |")
    if len(med) == 2:
        print(f"\nSample Factory's median time / troupe's: {med['sample_factory'] / med['troupe']:.1f}x\n")
pong = [r for r in runs if r["env"] == "ALE/Pong-v5"]
if pong:
    print("| Pong, frames/s (env steps x 4) | runs | median | range | median from the first samples | load average |")
    print("| --- | --- | --- | --- | --- | --- |")
    for side in sorted({(r["side"], r.get("setup", "")) for r in pong}, reverse=True):
        rs = [r for r in pong if (r["side"], r.get("setup", "")) == side]
        f = sorted(r["frames_per_second"] for r in rs)
        name = side[0] + (f" ({side[1]})" if side[0] == "sample_factory" else "")
        steady = [r["steady_frames_per_second"] for r in rs if "steady_frames_per_second" in r]
        steady = f"{statistics.median(steady):,.0f}" if steady else "–"
        print(f"| {name} | {len(rs)} | {statistics.median(f):,.0f} | {f[0]:,.0f}–{f[-1]:,.0f} | "
              f"{steady} | {loads(rs)} |")
PY
}

if [ -n "$table" ]; then print_table "$table"; exit 0; fi
[ -x "$troupe" ] || { echo "compare_sf: no troupe at $troupe (build it, or --troupe PATH)" >&2; exit 2; }

venv=${TROUPE_SF_VENV:-$HOME/.cache/troupe-sf-venv}
if ! "$venv/bin/python" -c 'import sample_factory, torch, gymnasium' 2>/dev/null; then
  echo "compare_sf: filling the venv $venv (sample-factory 2.1.1, torch, gymnasium 0.29.1)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q sample-factory==2.1.1 gymnasium==0.29.1 "numpy<2" torch
fi
if [ ! -d "$venv/atari/ale_py" ]; then
  "$venv/bin/pip" install -q --no-deps --target "$venv/atari" gymnasium==1.4.0 ale-py==0.12.1
fi
gym_bin=${TROUPE_VENV:-$HOME/.cache/troupe-venv}/bin

work=$(mktemp -d /tmp/troupe-compare-sf.XXXXXX)
raw=${raw:-$work/runs.jsonl}
echo "compare_sf: JSON lines in $raw" >&2
cpu=$(cpu_model)
config=examples/cartpole_impala.json
failed() { echo "{\"side\": \"$1\", \"seed\": ${2:-0}, \"solved\": false, \"seconds\": $timeout_s, \"env_steps\": 0, \"env_steps_per_second\": 0, \"frames_per_second\": 0}"; }

run_cartpole_troupe() { run_troupe_solve "$config" "$1"; }  # seed
run_cartpole_sf() {  # seed
  timeout "$timeout_s" "$venv/bin/python" bench/sample_factory_run.py cartpole --seed "$1" \
    --target "$(json_of_config "$config" training.target_return)" --timeout $((timeout_s > 60 ? timeout_s - 30 : timeout_s)) \
    2>"$work/sf_$1.log" || failed sample_factory "$1"
}
run_pong_troupe() {  # setup (one troupe config)
  [ -x "$bench_rl" ] || { echo "compare_sf: no bench_rl at $bench_rl" >&2; exit 2; }
  PATH=$gym_bin:$PATH timeout "$timeout_s" "$bench_rl" frames examples/pong_impala.json \
    "$pong_steps" 4 2>"$work/troupe_pong.log" | grep '^{' | tag_json "side='troupe'" || failed troupe
}
run_pong_sf() {  # setup
  PYTHONPATH=$venv/atari timeout "$timeout_s" "$venv/bin/python" bench/sample_factory_run.py pong \
    --setup "$1" --env-steps "$pong_steps" 2>"$work/sf_pong_$1.log" ||
    failed sample_factory | tag_json "setup='$1'"
}

one() {  # what env round arg side
  local load
  for _ in $(seq 1 36); do
    python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]) > 0)" "$(load_1m)" "$wait_load" && break
    sleep 5
  done
  load=$(load_1m)
  echo "compare_sf: round $3, $1 $4, $5 (load average $load)" >&2
  "run_$1_$5" "$4" | tag_json "round=$3" "env='$2'" "load=$load" "cpu='''$cpu'''" | tee -a "$raw"
}

for r in $(seq 1 "$rounds"); do
  case ",$what," in *,cartpole,*)
    for s in ${seeds//,/ }; do
      for side in troupe sf; do one cartpole CartPole-v1 "$r" "$s" "$side"; done
    done ;;
  esac
  case ",$what," in *,pong,*)
    for setup in ${pong_setups//,/ }; do
      for side in troupe sf; do one pong ALE/Pong-v5 "$r" "$setup" "$side"; done
    done ;;
  esac
done
print_table "$raw"
