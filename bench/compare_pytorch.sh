#!/usr/bin/env bash
# troupe against PyTorch on the CPU: the same network (--model mlp: the MLP
# 784-256-256-10, He init; --model cnn: the convnet of
# examples/fashion_mnist_cnn.json), Adam 1e-3 with the cosine schedule to
# 5e-5, Fashion-MNIST normalised the same way, the same global batch and
# epochs, every setup once per round, rounds alternating (round 1: every
# setup, round 2: every setup, ...).
#
#   bench/compare_pytorch.sh [--model mlp|cnn (mlp)] [--rounds N (3)] [--batch B (128)]
#                            [--epochs E (mlp 12, cnn 8)] [--target (mlp 0.89, cnn 0.91)]
#                            [--troupe PATH (build/release/troupe)] [--raw FILE]
#                            [--cpus LIST] [--skip SETUP]... [--seed S (42)] [--same-seed]
#   bench/compare_pytorch.sh --table FILE
#
# Round r trains every setup, troupe's and PyTorch's, from seed S + r - 1
# (initialisation and shuffling), so that the median over rounds samples the
# training's own spread as well as the machine's: with one seed every round
# of a setup crosses the target in the same epoch, and a setup whose one
# trajectory falls just short pays an epoch more in every round.
# --same-seed: seed S in every round (the script's behaviour before).
#
# --cpus LIST (taskset's form, e.g. 0,1): every run on those CPUs only, so
# that "2 cores" means two on a machine with more (troupe sizes its devices'
# pipelines from the CPUs it may use; pick CPUs of different physical cores,
# lscpu -e's CORE column). --skip SETUP (repeatable): leave that setup out,
# by the label the progress lines print ("troupe mirrored 2", "pytorch 1",
# ...), where a round's time matters more than that row.
#
# --model mlp (the default):
# troupe setups: one_device (examples/fashion_mnist_one_device.json);
# mirrored 2 (examples/fashion_mnist_mirrored.json, strategy.replicas = 2 on
# cpu:0 and cpu:1, with strategy.reducer.algorithm "ring": the reducer
# actors' ring); mirrored 2 device collectives (the example as it is: "device",
# which on cpu devices is the in-process shared-memory group inside each
# replica's step, and whose data.gather auto copies each replica's rows
# inside its step); the same with training.steps_per_execution = 8
# (8 steps per device task); each with data.batch_size = B and
# training.epochs = E.
# PyTorch setups (bench/pytorch_cpu_mlp.py): 1 thread; 2 threads; 2 threads +
# fused Adam; DDP 2 processes (gloo, 1 thread each). PyTorch runs in a private
# venv, ${TROUPE_BENCH_VENV:-$HOME/.cache/troupe-bench-venv}, created and
# filled (pip install torch numpy) on first use; if that fails the PyTorch
# rows are skipped ("compare_pytorch: skipped: <reason>").
#
# --model cnn: troupe one_device (examples/fashion_mnist_cnn.json) and
# mirrored 2 (examples/fashion_mnist_cnn_mirrored.json, strategy.replicas = 2
# on cpu:0 and cpu:1), each with data.batch_size = B and training.epochs =
# E; PyTorch (bench/pytorch_cpu_cnn.py, the same venv) on 2 threads; 2
# threads + fused Adam; 2 threads + channels_last + fused Adam (left out,
# with a note, where this torch cannot train a convolution in channels_last).
# Each run's peak RSS (of its largest process: /usr/bin/time -v's "Maximum
# resident set size", else getrusage(RUSAGE_CHILDREN) from a python wrapper)
# goes into its JSON line ("peak_rss_mib") and a column of the table.
#
# --table FILE: no runs; the table (and ratios) of the runs whose JSON lines
# FILE holds: a run cut short (its rounds so far; the path is printed at
# the start), or one from another machine (the lines name its CPU).
#
# Prints a markdown table (samples/s of the training steps; training seconds,
# evaluation excluded, to the end of the first epoch whose test accuracy
# >= target; final test accuracy; cnn: peak RSS) and the ratios (troupe's
# best time to target over PyTorch's best 2-thread one; cnn: also the two
# setups' peak RSS); the raw per-run JSON lines go to a file whose path is
# printed.
set -euo pipefail
cd "$(dirname "$0")/.."

