#!/usr/bin/env python3
"""Where a mirrored step's time goes, from a troupe trace (--trace FILE).

  bench/step_breakdown.py TRACE.json... [--skip 50]

For each file: the device thread's spans from step --skip to the last, each
span's own time (its duration less the spans nested in it), in microseconds
per step, as one JSON line: "period" (wall time per step), the step task
("forward_backward_allreduce_update": forward, backward and Adam),
"all_reduce" (the in-process collective), "across_processes" (the exchange
between processes over direct links: copies, sums, socket calls),
"tls_seal" / "tls_open" (TLS records' crypto), "link_wait" (nothing to move:
the peer's data or room not there yet), "batch_gather", and "between_steps"
(the device thread outside any span: the step's messages and hand-overs).
Run it on each process's trace (docs/traces.md)."""
import argparse
import json


def breakdown(path, skip):
    ev = json.load(open(path))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = sorted((e for e in ev if e.get("ph") == "X"
                    and names.get((e["pid"], e["tid"]), "").startswith("device")),
                   key=lambda e: (e["ts"], -e["dur"]))
    steps = [e for e in spans if e["name"] == "forward_backward_allreduce_update"]
    if len(steps) <= skip + 1:
        raise SystemExit(f"{path}: {len(steps)} steps, fewer than --skip {skip} + 2")
    t0, t1 = steps[skip]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    n = len(steps) - skip
    spans = [e for e in spans if t0 <= e["ts"] < t1]
    own, stack, top = {}, [], 0.0
    for e in spans:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + 1e-6:
            stack.pop()
        if stack:
            own[stack[-1]["name"]] = own.get(stack[-1]["name"], 0.0) - e["dur"]
        else:
            top += e["dur"]
        own[e["name"]] = own.get(e["name"], 0.0) + e["dur"]
        stack.append(e)
    out = {"trace": path, "steps": n, "period": round((t1 - t0) / n, 1)}
    out.update({k: round(v / n, 1) for k, v in sorted(own.items())})
    out["between_steps"] = round((t1 - t0 - top) / n, 1)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--skip", type=int, default=50, help="steps left out at the start")
    a = p.parse_args()
    for path in a.traces:
        print(json.dumps(breakdown(path, a.skip)), flush=True)


if __name__ == "__main__":
    main()
