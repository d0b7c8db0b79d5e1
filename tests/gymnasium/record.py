"""Records Gymnasium's own trajectories for tests/test_envs_control.cpp.

    python3 tests/gymnasium/record.py > tests/gymnasium/classic_control.txt

(Gymnasium 1.4.0 with NumPy 2.4.6 wrote the file in the repository.) For
each environment, a few episodes from Gymnasium's own reset of random
actions, out-of-bounds Box actions included; an episode is a line
"name steps start-state..." and then a line per step "action reward
terminated state...", numbers as Python's repr of doubles.
"""
import gymnasium as gym
import numpy as np

ENVS = [  # name, Box actions, range of the random actions
    ("Pendulum-v1", True, -3.0, 3.0),
    ("MountainCarContinuous-v0", True, -1.6, 1.6),
    ("MountainCar-v0", False, 0, 3),
]


def main():
    rng = np.random.default_rng(0)
    for name, box, lo, hi in ENVS:
        env = gym.make(name).unwrapped
        for _ in range(4):
            env.reset(seed=int(rng.integers(1 << 30)))
            start = [repr(float(x)) for x in env.state]
            rows = []
            for _ in range(100):
                if box:
                    action = np.array([rng.uniform(lo, hi)], dtype=np.float32)
                    shown = float(action[0])
                else:
                    action = int(rng.integers(0, 3))
                    shown = float(action)
                _, reward, terminated, _, _ = env.step(action)
                state = [repr(float(x)) for x in np.asarray(env.state, dtype=np.float64)]
                rows.append(f"{shown!r} {float(reward)!r} {int(terminated)} {' '.join(state)}")
                if terminated:
                    break
            print(name, len(rows), " ".join(start))
            print("\n".join(rows))


if __name__ == "__main__":
    main()
