"""Steps a batch of Gymnasium environments for one troupe rl_actor.

Started by envs/python_env.cpp as `python -c <this file> <socket fd> <memory fd>`
(the file is compiled into troupe, so no path to it has to be found). The
C++ side sends one JSON line per command on the socket and waits for one
JSON line back; observations, actions, rewards and the episode flags pass
through the shared memory (a memfd) so that nothing per instance is encoded.

Commands: {"cmd": "make", ...} makes the instances (gymnasium.make, then
rl.env.wrappers from WRAPPERS, innermost first) and answers the spaces (with
the observation's shape and dtype: uint8 pixels are written as floats / 255);
{"cmd": "map", "bytes": N} maps the memory; {"cmd": "reset", "seed": S}
resets instance i with seed S + i; {"cmd": "step"} steps every instance with
the actions in the memory (a Box's clipped to its bounds), resetting an
instance whose episode ended at once (its last observation goes
to final_obs); {"cmd": "get_state"/"set_state", "instance": i} read or write
`env.unwrapped.state` (classic control's simulator state). A Python exception
answers {"ok": false, "error": ..., "last": traceback's last line}.
"""
import json
import mmap
import os
import socket
import sys
import traceback


# The step's doorbell and answer, as python_env.cpp writes and reads them.
STEP = "step\n"
STEPPED = b"stepped\n"


def reply(sock, **fields):
    sock.sendall((json.dumps(fields) + "\n").encode())


def failure(where):
    lines = traceback.format_exc().strip().splitlines()
    return {"ok": False, "error": where, "last": lines[-1] if lines else ""}


def describe(space):
    return str(space)


def with_arg(kwargs, arg, name, convert, default=None):
    """The wrapper's kwargs with the argument after "name:" as `name`."""
    out = dict(kwargs)
    if arg is not None:
        out[name] = convert(arg)
    elif default is not None:
        out.setdefault(name, default)
    return out


def clip_bounds(kwargs, arg):
    bound = float(arg) if arg is not None else 1.0
    return {"min_reward": -bound, "max_reward": bound, **kwargs}


# rl.env.wrappers by name: each makes the wrapper around env from the
# argument after "name:" (None without one) and the object form's kwargs.
WRAPPERS = {
    # Frame skip (max over the last two frames), no-op starts, grayscale,
    # 84x84 and (terminal_on_life_loss) episodic life, as Machado et al. and
    # Gymnasium define them; the env itself must not skip (ALE: frameskip=1).
    "atari_preprocessing": lambda gym, env, arg, kw: gym.wrappers.AtariPreprocessing(env, **kw),
    "frame_stack": lambda gym, env, arg, kw: gym.wrappers.FrameStackObservation(
        env, **with_arg(kw, arg, "stack_size", int, 4)),
    "grayscale": lambda gym, env, arg, kw: gym.wrappers.GrayscaleObservation(env, **kw),
    "resize": lambda gym, env, arg, kw: gym.wrappers.ResizeObservation(
        env, **with_arg(kw, arg, "shape", lambda a: (int(a), int(a)), (84, 84))),
    "clip_reward": lambda gym, env, arg, kw: gym.wrappers.ClipReward(env, **clip_bounds(kw, arg)),
    "normalize_observation": lambda gym, env, arg, kw: gym.wrappers.NormalizeObservation(env, **kw),
    "time_limit": lambda gym, env, arg, kw: gym.wrappers.TimeLimit(
        env, **with_arg(kw, arg, "max_episode_steps", int)),
}


class WrapperError(Exception):
    """An unknown wrapper, or one that refused the env: the message names it."""