model=mlp rounds=3 batch=128 epochs="" target="" troupe=build/release/troupe raw="" cpus="" table_from=""
seed=42 same_seed=0
skips=()
usage() {
  echo "usage: bench/compare_pytorch.sh [--model mlp|cnn (mlp)] [--rounds N (3)] [--batch B (128)]" >&2
  echo "         [--epochs E (mlp 12, cnn 8)] [--target (mlp 0.89, cnn 0.91)]" >&2
  echo "         [--troupe PATH (build/release/troupe)] [--raw FILE (runs/compare_pytorch-DATE.jsonl)]" >&2
  echo "         [--cpus LIST (taskset -c LIST)] [--skip SETUP (repeatable)] [--seed S (42)] [--same-seed]" >&2
  echo "       bench/compare_pytorch.sh --table FILE (the table of FILE's runs, no new ones)" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --epochs) epochs=${2:?}; shift 2 ;;
    --target) target=${2:?}; shift 2 ;;
    --troupe) troupe=${2:?}; shift 2 ;;
    --raw) raw=${2:?}; shift 2 ;;
    --cpus) cpus=${2:?}; shift 2 ;;
    --skip) skips+=("${2:?}"); shift 2 ;;
    --seed) seed=${2:?}; shift 2 ;;
    --same-seed) same_seed=1; shift ;;
    --table) table_from=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "compare_pytorch: unknown argument: $1" >&2; usage ;;
  esac
done
case "$model" in
  mlp) epochs=${epochs:-12} target=${target:-0.89}
       examples=(examples/fashion_mnist_one_device.json examples/fashion_mnist_mirrored.json)
       pyscript=bench/pytorch_cpu_mlp.py ;;
  cnn) epochs=${epochs:-8} target=${target:-0.91}
       examples=(examples/fashion_mnist_cnn.json examples/fashion_mnist_cnn_mirrored.json)
       pyscript=bench/pytorch_cpu_cnn.py ;;
  *) echo "compare_pytorch: --model takes mlp or cnn (got '$model')" >&2; exit 2 ;;
esac
# --- the table -----------------------------------------------------------------
# print_table RAW DATE ROUNDS BATCH EPOCHS TARGET SKIPPED MODEL RSS_TOOL SEED1 SEEDN:
# the markdown table and ratios of RAW's runs (the CPU and core count as the
# lines record them; lines from before they did: this machine's).
this_cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
this_cpu=${this_cpu:-unknown CPU}
print_table() {
python3 - "$1" "$this_cpu" "$(nproc)" "${@:2}" <<'PY'
import json, statistics, sys
raw, cpu, cores, date, rounds, batch, epochs, target, skipped, model, rss_tool, seed1, seedn = sys.argv[1:]
cnn = model == "cnn"
runs = [json.loads(l) for l in open(raw) if l.strip()]
if seed1 == "?":
    seeds = "seeds not recorded"
else:
    seeds = f"seed {seed1}" if seed1 == seedn else f"seeds {seed1}–{seedn}, one a round"
if runs and runs[0].get("cpu"):  # the machine that ran them
    cpu, cores = runs[0]["cpu"], str(runs[0].get("cores", cores))
    machine_note = ""
else:
    machine_note = " (the CPU is this machine's: these runs do not record theirs)"
order = []
for r in runs:
    key = (r["system"], r["setup"])
    if key not in order:
        order.append(key)

def rng(xs, fmt):
    if not xs:
        return "–"
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}–{fmt(max(xs))})"

k = lambda v: f"{v / 1000:.1f}k"
s2 = lambda v: f"{v:.2f}"
print(f"### {cpu}, {cores} cores, {date}{machine_note}")
print()
print(f"`bench/compare_pytorch.sh{' --model cnn' if cnn else ''} --rounds {rounds} --batch {batch} --epochs {epochs} --target {target}`"
      f" (batch {batch}, {epochs} epochs, {rounds} round{'s' if rounds != '1' else ''}, setups alternated, {seeds})")
