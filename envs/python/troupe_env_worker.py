"""Steps a batch of Gymnasium environments for one troupe rl_actor.

Started by envs/python_env.cpp as `python -c <this file> <socket fd> <memory fd>`
(the file is compiled into troupe, so no path to it has to be found). The
C++ side sends one JSON line per command on the socket and waits for one
JSON line back; observations, actions, rewards and the episode flags pass
through the shared memory (a memfd) so that nothing per instance is encoded.

Commands: {"cmd": "make", ...} answers the spaces; {"cmd": "map", "bytes": N}
maps the memory; {"cmd": "reset", "seed": S} resets instance i with seed
S + i; {"cmd": "step"} steps every instance with the actions in the memory,
resetting an instance whose episode ended at once (its last observation goes
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


def make_envs(gym, cmd):
    if cmd.get("entry_point") and cmd["id"] not in gym.registry:
        gym.register(id=cmd["id"], entry_point=cmd["entry_point"])
    return [gym.make(cmd["id"], **cmd["kwargs"]) for _ in range(cmd["instances"])]


def float_box(np, gym, space):
    return isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)


def spaces_of(np, gym, env):
    """The spaces as the C++ side takes them, or why it cannot."""
    obs, act = env.observation_space, env.action_space
    out = {"ok": True, "observation_space": describe(obs), "action_space": describe(act)}
    if not float_box(np, gym, obs):
        return {"ok": False, "space": "observation", "error": describe(obs)}
    out["observation_size"] = int(np.prod(obs.shape))
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
            self.obs[i] = self.np.asarray(obs, dtype=self.np.float32).ravel()
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
            action = np.asarray(actions[i], np.float32) if box else actions[i][0] + start
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
        self.obs[:] = np.asarray(observations, dtype=np.float32).reshape(self.n, -1)
        self.reward[:] = rewards
        self.terminated[:] = terminations
        self.truncated[:] = truncations

    def end_episode(self, i, obs):
        self.final_obs[i] = self.np.asarray(obs, dtype=self.np.float32).ravel()
        self.episode_return[i], self.episode_length[i] = self.returns[i], self.lengths[i]
        self.returns[i], self.lengths[i] = 0, 0

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
