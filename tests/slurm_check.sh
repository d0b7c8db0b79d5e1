#!/usr/bin/env bash
# troupe under a real SLURM (scripts/slurm-local.sh: munge, slurmctld and
# slurmd on this machine): `srun -n 3 troupe node --config ...` with no other
# flag trains a mirrored and a parameter_server job from SLURM's variables;
# `scancel --signal=TERM` mid-job leaves a checkpoint (exit 75), and the same
# srun again resumes it to the end of an uninterrupted run.
#   tests/slurm_check.sh TROUPE_BIN
# Exit 77 (ctest: skipped) with the reason when SLURM cannot run here (not
# root, packages missing: scripts/slurm-local.sh install); daemons that are
# installed but do not start fail it.
set -uo pipefail
cd "$(dirname "$0")/.."
troupe=$(realpath "${1:?usage: tests/slurm_check.sh TROUPE_BIN}")

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || skip "the local SLURM daemons need root"
command -v slurmctld >/dev/null && command -v srun >/dev/null && command -v munged >/dev/null ||
  skip "SLURM is not installed (scripts/slurm-local.sh install)"

work=$(mktemp -d /tmp/troupe-slurm-test.XXXXXX)
export TROUPE_SLURM_DIR=$work/slurm
# A controller port of its own, so that parallel runs do not meet.
export TROUPE_SLURM_PORT=$((20000 + RANDOM % 20000))
cleanup() {
  scripts/slurm-local.sh stop >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
# Installed but not starting is a fault here (or in the install), not a
# host without SLURM: it fails.
scripts/slurm-local.sh start || fail "the local SLURM is installed but did not start (see above)"
export SLURM_CONF=$TROUPE_SLURM_DIR/slurm.conf
export TROUPE_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')  # strong: a guessable one is refused

# The env examples, shorter (4 epochs; the accuracy bar is 4 epochs' one).
config() {  # example out_json epochs checkpoint_every
  python3 - "$@" <<'PY'
import json, sys
src, dst, epochs, every = sys.argv[1:]
j = json.load(open(src))
j["training"] = {"epochs": int(epochs)}
j["checkpoint"] = {"every_steps": int(every), "keep": 3}
j["logging"] = {"level": "info"}
# ctest runs other tests beside these 3 processes on a 2-core machine: a
# peer silent for 3 s (1 s heartbeats) happened under that load. A hung
# peer's detection has tests of its own; this one checks SLURM's launch,
# preemption and resume.
j["cluster"]["heartbeat_seconds"] = 5
json.dump(j, open(dst, "w"))
PY
}
summary_field() {  # run_dir field
  python3 -c "import json,sys; print(json.load(open(sys.argv[1] + '/summary.json')).get(sys.argv[2], ''))" "$1" "$2"
}
check_accuracy() {  # run_dir minimum
  local acc
  acc=$(summary_field "$1" test_accuracy)
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)" "$acc" "$2" ||
    fail "$1: test accuracy $acc < $2"
  echo "$1: test accuracy $acc"
}

config examples/fashion_mnist_mirrored_env.json "$work/mirrored.json" 4 200
config examples/fashion_mnist_parameter_server_env.json "$work/ps.json" 4 400

echo "== mirrored: srun -n 3 troupe node"
timeout 300 srun -n 3 -O "$troupe" node --config "$work/mirrored.json" --output "$work/mirrored" \
  >"$work/mirrored.log" 2>&1 || { tail -30 "$work/mirrored.log"; fail "srun mirrored"; }
check_accuracy "$work/mirrored" 0.85

echo "== parameter_server: srun -n 3 troupe node (chief, ps:0, worker:0)"
timeout 300 srun -n 3 -O "$troupe" node --config "$work/ps.json" --output "$work/ps" \
  >"$work/ps.log" 2>&1 || { tail -30 "$work/ps.log"; fail "srun parameter_server"; }
check_accuracy "$work/ps" 0.85

echo "== mirrored, scancel --signal=TERM mid-job, then the same srun again"
timeout 300 srun -n 3 -O -J troupe-preempt "$troupe" node --config "$work/mirrored.json" \
  --output "$work/pre" >"$work/pre.log" 2>&1 &
srun_pid=$!
for _ in $(seq 600); do
  ls "$work/pre/checkpoints" 2>/dev/null | grep -q '^ckpt-' && break
  sleep 0.1
done
ls "$work/pre/checkpoints" 2>/dev/null | grep -q '^ckpt-' || fail "no checkpoint within 60 s"
job=$(squeue -h -n troupe-preempt -o %i | head -1)
[ -n "$job" ] || fail "the job ended before it could be signalled (see $work/pre.log)"
scancel --signal=TERM "$job"
wait "$srun_pid"
rc=$?
[ "$rc" -eq 75 ] || { tail -30 "$work/pre.log"; fail "srun exited $rc after SIGTERM, expected 75"; }
[ -f "$work/pre/checkpoints/preempted.json" ] || fail "no preempted.json"
stopped_at=$(summary_field "$work/pre" steps)
echo "preempted at step $stopped_at (exit 75)"
timeout 300 srun -n 3 -O "$troupe" node --config "$work/mirrored.json" --output "$work/pre" \
  >"$work/resumed.log" 2>&1 || { tail -30 "$work/resumed.log"; fail "the resumed srun"; }
[ ! -f "$work/pre/checkpoints/preempted.json" ] || fail "preempted.json left after the resumed run"
whole_steps=$(summary_field "$work/mirrored" steps)
steps=$(summary_field "$work/pre" steps)
[ "$steps" = "$whole_steps" ] || fail "resumed run ended at step $steps, uninterrupted at $whole_steps"
a=$(summary_field "$work/pre" test_accuracy)
b=$(summary_field "$work/mirrored" test_accuracy)
python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) < 0.005 else 1)" "$a" "$b" ||
  fail "resumed accuracy $a, uninterrupted $b"
echo "resumed to step $steps: test accuracy $a (uninterrupted: $b)"
echo "PASSED"