print()
if cnn:
    print(f"| setup | samples/s (median, min–max) | time to {target} s (median, min–max) | epochs to {target}, by round"
          " | final test accuracy (median) | peak RSS MiB (median, min–max) |")
    print("| --- | --- | --- | --- | --- | --- |")
else:
    print(f"| setup | samples/s (median, min–max) | time to {target} s (median, min–max) | epochs to {target}, by round"
          " | final test accuracy (median) |")
    print("| --- | --- | --- | --- | --- |")
mib = lambda v: f"{v:.0f}"
rss = {}
stats = {}
for system, setup in order:
    rs = [r for r in runs if (r["system"], r["setup"]) == (system, setup)]
    sps = [r["samples_per_second"] for r in rs]
    tt = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
    acc = [r["final_test_accuracy"] for r in rs]
    t_cell = rng(tt, s2) if tt else "not reached"
    if tt and len(tt) < len(rs):
        t_cell += f"; not reached in {len(rs) - len(tt)} of {len(rs)}"
    # The epoch each round crossed the target ("–": not reached): with a seed
    # a round, what moves the time to target besides the throughput.
    ep = " ".join(str(r["epoch_at_target"]) if r.get("epoch_at_target") else "–" for r in rs)
    stats[(system, setup)] = (statistics.median(sps), statistics.median(tt) if tt else None)
    if cnn:
        rss[(system, setup)] = [r.get("peak_rss_mib") for r in rs]
        mm = [v for v in rss[(system, setup)] if v is not None]
        print(f"| {system} {setup} | {rng(sps, k)} | {t_cell} | {ep} | {statistics.median(acc):.4f} | {rng(mm, mib)} |")
    else:
        print(f"| {system} {setup} | {rng(sps, k)} | {t_cell} | {ep} | {statistics.median(acc):.4f} |")
print()
if skipped:
    print(f"PyTorch skipped: {skipped}")

def best(system, pred):
    c = [(t, setup) for (sy, setup), (_, t) in stats.items() if sy == system and pred(setup) and t is not None]
    return min(c) if c else None

# Every troupe setup runs on the machine's cores; PyTorch's 1-thread setup is left out.
tb = best("troupe", lambda s: True)
pb = best("pytorch", lambda s: not s.startswith("1 thread"))
if cnn:
    # Every PyTorch convnet setup runs on 2 threads.
    line = "troupe best time to target / PyTorch best 2-thread time to target = "
    if tb and pb:
        r = tb[0] / pb[0]
        print(f"{line}{r:.2f} (troupe {tb[1]} {tb[0]:.2f} s / PyTorch {pb[1]} {pb[0]:.2f} s;"
              f" the issue's target: <= 0.7, {'met' if r <= 0.7 else 'not met'})")
    else:
        print(f"{line}n/a ({'no troupe setup' if not tb else 'no PyTorch 2-thread setup'} reached {target})")
    med = lambda key: statistics.median([v for v in rss.get(key, []) if v is not None] or [float("nan")])
    if tb and pb:
        a, b = med(("troupe", tb[1])), med(("pytorch", pb[1]))
        print(f"peak RSS, troupe {tb[1]} / PyTorch {pb[1]} (the two setups above, medians) = "
              + (f"{a / b:.2f} ({a:.0f} MiB / {b:.0f} MiB)" if a == a and b == b else "n/a (not measured)"))
    print(f"peak RSS of each run, MiB, round 1 to {rounds} ({rss_tool}; the largest process of the run):")
    for (system, setup), vs in rss.items():
        print(f"- {system} {setup}: " + ", ".join("–" if v is None else f"{v:.0f}" for v in vs))
elif tb and pb:
    print(f"troupe best 2-core time to target / PyTorch best 2-core time to target = {tb[0] / pb[0]:.2f}"
          f" (troupe {tb[1]} {tb[0]:.2f} s / PyTorch {pb[1]} {pb[0]:.2f} s)")
    # The same two setups' throughputs: the time ratio's value when both
    # need as many epochs, which a few seeds need not show.
    print(f"PyTorch {pb[1]} samples/s / troupe {tb[1]} samples/s = "
          f"{stats[('pytorch', pb[1])][0] / stats[('troupe', tb[1])][0]:.2f}")
