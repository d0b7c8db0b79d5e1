#!/usr/bin/env python3
"""PyTorch peers for troupe's actor/learner RL, on Gymnasium's own environments.

  pytorch_impala.py impala --env CartPole-v1 --seed 1 [options]
  pytorch_impala.py dqn    --env CartPole-v1 --seed 1 [options]

impala: the agent of examples/cartpole_impala.json written as a PyTorch user
who wants speed on a CPU would write it: one process, the envs stepped as one
vectorised Gymnasium env (its numpy vector implementation where it has one),
a shared MLP torso with policy and value heads, V-trace (rho and c clipped at
1), baseline and entropy costs, gradient clipping, Adam. Acting and learning
alternate in one loop, so the policy lag is 0 (a distributed IMPALA's actors
lag; this is the fastest a single process gets).

dqn: the agent of examples/cartpole_apex.json without the distribution: double
DQN with n-step returns and a target network, Ape-X's per-env epsilons
(eps_i = eps ** (1 + alpha * i / (N - 1))), a uniform replay buffer in numpy
(prioritised replay in Python would only make it slower), samples per insert
as in the example.

"Solved" is troupe's rule: the mean return of the last 100 finished episodes
reaches --target. Time runs from the first env step (imports, env and model
construction excluded). Prints one JSON line:
  {"bench": "pytorch_impala"|"pytorch_dqn", "env", "seed", "solved",
   "seconds", "env_steps", "env_steps_per_second", "threads", "torch"}
"""
import argparse
import collections
import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def make_envs(env_id, n, seed):
    """The env's numpy vector implementation where Gymnasium has one (CartPole:
    its autoreset is NEXT_STEP, the step after a finished episode only resets
    that env), else Gymnasium's sync vector env resetting in the same step.
    Returns (envs, first observations, kind, next_step)."""
    try:
        envs = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point")
        kind = "vector_entry_point"
    except Exception:  # no numpy vector implementation of this env
        same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        envs = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync",
                            vector_kwargs=same_step)
        kind = "sync"
    next_step = envs.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.NEXT_STEP
    obs, _ = envs.reset(seed=seed)
    return envs, obs, kind, next_step


class returns_window:
    """Per-env running returns; the mean of the last 100 finished episodes."""

    def __init__(self, n):
        self.running = np.zeros(n, dtype=np.float64)
        self.finished = collections.deque(maxlen=100)

    def add(self, rewards, done):
        self.running += rewards
        for i in np.nonzero(done)[0]:
            self.finished.append(self.running[i])
            self.running[i] = 0.0

    def solved(self, target):
        return len(self.finished) == 100 and np.mean(self.finished) >= target


def mlp_torso(obs_n, hidden, activation):
    layers, width = [], obs_n
    act = nn.Tanh if activation == "tanh" else nn.ReLU
    for h in hidden:
        layers += [nn.Linear(width, h), act()]
        width = h
    return nn.Sequential(*layers), width


class policy_value(nn.Module):
    def __init__(self, obs_n, actions, hidden, activation):
        super().__init__()
        self.torso, width = mlp_torso(obs_n, hidden, activation)
        self.policy = nn.Linear(width, actions)
        self.value = nn.Linear(width, 1)

    def forward(self, obs):
        h = self.torso(obs)
        return self.policy(h), self.value(h).squeeze(-1)


def vtrace_targets(behaviour_logp, target_logp, rewards, discounts, values, bootstrap):
    """V-trace (Espeholt et al. 2018) with rho and c clipped at 1; [T, N]."""
    rhos = torch.exp(target_logp - behaviour_logp).clamp(max=1.0)
    cs = rhos
    next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)], 0)
    deltas = rhos * (rewards + discounts * next_values - values)
    vs_minus_v = torch.zeros_like(bootstrap)
    out = []
    for t in reversed(range(values.shape[0])):
        vs_minus_v = deltas[t] + discounts[t] * cs[t] * vs_minus_v
        out.append(vs_minus_v)
    vs = torch.stack(out[::-1]) + values
    next_vs = torch.cat([vs[1:], bootstrap.unsqueeze(0)], 0)
    advantages = rhos * (rewards + discounts * next_vs - values)
    return vs, advantages


