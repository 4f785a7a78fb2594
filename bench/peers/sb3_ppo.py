"""Stable-Baselines3 PPO, the peer users would pick instead. Runs in .peer-venv-sb3
(bench/peers/install.sh sb3), never in .venv. Uses this project's envs package, so the
observations, frame skip and episode statistics are exactly those our IMPALA sees.

  throughput: PongNoFrameskip-v4 with SubprocVecEnv (--n_envs processes), a CNN of the
              same size as our SimpleConvNetAgent (conv 16 8x8/4, conv 32 4x4/2, FC 256),
              SB3's Atari PPO settings (n_steps 128, batch 256, 4 epochs, lr 2.5e-4,
              clip 0.1); trains for --seconds and reports frames/s (4 frames per step)
              after the first rollout.
  cartpole:   CartPole-v1 with SB3-zoo's tuned PPO (8 envs, n_steps 32, batch 256,
              gae 0.8, gamma 0.98, 20 epochs, lr 1e-3 linear, clip 0.2 linear,
              ent 0.0); wall-clock seconds until the mean return of the last 20
              episodes >= --threshold, or --budget_s.
  halfcheetah, hopper: HalfCheetah-v5 or Hopper-v5 with rl-baselines3-zoo's tuned PPO for
              its -v3 (hyperparams/ppo.yml; ZOO below: 1 env, n_steps 512, VecNormalize of
              observations and rewards, log_std_init -2, no ortho init, pi/vf [256, 256] ReLU,
              and each task's own batch, epochs, gamma, lambda, rates and clips); trains for
              --total_steps or --budget_s and writes every finished training episode (steps,
              seconds, raw return) to --curve.

Prints one JSON line with the result.
"""
import time
T_LAUNCH = time.time()  # before the imports: "from launch" includes loading torch and SB3

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# .peer-venv-sb3 does not have this project installed: the checkout's root on the path gives it our envs package.
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.logger import Logger  # noqa: E402
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor  # noqa: E402
from stable_baselines3.common.vec_env import (DummyVecEnv, SubprocVecEnv, VecNormalize,  # noqa: E402
                                              VecTransposeImage)

import envs  # noqa: E402


class SimpleConv(BaseFeaturesExtractor):
    """The same torso as nets/conv.py's SimpleConvTorso, in torch (channels first)."""

    def __init__(self, observation_space, features_dim=256):
        super().__init__(observation_space, features_dim)
        c = observation_space.shape[0]
        self.net = nn.Sequential(nn.Conv2d(c, 16, 8, 4), nn.ReLU(), nn.Conv2d(16, 32, 4, 2), nn.ReLU(),
                                 nn.Flatten())
        with torch.no_grad():
            n = self.net(torch.zeros((1,) + observation_space.shape)).shape[1]
        self.linear = nn.Sequential(nn.Linear(n, features_dim), nn.ReLU())

    def forward(self, x):
        return self.linear(self.net(x))


class Episodes(BaseCallback):
    """Collects finished episodes from our envs' info["episode"] and stops on a condition."""

    def __init__(self, threshold=None, deadline=None, warmup_steps=0):
        super().__init__()
        self.returns, self.threshold, self.deadline = [], threshold, deadline
        self.t_start = time.time()
        self.hit_s = None
        self.hit_from_launch_s = None
        self.warmup_steps = warmup_steps
        self.t_warm = None
        self.steps_warm = 0

    def _on_step(self):
        for info in self.locals["infos"]:
            ep = info.get("episode")
            if ep is not None:
                self.returns.append(float(np.asarray(ep["r"])))
        if self.t_warm is None and self.num_timesteps >= self.warmup_steps:
            self.t_warm, self.steps_warm = time.time(), self.num_timesteps
        if self.threshold is not None and len(self.returns) >= 20 and np.mean(self.returns[-20:]) >= self.threshold:
            self.hit_s = time.time() - self.t_start
            self.hit_from_launch_s = time.time() - T_LAUNCH
            return False
        return self.deadline is None or time.time() < self.deadline


def make(level, seed, training=True):
    def thunk():
        env = envs.make_env(level, seed=seed, training=training)
        return env
    return thunk


def throughput(a):
    vec = SubprocVecEnv([make(a.level, a.seed * 1000 + i) for i in range(a.n_envs)], start_method="spawn")
    vec = VecTransposeImage(vec)
    model = PPO("CnnPolicy", vec, n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4,
                clip_range=0.1, ent_coef=0.01, vf_coef=0.5, seed=a.seed, device="cpu", verbose=0,
                policy_kwargs=dict(features_extractor_class=SimpleConv, normalize_images=True))
    model.set_logger(Logger(folder=None, output_formats=[]))  # no log folder in /tmp
    cb = Episodes(deadline=time.time() + a.seconds, warmup_steps=128 * a.n_envs)
    model.learn(total_timesteps=10 ** 9, callback=cb)
    steps = model.num_timesteps - cb.steps_warm
    seconds = time.time() - cb.t_warm
    vec.close()
    return {"peer": "sb3_ppo", "suite": "throughput", "level": a.level, "n_envs": a.n_envs,
            "frames_per_s": 4 * steps / seconds, "steps": int(model.num_timesteps), "seconds": seconds,
            "episodes": len(cb.returns), "torch_threads": a.torch_threads}