else:
    print("troupe best 2-core time to target / PyTorch best 2-core time to target = n/a"
          f" ({'no troupe setup' if not tb else 'no PyTorch 2-core setup'} reached {target})")
od = stats.get(("troupe", "one_device"))
for name in ("mirrored 2", "mirrored 2 device collectives",
             "mirrored 2 device collectives, 8 steps per execution"):
    m = stats.get(("troupe", name))
    if od and m:
        print(f"{name} / one_device samples/s = {m[0] / od[0]:.2f}")
PY
}

if [ -n "$table_from" ]; then
  [ -f "$table_from" ] || { echo "compare_pytorch: --table: no file $table_from" >&2; exit 2; }
  # Rounds, batch, epochs, target, seeds and model as the lines record them.
  if ! params=$(python3 - "$table_from" "$model" <<'PY'
import json, sys
path, model = sys.argv[1], sys.argv[2]
runs = []
for n, line in enumerate(open(path), 1):
    if not line.strip():
        continue
    try:
        r = json.loads(line)
        # Every field the table reads.
        for key in ("round", "batch", "epochs", "target", "samples_per_second", "system", "setup",
                    "seconds_to_target", "final_test_accuracy"):
            r[key]
    except (ValueError, KeyError, TypeError) as e:
        sys.exit(f"compare_pytorch: --table: {path}:{n}: not a run of this script ({type(e).__name__}: {e})")
    runs.append(r)
if not runs:
    sys.exit(f"compare_pytorch: --table: {path}: no runs")
seeds = sorted({r["seed"] for r in runs if "seed" in r})
cnn = runs[0].get("model", model) == "cnn"
rss = "as recorded" if any("peak_rss_mib" in r for r in runs) else ""
print(len({r["round"] for r in runs}), runs[0]["batch"], runs[0]["epochs"], runs[0]["target"],
      "cnn" if cnn else "mlp", seeds[0] if seeds else "?", seeds[-1] if seeds else "?", rss or "-")
PY
  ); then
    exit 2  # the reason is printed above
  fi
  read -r t_rounds t_batch t_epochs t_target t_model t_seed1 t_seedn t_rss <<< "$params"
  [ "$t_rss" != "-" ] || t_rss=""
  print_table "$table_from" "$(date -r "$table_from" '+%Y-%m-%d %H:%M')" "$t_rounds" "$t_batch" \
    "$t_epochs" "$t_target" "" "$t_model" "$t_rss" "$t_seed1" "$t_seedn"
  exit 0
fi

for v in "$rounds" "$batch" "$epochs"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "compare_pytorch: --rounds, --batch and --epochs take positive integers (got '$v')" >&2; exit 2; }
done
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "compare_pytorch: --seed takes an integer >= 0 (got '$seed')" >&2; exit 2; }
python3 -c "import sys; t = float(sys.argv[1]); sys.exit(0 if 0 < t <= 1 else 1)" "$target" 2>/dev/null ||
  { echo "compare_pytorch: --target takes a number in (0, 1] (got '$target')" >&2; exit 2; }
if [ -n "$cpus" ]; then
  command -v taskset > /dev/null ||
    { echo "compare_pytorch: --cpus needs taskset (util-linux), which is not on PATH" >&2; exit 2; }
  # This shell's affinity, which every run it starts inherits.
  taskset -pc "$cpus" $$ > /dev/null 2>&1 ||
    { echo "compare_pytorch: --cpus takes CPUs this process may use, in taskset's form (got '$cpus')" >&2; exit 2; }
fi
if [ ! -x "$troupe" ]; then
  echo "compare_pytorch: troupe binary not found or not executable: $troupe (build it: cmake --preset release && cmake --build --preset release, or pass --troupe PATH)" >&2
  exit 1
fi
for f in "${examples[@]}" "$pyscript" bench/pytorch_cpu_common.py; do
  [ -f "$f" ] || { echo "compare_pytorch: missing $f" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-compare-pytorch.XXXXXX")
trap 'rm -rf "$work"' EXIT
stamp=$(date +%Y%m%d-%H%M%S)
if [ -z "$raw" ]; then
  mkdir -p runs
  raw="runs/compare_pytorch-$stamp.jsonl"
fi
mkdir -p "$(dirname "$raw")"
: > "$raw"
echo "compare_pytorch: raw per-run JSON lines go to $raw (its table at any time: bench/compare_pytorch.sh --table $raw)" >&2
# What every line records besides its run: the model and the machine (the
# CPUs this script may use, after --cpus).
machine=$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "cpu": sys.argv[2], "cores": int(sys.argv[3])}))' \
  "$model" "$this_cpu" "$(nproc)")