def collect_unroll(a, envs, obs, net, window, resetting, next_step):
    """T steps of every env under the current policy. A step that only resets
    an env (NEXT_STEP autoreset) is kept with mask 0."""
    T = a.unroll * a.batch_unrolls
    obs_l, act_l, logp_l, rew_l, disc_l, mask_l = [], [], [], [], [], []
    with torch.no_grad():
        for _ in range(T):
            o = torch.from_numpy(np.asarray(obs, dtype=np.float32))
            dist = torch.distributions.Categorical(logits=net(o)[0])
            act = dist.sample()
            obs, rew, term, trunc, _ = envs.step(act.numpy())
            done = term | trunc
            window.add(rew, done)
            obs_l.append(o)
            act_l.append(act)
            logp_l.append(dist.log_prob(act))
            rew_l.append(torch.as_tensor(rew, dtype=torch.float32))
            # A truncation ends the return like a termination here (troupe
            # bootstraps from the last state; CartPole rarely gets there first).
            disc_l.append(torch.as_tensor(a.discount * (1.0 - done), dtype=torch.float32))
            mask_l.append(torch.as_tensor(~resetting, dtype=torch.float32))
            resetting = done if next_step else np.zeros_like(done)
    batch = [torch.stack(x) for x in (obs_l, act_l, logp_l, rew_l, disc_l, mask_l)]
    return obs, resetting, batch


def impala_update(a, net, opt, last_obs, batch):
    o, act, behaviour_logp, rew, disc, mask = batch
    T, N = act.shape
    logits, values = net(o.reshape(T * N, -1))
    logits, values = logits.reshape(T, N, -1), values.reshape(T, N)
    with torch.no_grad():
        _, bootstrap = net(torch.from_numpy(np.asarray(last_obs, dtype=np.float32)))
    logp_all = F.log_softmax(logits, -1)
    target_logp = logp_all.gather(-1, act.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        vs, adv = vtrace_targets(behaviour_logp, target_logp, rew, disc, values, bootstrap)
    policy_loss = -(mask * target_logp * adv).sum()
    baseline_loss = 0.5 * (mask * (vs - values) ** 2).sum()
    entropy = -(mask.unsqueeze(-1) * logp_all.exp() * logp_all).sum()
    loss = policy_loss + a.baseline_cost * baseline_loss - a.entropy_cost * entropy
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), a.grad_clip)
    opt.step()


def run_impala(a):
    envs, obs, kind, next_step = make_envs(a.env, a.envs, a.seed)
    net = policy_value(envs.single_observation_space.shape[0], envs.single_action_space.n,
                       a.hidden, a.activation)
    opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    window = returns_window(a.envs)
    resetting = np.zeros(a.envs, dtype=bool)
    steps, start = 0, time.perf_counter()
    while steps < a.max_env_steps:
        obs, resetting, batch = collect_unroll(a, envs, obs, net, window, resetting, next_step)
        steps += a.unroll * a.batch_unrolls * a.envs
        if window.solved(a.target):
            break
        impala_update(a, net, opt, obs, batch)
    return window, steps, time.perf_counter() - start, kind


class q_network(nn.Module):
    def __init__(self, obs_n, actions, hidden, activation):
        super().__init__()
        self.torso, width = mlp_torso(obs_n, hidden, activation)
        self.q = nn.Linear(width, actions)

    def forward(self, obs):
        return self.q(self.torso(obs))


class uniform_replay:
    def __init__(self, capacity, obs_n):
        self.obs = np.zeros((capacity, obs_n), np.float32)
        self.next_obs = np.zeros((capacity, obs_n), np.float32)
        self.act = np.zeros(capacity, np.int64)
        self.ret = np.zeros(capacity, np.float32)
        self.disc = np.zeros(capacity, np.float32)
        self.size, self.pos, self.capacity = 0, 0, capacity

    def add(self, obs, act, ret, disc, next_obs):
        n = len(act)
        idx = (self.pos + np.arange(n)) % self.capacity
        self.obs[idx], self.act[idx], self.ret[idx] = obs, act, ret
        self.disc[idx], self.next_obs[idx] = disc, next_obs
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, rng, batch):
        i = rng.integers(0, self.size, batch)
        return (torch.from_numpy(self.obs[i]), torch.from_numpy(self.act[i]),
                torch.from_numpy(self.ret[i]), torch.from_numpy(self.disc[i]),
                torch.from_numpy(self.next_obs[i]))


class n_step_buffer:
    """Per-env windows of the last n steps; emits (s_t, a_t, R_t^(n), gamma^k, s_{t+k})."""

    def __init__(self, n, discount):
        self.n, self.discount = n, discount
        self.window = collections.deque()

    def push(self, obs, act, rew, done, next_obs, valid):
        """valid: False for a step that only reset its env (NEXT_STEP);
        such a step ends windows and starts none."""
        self.window.append((obs, act, rew, done | ~valid, next_obs, valid))
        if len(self.window) < self.n:
            return None
        obs0, act0, valid0 = self.window[0][0], self.window[0][1], self.window[0][5]
        ret = np.zeros(len(act0), np.float32)
        disc = np.ones(len(act0), np.float32)
        alive = np.ones(len(act0), bool)
        last = next_obs.copy()
        for (_, _, r, d, nx, _) in self.window:
            ret += np.where(alive, disc * r, 0.0)
            disc = np.where(alive, disc * self.discount, disc)
            ended = alive & d
            last[ended] = nx[ended]
            alive &= ~d
        self.window.popleft()
        # disc is 0 where the episode ended inside the window: no bootstrap.
        keep = valid0
        return (obs0[keep], act0[keep], ret[keep],
                np.where(alive, disc, 0.0).astype(np.float32)[keep], last[keep])


