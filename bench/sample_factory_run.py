#!/usr/bin/env python3
"""Sample Factory's APPO on troupe's benchmark environments; one JSON line.

    sample_factory_run.py cartpole --seed S [--target 475] [--max-env-steps N]
                                   [--timeout S]
    sample_factory_run.py pong --env-steps N [--setup appo|atari] [--seed S]

Run with the private venv's python (bench/compare_sf.sh fills it): Sample
Factory 2.1.1, torch, gymnasium 0.29.1; Pong also needs gymnasium 1.x and
ale-py 0.12 (ROMs bundled) first on PYTHONPATH, since ale-py 0.8 (the last for
gymnasium 0.29) finds its ROMs only through AutoROM's download.

cartpole: SF's own CartPole-v1 example (sf_examples/train_gym_env.py: APPO,
no RNN, 20 envs a worker, batch 512, reward scale 0.1, no V-trace) with 2
rollout workers and 1 policy worker on the CPU. Solved when the mean return
of the last 100 finished episodes, read from the runner's own episodic stats
messages (each episode's summed reward, as its `Avg episode reward` line
averages them), reaches the target; the run stops there. `seconds` counts
from runner.run() (SF's processes starting included, as troupe's time counts
building its actors); `seconds_from_first_step` from the first samples.
env steps are SF's samples collected (agent steps, frameskip 1).

pong: ALE/Pong-v5 through the same wrappers as examples/pong_impala.json
(frameskip 1, sticky actions 0.25, AtariPreprocessing, which skips 4 frames,
FrameStackObservation 4) under SF's Nature CNN (`convnet_atari`). --setup
appo: APPO with V-trace, one pass over each batch (IMPALA's update, as
troupe's); --setup atari: SF's own Atari defaults (sf_examples/atari:
synchronous PPO, 4 epochs of 4 minibatches, 2 rollout workers x 4 envs in
place of its 8 x 1). appo: 2 rollout workers x 8 envs (troupe's 2 actors x 8)
split in 2 for double-buffered sampling.
Runs until the learner has consumed N env steps; prints env steps/s and
frames/s (env steps x 4) over the whole run from runner.run() (as troupe's
summary does) and over the steady part (from the first samples).
"""

import argparse
import json
import sys
import tempfile
import time
from collections import deque

import gymnasium as gym
from sample_factory.algo.utils.misc import EPISODIC, SAMPLES_COLLECTED
from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
from sample_factory.envs.env_utils import register_env
from sample_factory.train import make_runner

CARTPOLE_ARGS = [
    "--env=CartPole-v1", "--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20",
    "--recurrence=1", "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1",
    "--num_workers=2", "--policy_workers_per_policy=1",
]
PONG_COMMON_ARGS = [
    "--env=troupe_pong", "--algo=APPO", "--use_rnn=False",
    "--encoder_conv_architecture=convnet_atari", "--obs_scale=255.0", "--gamma=0.99",
    "--env_frameskip=4", "--env_framestack=4", "--nonlinearity=relu", "--num_workers=2",
    "--policy_workers_per_policy=1",
]
PONG_SETUPS = {
    # IMPALA's update, as troupe's pong_impala.json: V-trace, one pass, lr 3e-4,
    # entropy 0.01, grad clip 40, baseline cost 0.5.
    # (SF's V-trace wants recurrence = rollout, also without an RNN.)
    "appo": ["--num_envs_per_worker=8", "--worker_num_splits=2", "--with_vtrace=True", "--recurrence=32", "--num_epochs=1", "--num_batches_per_epoch=1",
             "--rollout=32", "--batch_size=512", "--learning_rate=0.0003",
             "--exploration_loss_coeff=0.01", "--max_grad_norm=40", "--value_loss_coeff=0.5",
             "--async_rl=True", "--normalize_input=False", "--normalize_returns=False"],
    # sf_examples/atari/atari_params.py's defaults, its 8 workers x 1 env as
    # 2 x 4: synchronous mode wants the 2 x 4 x 128 samples a rollout to equal
    # the 4 x 256 of a training iteration.
    "atari": ["--num_envs_per_worker=4", "--worker_num_splits=1", "--with_vtrace=False", "--recurrence=1", "--num_epochs=4", "--num_batches_per_epoch=4",
              "--rollout=128", "--batch_size=256", "--learning_rate=0.00025",
              "--exploration_loss_coeff=0.01", "--max_grad_norm=0.5", "--ppo_clip_ratio=0.1",
              "--value_loss_coeff=0.5", "--gae_lambda=0.95", "--async_rl=False",
              "--normalize_input=True", "--normalize_returns=True", "--adam_eps=1e-5"],
}