# --- peak RSS (cnn) -------------------------------------------------------------
# measure FILE CMD...: runs CMD, writes its peak RSS to FILE as GNU time -v
# does ("Maximum resident set size (kbytes): N"), returns CMD's status.
rss_tool=""
if [ "$model" = cnn ]; then
  if [ -x /usr/bin/time ] && /usr/bin/time -v -o "$work/time-check" true 2> /dev/null &&
     grep -q 'Maximum resident set size' "$work/time-check"; then
    rss_tool="/usr/bin/time -v"
  else
    rss_tool="getrusage"
  fi
fi
measure() {
  local f=$1; shift
  if [ "$rss_tool" = "/usr/bin/time -v" ]; then
    /usr/bin/time -v -o "$f" "$@"
  else
    python3 -c 'import resource, subprocess, sys
try:
    rc = subprocess.call(sys.argv[2:])
except OSError as e:
    print(f"measure: {sys.argv[2]}: {e}", file=sys.stderr)
    rc = 127
kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
with open(sys.argv[1], "w") as f:
    f.write(f"Maximum resident set size (kbytes): {kb}\n")
sys.exit(rc if rc >= 0 else 128 - rc)' "$f" "$@"
  fi
}
# The peak RSS in MiB from a measure file ("null" when it has none).
peak_rss_mib() {
  local kb
  kb=$(sed -n 's/.*Maximum resident set size (kbytes): *\([0-9][0-9]*\).*/\1/p' "$1" 2> /dev/null | tail -n 1)
  if [ -n "$kb" ]; then
    python3 -c 'import sys; print(round(int(sys.argv[1]) / 1024, 1))' "$kb"
  else
    echo null
  fi
}
# run_measured FILE CMD...: CMD, under measure in cnn mode.
run_measured() {
  local f=$1; shift
  rm -f "$f"
  if [ -n "$rss_tool" ]; then measure "$f" "$@"; else "$@"; fi
}

# --- PyTorch: a private venv, never the system python ----------------------
venv=${TROUPE_BENCH_VENV:-$HOME/.cache/troupe-bench-venv}
torch_ok=0 skip_reason=""
# numpy and torch without the OpenBLAS tuning the environment sets for troupe.
pyenv_cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)  # a command, for measure to run too
pyenv() { "${pyenv_cmd[@]}" "$@"; }
setup_venv() {
  if [ ! -x "$venv/bin/python" ]; then
    echo "compare_pytorch: creating the venv $venv" >&2
    if ! python3 -m venv "$venv" > "$work/venv.log" 2>&1; then
      skip_reason="python3 -m venv $venv failed: $(tail -n 1 "$work/venv.log")"
      return 1
    fi
  fi
  if ! pyenv "$venv/bin/python" -c "import torch, numpy" > /dev/null 2>&1; then
    echo "compare_pytorch: pip install torch numpy into $venv (large download, once)" >&2
    if ! pyenv "$venv/bin/python" -m pip install torch numpy > "$work/pip.log" 2>&1; then
      skip_reason="pip install torch numpy into $venv failed: $(grep -m1 -E '^ERROR' "$work/pip.log" || tail -n 1 "$work/pip.log")"
      return 1
    fi
    if ! pyenv "$venv/bin/python" -c "import torch, numpy" > "$work/import.log" 2>&1; then
      skip_reason="torch does not import after the install: $(tail -n 1 "$work/import.log")"
      return 1
    fi
  fi
}
if setup_venv; then
  torch_ok=1
else
  echo "compare_pytorch: skipped: $skip_reason"
fi

