# shellcheck shell=bash disable=SC2154  # $troupe, $work, $timeout_s: set by the sourcing script
# Sourced by bench/compare_rl.sh and bench/compare_sf.sh: what both do on
# troupe's side and around each run. Expects $troupe, $work and $timeout_s.

cpu_model() { lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1; }

load_1m() { cut -d' ' -f1 /proc/loadavg; }  # uptime's first load average

json_of_config() {  # config key.path
  python3 -c "import json,sys; v=json.load(open(sys.argv[1]))
for k in sys.argv[2].split('.'): v=v[k]
print(v)" "$1" "$2"
}

# troupe run on `config` with its "seed" set: one JSON line (side troupe,
# solved, seconds to solve or the run's wall seconds, env steps, env steps/s).
run_troupe_solve() {  # config seed
  local cfg=$work/troupe_$2.json out=$work/run_troupe_$2
  python3 - "$1" "$2" "$cfg" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["seed"] = int(sys.argv[2])
json.dump(c, open(sys.argv[3], "w"))
PY
  if timeout "$timeout_s" "$troupe" run "$cfg" --output "$out" --overwrite --quiet >"$work/troupe.log" 2>&1; then
    python3 - "$out/summary.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
solved = bool(s.get("solved"))
print(json.dumps({"side": "troupe", "seed": int(sys.argv[2]), "solved": solved,
                  "seconds": s["time_to_solve_seconds"] if solved else s["wall_seconds"],
                  "env_steps": s["env_steps"], "env_steps_per_second": s["env_steps_per_second"]}))
PY
  else
    echo "{\"side\": \"troupe\", \"seed\": $2, \"solved\": false, \"seconds\": $timeout_s, \"env_steps\": 0, \"env_steps_per_second\": 0}"
  fi
}

# The JSON line on stdin with `key=value` pairs added (values as Python
# literals), as one line.
tag_json() {
  python3 -c 'import ast, json, sys
r = json.loads(sys.stdin.read())
for kv in sys.argv[1:]:
    k, v = kv.split("=", 1)
    r[k] = ast.literal_eval(v)
print(json.dumps(r))' "$@"
}