def run_dqn(a):
    envs, obs, kind, next_step = make_envs(a.env, a.envs, a.seed)
    resetting = np.zeros(a.envs, dtype=bool)
    obs_n, actions = envs.single_observation_space.shape[0], envs.single_action_space.n
    q = q_network(obs_n, actions, a.hidden, a.activation)
    target = q_network(obs_n, actions, a.hidden, a.activation)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=a.lr)
    rng = np.random.default_rng(a.seed)
    eps = a.epsilon ** (1 + a.epsilon_alpha * np.arange(a.envs) / max(1, a.envs - 1))
    replay, nstep = uniform_replay(a.capacity, obs_n), n_step_buffer(a.n_step, a.discount)
    window = returns_window(a.envs)
    steps, updates, credit, start = 0, 0, 0.0, time.perf_counter()
    while steps < a.max_env_steps:
        o = np.asarray(obs, dtype=np.float32)
        with torch.no_grad():
            greedy = q(torch.from_numpy(o)).argmax(-1).numpy()
        explore = rng.random(a.envs) < eps
        act = np.where(explore, rng.integers(0, actions, a.envs), greedy)
        obs, rew, term, trunc, info = envs.step(act)
        done = term | trunc
        window.add(rew, done)
        steps += a.envs
        if window.solved(a.target):
            break
        # SAME_STEP autoreset: the finished episode's last observation is in
        # info; NEXT_STEP: it is the one returned, and the next step resets.
        next_o = np.asarray(obs, dtype=np.float32).copy()
        if done.any() and "final_obs" in info:
            for i in np.nonzero(done)[0]:
                next_o[i] = info["final_obs"][i]
        # A truncation is not a terminal state, but n-step windows end there.
        out = nstep.push(o, act, rew.astype(np.float32), done, next_o, ~resetting)
        resetting = done if next_step else np.zeros_like(done)
        if out is not None and len(out[1]):
            replay.add(*out)
        if replay.size < a.min_size:
            continue
        credit += a.envs * a.samples_per_insert / a.batch_size
        while credit >= 1.0:
            credit -= 1.0
            s, at, r, d, s2 = replay.sample(rng, a.batch_size)
            with torch.no_grad():
                best = q(s2).argmax(-1, keepdim=True)
                y = r + d * target(s2).gather(-1, best).squeeze(-1)
            qa = q(s).gather(-1, at.unsqueeze(-1)).squeeze(-1)
            loss = F.smooth_l1_loss(qa, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), a.grad_clip)
            opt.step()
            updates += 1
            if updates % a.target_every == 0:
                target.load_state_dict(q.state_dict())
    return window, steps, time.perf_counter() - start, kind


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("algorithm", choices=["impala", "dqn"])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--max-env-steps", type=int, default=5_000_000)
    p.add_argument("--envs", type=int, default=32)
    p.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[64, 64])
    p.add_argument("--activation", choices=["tanh", "relu"], default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--discount", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=None)
    # impala (examples/cartpole_impala.json: 2 actors x 16 envs, unroll 5, 2 unrolls a batch)
    p.add_argument("--unroll", type=int, default=5)
    p.add_argument("--batch-unrolls", type=int, default=1)
    p.add_argument("--baseline-cost", type=float, default=0.5)
    p.add_argument("--entropy-cost", type=float, default=0.001)
    # dqn (examples/cartpole_apex.json)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--capacity", type=int, default=50_000)
    p.add_argument("--min-size", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples-per-insert", type=float, default=4.0)
    p.add_argument("--target-every", type=int, default=200)
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--epsilon-alpha", type=float, default=7.0)
    a = p.parse_args()
    dqn = a.algorithm == "dqn"
    a.activation = a.activation or ("relu" if dqn else "tanh")
    a.lr = a.lr or (5e-4 if dqn else 3e-3)
    a.grad_clip = a.grad_clip or (10.0 if dqn else 40.0)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    window, steps, seconds, kind = (run_dqn if dqn else run_impala)(a)
    solved = window.solved(a.target)
    print(json.dumps({"bench": "pytorch_" + a.algorithm, "env": a.env, "seed": a.seed,
                      "solved": bool(solved), "seconds": round(seconds, 3), "env_steps": steps,
                      "env_steps_per_second": round(steps / seconds),
                      "mean_last_100": float(np.mean(window.finished)) if window.finished else None,
                      "threads": a.threads, "vector_env": kind, "torch": torch.__version__}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