# --- troupe configs ----------------------------------------------------------
round_seed() { if [ "$same_seed" = 1 ]; then echo "$seed"; else echo $((seed + $1 - 1)); fi; }
make_configs() {  # seed
python3 - "$work" "$batch" "$epochs" "$model" "$1" <<'PY'
import json, sys
work, batch, epochs, model, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
if model == "cnn":
    setups = (("one_device", "examples/fashion_mnist_cnn.json", None),
              ("mirrored2", "examples/fashion_mnist_cnn_mirrored.json", 2))
else:
    setups = (("one_device", "examples/fashion_mnist_one_device.json", None),
              ("mirrored2", "examples/fashion_mnist_mirrored.json", 2),
              ("mirrored2dc", "examples/fashion_mnist_mirrored.json", 2),
              ("mirrored2dc8", "examples/fashion_mnist_mirrored.json", 2))
for name, src, replicas in setups:
    j = json.load(open(src))
    j["data"]["batch_size"] = batch
    j["training"]["epochs"] = epochs
    if replicas is not None:
        # One device (one thread, one core) per replica: two replicas on one
        # device would share its thread.
        j["strategy"]["replicas"] = replicas
        j["devices"] = [f"cpu:{i}" for i in range(replicas)]
    if name == "mirrored2":
        j["strategy"]["reducer"] = {"algorithm": "ring"}  # the reducer actors
    if name.startswith("mirrored2dc"):
        j["strategy"]["reducer"] = {"algorithm": "device"}  # data.gather auto: "step"
    if name == "mirrored2dc8":
        j["training"]["steps_per_execution"] = 8
    j["seed"] = seed
    json.dump(j, open(f"{work}/{name}.json", "w"), indent=1)
PY
}

failures=0
run_troupe() {  # setup-label config-name round
  local out="$work/run-$2" log="$work/troupe-$2.log" rss="$work/rss-troupe-$2" mib=""
  rm -rf "$out"
  if ! run_measured "$rss" "$troupe" run "$work/$2.json" --output "$out" --overwrite --quiet > "$log" 2>&1; then
    echo "compare_pytorch: troupe run failed ($1, round $3):" >&2
    tail -n 5 "$log" >&2
    failures=$((failures + 1))
    return 0
  fi
  [ -z "$rss_tool" ] || mib=$(peak_rss_mib "$rss")
  python3 - "$out" "$1" "$batch" "$epochs" "$target" "$3" "$mib" "$(round_seed "$3")" "$machine" <<'PY' >> "$raw"
import json, sys
out, setup, batch, epochs, target, rnd, mib, seed, machine = sys.argv[1:]
s = json.load(open(f"{out}/summary.json"))
accs, stt, eat = [], None, None
for line in open(f"{out}/metrics.jsonl"):
    line = line.strip()
    if not line:
        continue
    m = json.loads(line)
    if m.get("type") != "epoch" or m.get("test_accuracy") is None:
        continue
    accs.append(round(m["test_accuracy"], 4))
    if stt is None and m["test_accuracy"] >= float(target):
        # train_seconds: evaluations and checkpoints left out, as PyTorch's
        # script counts (older troupe builds wrote elapsed_seconds only).
        stt, eat = round(m.get("train_seconds", m["elapsed_seconds"]), 3), len(accs)
j = {"system": "troupe", "setup": setup, "round": int(rnd), "seed": int(seed), "batch": int(batch),
     "epochs": int(epochs), "target": float(target),
     "samples_per_second": round(s["samples_per_second"]),
     "seconds_to_target": stt, "epoch_at_target": eat,
     "final_test_accuracy": round(s["test_accuracy"], 4),
     "train_seconds": s.get("train_seconds"), "wall_seconds": s.get("wall_seconds"),
     "test_accuracy_by_epoch": accs}
j.update(json.loads(machine))
if mib:  # cnn: the run's peak RSS (null: not measured)
    j["peak_rss_mib"] = json.loads(mib)
print(json.dumps(j))
PY
  rm -rf "$out"
}

