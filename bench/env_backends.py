#!/usr/bin/env python3
"""Native batched environment backends against troupe's Python path.

Issue 43 asks for EnvPool or the ALE/MuJoCo C APIs as native batched
backends *if they measure faster than the Python path*. This measures, on
one process and the same random actions, the environment steps per second
of:

  python    what troupe's Gymnasium worker (envs/python/troupe_env_worker.py)
            does: gymnasium.make per environment, its wrappers, a Python loop
            over the batch (Pong: AtariPreprocessing + FrameStackObservation:4,
            as examples/pong_impala.json; HalfCheetah-v5 as
            examples/halfcheetah_impala.json)
  ale       ale_py's AtariVectorEnv (ALE's C++ vector interface, its own
            preprocessing and threads; Pong only)
  mujoco    the physics alone: mujoco.mj_step x frame_skip on the same model,
            the floor any MuJoCo backend stands on (HalfCheetah only)
  envpool   EnvPool's batched C++ environments (when importable)

Each line printed is JSON: {"bench": "env_backends", "env", "backend",
"envs", "threads", "env_steps_per_second"}. Run it with a Python that has
what it measures, e.g.

  ~/.cache/troupe-venv/bin/python bench/env_backends.py --envs 8 --steps 400
  VENV_WITH_ENVPOOL/bin/python bench/env_backends.py --backends envpool

Backends whose package is missing are skipped with a line on stderr.
"""
import argparse
import json
import sys
import time

import numpy as np


def report(env, backend, envs, threads, steps_per_second):
    print(json.dumps({"bench": "env_backends", "env": env, "backend": backend, "envs": envs,
                      "threads": threads, "env_steps_per_second": round(steps_per_second)}),
          flush=True)


def timed(step, n_calls, rows):
    start = time.perf_counter()
    for i in range(n_calls):
        step(i)
    return rows * n_calls / (time.perf_counter() - start)


def python_pong(gym, n, steps):
    import ale_py
    gym.register_envs(ale_py)
    envs = []
    for i in range(n):
        e = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.25)
        e = gym.wrappers.FrameStackObservation(gym.wrappers.AtariPreprocessing(e), 4)
        e.reset(seed=i)
        envs.append(e)
    actions = np.random.default_rng(0).integers(6, size=(steps, n))

    def step(s):
        for i, e in enumerate(envs):
            _, _, term, trunc, _ = e.step(int(actions[s, i]))
            if term or trunc:
                e.reset()
    return timed(step, steps, n)


def ale_pong(n, steps, threads):
    import ale_py
    v = ale_py.vector_env.AtariVectorEnv("pong", n, num_threads=threads,
                                         repeat_action_probability=0.25)
    v.reset(seed=0)
    actions = np.random.default_rng(0).integers(6, size=(steps, n))
    return timed(lambda s: v.step(actions[s]), steps, n)


def python_cheetah(gym, n, steps):
    envs = [gym.make("HalfCheetah-v5") for _ in range(n)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(steps, n, 6)).astype(np.float32)

    def step(s):
        for i, e in enumerate(envs):
            _, _, term, trunc, _ = e.step(actions[s, i])
            if term or trunc:
                e.reset()
    return timed(step, steps, n), envs[0].unwrapped


def mujoco_floor(env, n, steps):
    import mujoco
    m, d, skip = env.model, env.data, env.frame_skip
    actions = np.random.default_rng(1).uniform(-1, 1, size=(steps, 6))

    def step(s):
        d.ctrl[:] = actions[s % steps]
        mujoco.mj_step(m, d, nstep=skip)
    return timed(step, steps * n, 1)


def envpool_rate(task, n, steps, threads):
    import envpool
    kw = dict(num_envs=n, num_threads=threads, seed=0)
    if task == "Pong-v5":
        kw["repeat_action_probability"] = 0.25
    env = envpool.make_gymnasium(task, **kw)
    env.reset()
    rng = np.random.default_rng(0)
    if task == "Pong-v5":
        actions = rng.integers(6, size=(steps, n))
    else:
        actions = rng.uniform(-1, 1, size=(steps, n, 6)).astype(np.float32)
    return timed(lambda s: env.step(actions[s]), steps, n)


def run(backend, args):
    n, steps = args.envs, args.steps
    if backend == "python":
        import gymnasium as gym
        report("Pong-v5", "python", n, 1, python_pong(gym, n, steps))
        rate, cheetah = python_cheetah(gym, n, steps * 8)
        report("HalfCheetah-v5", "python", n, 1, rate)
        report("HalfCheetah-v5", "mujoco", 1, 1, mujoco_floor(cheetah, n, steps * 8))
    for threads in args.threads:
        if backend == "ale":
            report("Pong-v5", "ale", n, threads, ale_pong(n, steps, threads))
        if backend == "envpool":
            report("Pong-v5", "envpool", n, threads, envpool_rate("Pong-v5", n, steps, threads))
            report("HalfCheetah-v5", "envpool", n, threads,
                   envpool_rate("HalfCheetah-v5", n, steps * 8, threads))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", type=int, default=8, help="environments in the batch")
    p.add_argument("--steps", type=int, default=400, help="batch steps (HalfCheetah: 8x)")
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--backends", default="python,ale,envpool")
    args = p.parse_args()
    for backend in args.backends.split(","):
        try:
            run(backend, args)
        except ImportError as e:
            print(f"env_backends: {backend} skipped: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