def cartpole(a):
    vec = DummyVecEnv([make("CartPole-v1", a.seed * 1000 + i) for i in range(8)])
    model = PPO("MlpPolicy", vec, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lambda f: 1e-3 * f, clip_range=lambda f: 0.2 * f,
                seed=a.seed, device="cpu", verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))
    t0 = time.time()
    cb = Episodes(threshold=a.threshold, deadline=t0 + a.budget_s)
    model.learn(total_timesteps=a.total_steps, callback=cb)
    vec.close()
    return {"peer": "sb3_ppo", "suite": "cartpole", "seed": a.seed, "reached": cb.hit_s is not None,
            "time_to_threshold_s": cb.hit_s if cb.hit_s is not None else float("nan"),
            "from_launch_s": cb.hit_from_launch_s if cb.hit_s is not None else float("nan"),
            "steps": int(model.num_timesteps),
            "best_mean_return_20": max((float(np.mean(cb.returns[max(0, i - 19):i + 1]))
                                        for i in range(19, len(cb.returns))), default=float("nan"))}


class EpisodeCurve(BaseCallback):
    """Every finished episode's (env steps, seconds since training began, raw return)."""

    def __init__(self, deadline):
        super().__init__()
        self.rows, self.deadline, self.t_start = [], deadline, time.time()

    def _on_step(self):
        for info in self.locals["infos"]:
            ep = info.get("episode")
            if ep is not None:
                self.rows.append((self.num_timesteps, time.time() - self.t_start, float(np.asarray(ep["r"]))))
        return time.time() < self.deadline


# rl-baselines3-zoo's hyperparams/ppo.yml, HalfCheetah-v3 and Hopper-v3 (its tuned entries).
ZOO = {
    "halfcheetah": ("HalfCheetah-v5", dict(batch_size=64, n_epochs=20, gamma=0.98, gae_lambda=0.92,
                                           learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
                                           max_grad_norm=0.8, vf_coef=0.58096)),
    "hopper": ("Hopper-v5", dict(batch_size=32, n_epochs=5, gamma=0.999, gae_lambda=0.99,
                                 learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
                                 max_grad_norm=0.7, vf_coef=0.835671)),
}


def zoo(a):
    level, recipe = ZOO[a.suite]
    vec = VecNormalize(DummyVecEnv([make(level, a.seed)]), gamma=recipe["gamma"])
    model = PPO("MlpPolicy", vec, n_steps=512, seed=a.seed, device="cpu", verbose=0,
                policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                                   net_arch=dict(pi=[256, 256], vf=[256, 256])), **recipe)
    model.set_logger(Logger(folder=None, output_formats=[]))
    t0 = time.time()
    cb = EpisodeCurve(deadline=t0 + a.budget_s)
    model.learn(total_timesteps=a.total_steps, callback=cb)
    seconds = time.time() - t0
    vec.close()
    with open(a.curve, "w") as f:
        f.write("episode,steps,time_s,return\n")
        for i, (steps, t, r) in enumerate(cb.rows):
            f.write("%d,%d,%.3f,%.3f\n" % (i + 1, steps, t, r))
    return {"peer": "sb3_ppo", "suite": a.suite, "level": level, "seed": a.seed, "steps": int(model.num_timesteps),
            "seconds": seconds, "episodes": len(cb.rows), "curve": a.curve}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=["throughput", "cartpole"] + sorted(ZOO))
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--n_envs", type=int, default=16)
    p.add_argument("--seconds", type=float, default=90)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threshold", type=float, default=475)
    p.add_argument("--budget_s", type=float, default=300)
    p.add_argument("--total_steps", type=int, default=2_000_000)
    p.add_argument("--curve", default="sb3_mujoco_curve.csv", help="halfcheetah, hopper: where the episodes go")
    p.add_argument("--torch_threads", type=int, default=0, help="0: torch's default (all cores)")
    a = p.parse_args()
    if a.torch_threads:
        torch.set_num_threads(a.torch_threads)
    out = {"throughput": throughput, "cartpole": cartpole}.get(a.suite, zoo)(a)
    out.update(torch=torch.__version__, sb3=__import__("stable_baselines3").__version__)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