run_pytorch() {  # round, then the arguments of $pyscript (pytorch_cpu_mlp.py or _cnn.py)
  local rnd=$1; shift
  local log="$work/pytorch.log" rss="$work/rss-pytorch" mib="" line
  if ! run_measured "$rss" "${pyenv_cmd[@]}" "$venv/bin/python" "$pyscript" --seed "$(round_seed "$rnd")" --batch "$batch" --epochs "$epochs" \
       --target "$target" "$@" > "$log" 2>&1; then
    echo "compare_pytorch: PyTorch run failed ($*, round $rnd):" >&2
    tail -n 5 "$log" >&2
    failures=$((failures + 1))
    return 0
  fi
  [ -z "$rss_tool" ] || mib=$(peak_rss_mib "$rss")
  line=$(grep '^{' "$log" | tail -n 1)
  python3 -c 'import json, sys
j = json.loads(sys.argv[1]); j["round"] = int(sys.argv[2]); j["seed"] = int(sys.argv[4])
j.update(json.loads(sys.argv[5]))
if sys.argv[3]:
    j["peak_rss_mib"] = json.loads(sys.argv[3])
print(json.dumps(j))' "$line" "$rnd" "$mib" "$(round_seed "$rnd")" "$machine" >> "$raw"
}

if [ "$model" = cnn ]; then
  setups=("troupe one_device" "troupe mirrored 2")
  if [ "$torch_ok" = 1 ]; then
    setups+=("pytorch 2" "pytorch 2 fused")
    # channels_last only where this torch trains a convolution in it.
    if cl_err=$(pyenv "$venv/bin/python" -c 'import torch
m = torch.nn.Conv2d(1, 4, 3, padding=1).to(memory_format=torch.channels_last)
x = torch.randn(2, 1, 8, 8).contiguous(memory_format=torch.channels_last)
m(x).sum().backward()' 2>&1); then
      setups+=("pytorch 2 channels_last fused")
    else
      echo "compare_pytorch: pytorch 2 threads + channels_last left out: $(printf '%s\n' "$cl_err" | tail -n 1)" >&2
    fi
  fi
else
  setups=("troupe one_device" "troupe mirrored 2" "troupe mirrored 2 device collectives"
          "troupe mirrored 2 device collectives, 8 steps per execution")
  if [ "$torch_ok" = 1 ]; then
    setups+=("pytorch 1" "pytorch 2" "pytorch 2 fused" "pytorch ddp 2")
  fi
fi
kept=()
for s in "${setups[@]}"; do
  skip=0
  for k in "${skips[@]}"; do [ "$k" = "$s" ] && skip=1; done
  [ "$skip" = 1 ] || kept+=("$s")
done
for k in "${skips[@]}"; do
  printf '%s\n' "${setups[@]}" | grep -qxF -- "$k" ||
    { echo "compare_pytorch: --skip: no setup '$k' (setups: $(printf '"%s" ' "${setups[@]}"))" >&2; exit 2; }
done
setups=("${kept[@]}")
for ((r = 1; r <= rounds; r++)); do
  make_configs "$(round_seed "$r")"
  for s in "${setups[@]}"; do
    echo "compare_pytorch: round $r/$rounds: $s" >&2
    case "$s" in
      "troupe one_device") run_troupe one_device one_device "$r" ;;
      "troupe mirrored 2") run_troupe "mirrored 2" mirrored2 "$r" ;;
      "troupe mirrored 2 device collectives")
        run_troupe "mirrored 2 device collectives" mirrored2dc "$r" ;;
      "troupe mirrored 2 device collectives, 8 steps per execution")
        run_troupe "mirrored 2 device collectives, 8 steps per execution" mirrored2dc8 "$r" ;;
      "pytorch 1") run_pytorch "$r" --threads 1 ;;
      "pytorch 2") run_pytorch "$r" --threads 2 ;;
      "pytorch 2 fused") run_pytorch "$r" --threads 2 --fused ;;
      "pytorch ddp 2") run_pytorch "$r" --ddp 2 ;;
      "pytorch 2 channels_last fused") run_pytorch "$r" --threads 2 --channels-last --fused ;;
    esac
  done
done

print_table "$raw" "$(date '+%Y-%m-%d %H:%M')" "$rounds" "$batch" "$epochs" "$target" "$skip_reason" "$model" "$rss_tool" "$(round_seed 1)" "$(round_seed "$rounds")"
echo
echo "raw per-run JSON lines: $raw"
if [ "$failures" -gt 0 ]; then
  echo "compare_pytorch: $failures run(s) failed (see above)" >&2
  exit 1
fi
