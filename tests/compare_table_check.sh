#!/usr/bin/env bash
# bench/compare_pytorch.sh --table FILE: the table and ratios of a raw file's
# runs without running any (a run cut short, or one from another machine),
# and a clear error (exit 2) for a file that is not the script's.
#   tests/compare_table_check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-compare-table.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# Three rounds of two troupe setups and one PyTorch setup, from a machine
# the lines name; PyTorch's third round is missing (the run was cut short).
python3 - "$work/raw.jsonl" <<'PY'
import json, sys
rows = []
def run(system, setup, rnd, sps, t, epoch):
    rows.append({"system": system, "setup": setup, "round": rnd, "seed": 41 + rnd, "batch": 128,
                 "epochs": 12, "target": 0.89, "samples_per_second": sps,
                 "seconds_to_target": t, "epoch_at_target": epoch, "final_test_accuracy": 0.899,
                 "model": "mlp", "cpu": "Test CPU 9000", "cores": 2})
for r, (od, mir, pt) in enumerate([((100000, 4.0, 7), (150000, 3.0, 7), (60000, 7.0, 7)),
                                   ((90000, 5.0, 8), (140000, 3.5, 8), (50000, 8.0, 7)),
                                   ((95000, 4.5, 7), (145000, None, None), None)], 1):
    run("troupe", "one_device", r, *od)
    run("troupe", "mirrored 2 device collectives", r, *mir)
    if pt:
        run("pytorch", "2 threads + fused Adam", r, *pt)
with open(sys.argv[1], "w") as f:
    for j in rows:
        f.write(json.dumps(j) + "\n")
PY
out=$(bench/compare_pytorch.sh --table "$work/raw.jsonl" 2>&1) || fail "--table exited $?: $out"
expect() {
  grep -qF -- "$1" <<< "$out" || fail "no line with '$1' in:
$out"
}
expect "### Test CPU 9000, 2 cores"
expect "--rounds 3 --batch 128 --epochs 12 --target 0.89"
expect "seeds 42–44, one a round"
# Medians: troupe one_device 4.50 s, mirrored 3.25 s (reached in 2 of 3),
# PyTorch 7.50 s.
expect "| troupe one_device | 95.0k (90.0k–100.0k) | 4.50 (4.00–5.00) | 7 8 7 |"
expect "| troupe mirrored 2 device collectives | 145.0k (140.0k–150.0k) | 3.25 (3.00–3.50); not reached in 1 of 3 | 7 8 – |"
expect "| pytorch 2 threads + fused Adam | 55.0k (50.0k–60.0k) | 7.50 (7.00–8.00) | 7 7 |"
expect "time to target = 0.43 (troupe mirrored 2 device collectives 3.25 s / PyTorch 2 threads + fused Adam 7.50 s)"
expect "mirrored 2 device collectives / one_device samples/s = 1.53"

bad() {  # file-content expected-message
  printf '%s' "$1" > "$work/bad.jsonl"
  local o rc
  o=$(bench/compare_pytorch.sh --table "$work/bad.jsonl" 2>&1)
  rc=$?
  [ "$rc" = 2 ] || fail "--table on '$1' exited $rc, expected 2: $o"
  grep -qF -- "$2" <<< "$o" || fail "--table on '$1' said '$o', expected '$2'"
}
bad "" "bad.jsonl: no runs"
bad '{"system": "troupe"}' "bad.jsonl:1: not a run of this script (KeyError: 'round')"
bad 'not json' "bad.jsonl:1: not a run of this script"
bad '{"round": 1, "batch": 128, "epochs": 12, "target": 0.89, "samples_per_second": 1, "system": "troupe", "setup": "one_device", "seconds_to_target": null}' \
  "bad.jsonl:1: not a run of this script (KeyError: 'final_test_accuracy')"
o=$(bench/compare_pytorch.sh --table "$work/missing.jsonl" 2>&1)
rc=$?
if [ "$rc" != 2 ] || ! grep -qF "no file $work/missing.jsonl" <<< "$o"; then
  fail "a missing file: exit $rc, $o"
fi
echo "compare_pytorch.sh --table: table, ratios and errors as expected"