def patch_vtrace_summaries():
    """SF 2.1.1's learner records the minibatch's GAE advantages in its
    summaries, which V-trace never computes (AttributeError: 'AttrDict' object
    has no attribute 'advantages', and the learner process dies); give it the
    rewards in their place: only SF's tensorboard summary adv_min/adv_max read
    them. Runs at import, so also in SF's spawned learner process."""
    from sample_factory.algo.learning.learner import Learner

    record = Learner._record_summaries

    def record_with_advantages(self, var):
        if "advantages" not in var.mb:
            var.mb["advantages"] = var.mb["rewards"]
        return record(self, var)

    Learner._record_summaries = record_with_advantages


patch_vtrace_summaries()


def make_cartpole(full_env_name, cfg=None, env_config=None, render_mode=None):
    return gym.make(full_env_name, render_mode=render_mode)


def make_pong(full_env_name, cfg=None, env_config=None, render_mode=None):
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.25,
                   render_mode=render_mode)
    env = gym.wrappers.AtariPreprocessing(env)
    return gym.wrappers.FrameStackObservation(env, 4)


class Watch:
    """Episode returns and samples as the runner's messages bring them."""

    def __init__(self, target):
        self.target = target
        self.returns = deque(maxlen=100)
        self.samples = 0
        self.t_run = self.t_first = self.t_solved = None
        self.steps_solved = None

    def on_samples(self, runner, msg, policy_id):
        if self.t_first is None:
            self.t_first = time.time()
        self.samples += msg[SAMPLES_COLLECTED]

    def on_episode(self, runner, msg, policy_id):
        self.returns.append(float(msg[EPISODIC]["reward"]))
        if (self.target is None or self.t_solved is not None or len(self.returns) < 100
                or sum(self.returns) / 100 < self.target):
            return
        self.t_solved, self.steps_solved = time.time(), self.samples
        runner._stop_training()  # SF's own stop path, as at train_for_env_steps


def run_sf(argv, watch):
    parser, _ = parse_sf_args(argv=argv)
    cfg = parse_full_cfg(parser, argv)
    cfg, runner = make_runner(cfg)
    runner.policy_msg_handlers[SAMPLES_COLLECTED].append(watch.on_samples)
    runner.register_episodic_stats_handler(watch.on_episode)
    if runner.init() != 0:
        raise RuntimeError("sample factory: runner.init() failed")
    watch.t_run = time.time()
    runner.run()
    return time.time()


def common_args(train_dir, seed):
    return [f"--train_dir={train_dir}", "--experiment=run", f"--seed={seed}", "--device=cpu",
            "--save_every_sec=100000", "--save_best_every_sec=100000",
            "--experiment_summaries_interval=100000", "--restart_behavior=overwrite"]


def cartpole(a, train_dir):
    register_env("CartPole-v1", make_cartpole)
    w = Watch(a.target)
    argv = CARTPOLE_ARGS + common_args(train_dir, a.seed) + [
        f"--train_for_env_steps={a.max_env_steps}", f"--train_for_seconds={int(a.timeout)}"]
    t_end = run_sf(argv, w)
    solved = w.t_solved is not None
    t = w.t_solved if solved else t_end
    return {"seed": a.seed, "solved": solved, "seconds": t - w.t_run,
            "seconds_from_first_step": t - (w.t_first or w.t_run),
            "env_steps": w.steps_solved if solved else w.samples,
            "env_steps_per_second": (w.steps_solved if solved else w.samples) / (t - w.t_run),
            "mean_return_100": sum(w.returns) / max(len(w.returns), 1)}


def pong(a, train_dir):
    register_env("troupe_pong", make_pong)
    w = Watch(None)
    # SF counts the learner's env steps in frames (x env_frameskip).
    argv = PONG_COMMON_ARGS + PONG_SETUPS[a.setup] + common_args(train_dir, a.seed) + [
        f"--train_for_env_steps={a.env_steps * 4}"]
    t_end = run_sf(argv, w)
    whole, steady = t_end - w.t_run, t_end - (w.t_first or w.t_run)
    return {"setup": a.setup, "seed": a.seed, "env_steps": w.samples, "seconds": whole,
            "env_steps_per_second": w.samples / whole,
            "frames_per_second": 4 * w.samples / whole,
            "steady_frames_per_second": 4 * w.samples / steady,
            "episodes": len(w.returns),
            "mean_return_100": sum(w.returns) / max(len(w.returns), 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["cartpole", "pong"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--max-env-steps", type=int, default=5_000_000)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--env-steps", type=int, default=20_000)
    p.add_argument("--setup", choices=sorted(PONG_SETUPS), default="appo")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-sf-") as train_dir:
        r = (cartpole if a.what == "cartpole" else pong)(a, train_dir)
    r["side"] = "sample_factory"
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