def wrapped(gym, env, wrappers):
    for i, w in enumerate(wrappers):
        name, kwargs = (w, {}) if isinstance(w, str) else (w["name"], w.get("kwargs", {}))
        name, _, arg = name.partition(":")
        if name not in WRAPPERS:
            raise WrapperError("unknown wrapper '%s', expected one of %s"
                               % (name, ", ".join('"%s"' % k for k in WRAPPERS)), i)
        try:
            env = WRAPPERS[name](gym, env, arg or None, kwargs)
        except Exception:
            raise WrapperError("the wrapper '%s' refused the environment: %s"
                               % (name, failure("")["last"]), i)
    return env


def make_envs(gym, cmd):
    if cmd.get("entry_point") and cmd["id"] not in gym.registry:
        gym.register(id=cmd["id"], entry_point=cmd["entry_point"])
    if cmd["id"].startswith("ALE/"):  # Atari's ids are registered by ale-py
        import ale_py
        gym.register_envs(ale_py)
    envs = [gym.make(cmd["id"], **cmd["kwargs"]) for _ in range(cmd["instances"])]
    return [wrapped(gym, env, cmd.get("wrappers", [])) for env in envs]


def float_box(np, gym, space):
    return isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)


def observation_box(np, gym, space):
    """Floats, or bytes (pixels, scaled to [0, 1] on the way out)."""
    return float_box(np, gym, space) or (
        isinstance(space, gym.spaces.Box) and space.dtype == np.uint8)


def spaces_of(np, gym, env):
    """The spaces as the C++ side takes them, or why it cannot."""
    obs, act = env.observation_space, env.action_space
    out = {"ok": True, "observation_space": describe(obs), "action_space": describe(act)}
    if not observation_box(np, gym, obs):
        return {"ok": False, "space": "observation", "error": describe(obs)}
    out["observation_size"] = int(np.prod(obs.shape))
    out["observation_shape"] = [int(d) for d in obs.shape]
    out["observation_dtype"] = str(obs.dtype)
    if isinstance(act, gym.spaces.Discrete):
        out["actions"] = int(act.n)
    elif float_box(np, gym, act) and len(act.shape) == 1:
        out["action_low"] = [float(x) for x in act.low]
        out["action_high"] = [float(x) for x in act.high]
    else:
        return {"ok": False, "space": "action", "error": describe(act)}
    spec = env.spec
    out["max_episode_steps"] = int(spec.max_episode_steps or 0) if spec else 0
    env.reset(seed=0)  # classic control's state exists after a reset (reset again later)
    state = getattr(env.unwrapped, "state", None)
    out["state_size"] = int(np.asarray(state).size) if state is not None else 0
    return out


