#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with TensorBoard's own reader and
checks every scalar against the run's metrics.jsonl (the rule of
monitoring/tensorboard_sink.hpp). Needs the `tensorboard` package (a venv:
python3 -m venv .venv && .venv/bin/pip install tensorboard); not a test
dependency.

usage: tensorboard_check.py RUN_DIR   (the --output of a run with logging.tensorboard)
"""
import json
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROLE_KEYS = ("shard", "worker", "actor")


def expected_scalars(run_dir):
    want = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for text in f:
            line = json.loads(text)
            kind = line.get("type")
            if not isinstance(kind, str) or kind == "summary":
                continue
            run, role = "job", None
            for k in ROLE_KEYS:
                if isinstance(line.get(k), int):
                    run, role = f"{k}_{line[k]}", k
                    break
            for key in sorted(line):
                v = line[key]
                if key in ("step", "type", role) or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                want.setdefault(run, {}).setdefault(f"{kind}/{key}", []).append((line.get("step"), v))
    return want


def as_float32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def main():
    run_dir = sys.argv[1]
    want = expected_scalars(run_dir)
    checked = 0
    for run, tags in want.items():
        acc = EventAccumulator(os.path.join(run_dir, "tensorboard", run), size_guidance={"scalars": 0})
        acc.Reload()
        for tag, points in tags.items():
            got = acc.Scalars(tag)
            assert len(got) == len(points), f"{run} {tag}: {len(got)} events, {len(points)} lines"
            for g, (step, value) in zip(got, points):
                assert g.value == as_float32(value), f"{run} {tag}: {g.value} != {value}"
                assert step is None or g.step == step, f"{run} {tag}: step {g.step} != {step}"
                checked += 1
    print(f"{run_dir}: {checked} scalars in {len(want)} runs match metrics.jsonl (TensorBoard's reader)")


if __name__ == "__main__":
    main()