class Batch:
    """The instances and their views of the shared memory."""

    def __init__(self, np, gym, envs, spaces):
        self.np, self.envs, self.n = np, envs, len(envs)
        self.obs_size = spaces["observation_size"]
        self.box = "action_low" in spaces
        if self.box:  # actions outside the Box are clipped to it (Gymnasium's ClipAction)
            self.low = np.asarray(spaces["action_low"], np.float32)
            self.high = np.asarray(spaces["action_high"], np.float32)
        # Bytes (pixels) become floats in [0, 1].
        self.scale = 1.0 / 255 if spaces["observation_dtype"] == "uint8" else None
        self.dims = len(spaces.get("action_low", [])) or 1
        start = getattr(envs[0].action_space, "start", 0)
        self.action_start = int(start) if not self.box else 0
        self.returns = [0.0] * self.n
        self.lengths = [0] * self.n

    def map(self, fd, size):
        np, n, o = self.np, self.n, self.obs_size
        self.memory = mmap.mmap(fd, size)
        layout = [("episode_return", np.float64, n), ("episode_length", np.int64, n),
                  ("obs", np.float32, n * o), ("final_obs", np.float32, n * o),
                  ("reward", np.float32, n),
                  ("actions", np.float32 if self.box else np.int32, n * self.dims),
                  ("terminated", np.uint8, n), ("truncated", np.uint8, n)]
        offset = 0
        for name, dtype, count in layout:  # the order and types of python_env.cpp's layout
            setattr(self, name, np.ndarray(count, dtype, self.memory, offset))
            offset += count * np.dtype(dtype).itemsize
        self.obs.shape = self.final_obs.shape = (n, o)
        self.actions.shape = (n, self.dims)

    def reset(self, seed):
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=seed + i)
            self.obs[i] = self.floats(obs).ravel()
        self.returns = [0.0] * self.n
        self.lengths = [0] * self.n

    def step(self):
        # Per instance only the step and Python lists; the shared arrays are
        # written once per batch (NumPy's per-element writes cost more than
        # CartPole's own step).
        np, box, start = self.np, self.box, self.action_start
        actions = self.actions.tolist()
        rewards, terminations, truncations, observations = [], [], [], []
        self.episode_return[:] = 0
        self.episode_length[:] = 0
        for i, env in enumerate(self.envs):
            action = (np.clip(np.asarray(actions[i], np.float32), self.low, self.high) if box
                      else actions[i][0] + start)
            obs, reward, terminated, truncated, _ = env.step(action)
            reward = float(reward)
            self.returns[i] += reward
            self.lengths[i] += 1
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
            if terminated or truncated:
                self.end_episode(i, obs)
                obs, _ = env.reset()  # the instance's own generator, seeded by the first reset
            observations.append(obs)
        self.obs[:] = self.floats(observations).reshape(self.n, -1)
        self.reward[:] = rewards
        self.terminated[:] = terminations
        self.truncated[:] = truncations

    def end_episode(self, i, obs):
        self.final_obs[i] = self.floats(obs).ravel()
        self.episode_return[i], self.episode_length[i] = self.returns[i], self.lengths[i]
        self.returns[i], self.lengths[i] = 0, 0

    def floats(self, obs):
        out = self.np.asarray(obs, dtype=self.np.float32)
        if self.scale is not None:
            out *= self.scale
        return out

    def get_state(self, i):
        return [float(x) for x in self.np.asarray(self.envs[i].unwrapped.state).ravel()]

    def set_state(self, i, state):
        env = self.envs[i].unwrapped
        env.state = self.np.asarray(state, dtype=self.np.asarray(env.state).dtype)


def start(sock, cmd):
    """Imports Gymnasium and makes the instances: the batch, or None after replying why not."""
    try:
        import gymnasium as gym
        import numpy as np
    except ImportError:
        reply(sock, **failure("import"))
        return None
    try:
        envs = make_envs(gym, cmd)
    except WrapperError as e:
        reply(sock, ok=False, error="wrappers", last=e.args[0], index=e.args[1])
        return None
    except Exception:
        reply(sock, **failure("make"))
        return None
    spaces = spaces_of(np, gym, envs[0])
    reply(sock, **spaces)
    return Batch(np, gym, envs, spaces) if spaces["ok"] else None


def serve(sock, memory_fd, lines):
    batch = start(sock, json.loads(next(lines)))
    if batch is None:
        return
    for line in lines:
        if line == STEP:  # the doorbell of every step: no JSON either way
            try:
                batch.step()
                sock.sendall(STEPPED)
            except Exception:
                reply(sock, **failure("step"))
            continue
        cmd = json.loads(line)
        name = cmd["cmd"]
        try:
            answer = {}
            if name == "map":
                batch.map(memory_fd, cmd["bytes"])
            elif name == "reset":
                batch.reset(cmd["seed"])
            elif name == "step":
                batch.step()
            elif name == "get_state":
                answer["state"] = batch.get_state(cmd["instance"])
            elif name == "set_state":
                batch.set_state(cmd["instance"], cmd["state"])
            reply(sock, ok=True, **answer)
        except Exception:
            reply(sock, **failure(name))


def main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    memory_fd = int(sys.argv[2])
    # The C++ side closing its end (or dying) ends the loop: no orphan.
    with sock.makefile("r", encoding="utf-8") as lines:
        serve(sock, memory_fd, lines)
    os._exit(0)


if __name__ == "__main__":
    main()
