"""Plays a policy exported by `experiment.py --mode=export` with tensorflow, gymnasium and numpy
alone (ale_py too for Atari): none of this project's modules, so the exported folder and this file
are all a user needs to take away.

    python sandbox/play_policy.py results/<run>/exported --episodes=10 --deterministic

It makes the env as policy.json's `env_wrappers` say, seeds it once (the first reset and the
action space; later episodes follow from there, as --mode=test's env does), and prints each
episode's return and the mean. The default --seed is policy.json's `test_mode_seed`, the seed of
--mode=test's env for that run (its --seed + 12345), so that --deterministic replays the
episodes --mode=test plays with --eval_policy=greedy (its default outside Atari). Atari games are
played as the run's Python backend plays them (gymnasium's AtariPreprocessing and frame stack);
--mode=test plays them through ale-py's native vector env by default, whose new games start
differently (envs/batch.py), so Atari returns are comparable, not equal.
"""
import argparse
import importlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: its start-up lines stay out

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


class PressFire(gym.Wrapper):
    """FIRE then UP after a reset and after each lost life but the last, for games that stand
    still until FIRE (Breakout): as the run's evaluation envs press them."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, _ = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lost_life = 0 < self.env.unwrapped.ale.lives() < self._lives
        for fire in (1, 2):
            if not lost_life or terminated or truncated:
                break
            obs, more, terminated, truncated, info = self.env.step(fire)
            reward += more
        self._lives = self.env.unwrapped.ale.lives()
        return obs, reward, terminated, truncated, info


def make_env(info):
    """The env, wrapped as policy.json's env_wrappers say (Atari, or gymnasium.make alone)."""
    steps = {w["wrapper"]: w["kwargs"] for w in info["env_wrappers"]}
    for name in info.get("env_module", []):  # the user's modules that register the env id
        importlib.import_module(name)
    if "gymnasium.wrappers.AtariPreprocessing" not in steps:
        return gym.make(info["env_id"])
    import ale_py
    gym.register_envs(ale_py)
    env = gym.make(info["env_id"], **steps["gymnasium.make"])
    kwargs = dict(steps["gymnasium.wrappers.AtariPreprocessing"])
    if isinstance(kwargs["screen_size"], list):
        kwargs["screen_size"] = tuple(kwargs["screen_size"])
    env = gym.wrappers.AtariPreprocessing(env, **kwargs)
    meanings = env.unwrapped.get_action_meanings()
    if len(meanings) >= 3 and meanings[1] == "FIRE":
        env = PressFire(env)
    env = gym.wrappers.FrameStackObservation(env, **steps["gymnasium.wrappers.FrameStackObservation"])
    space = gym.spaces.Box(0, 255, tuple(info["observation"]["shape"]), np.uint8)  # [H, W, stack]
    return gym.wrappers.TransformObservation(env, lambda o: np.ascontiguousarray(np.moveaxis(o, 0, -1)), space)


def load(export_dir):
    """(policy.json's content, the serving function, initial_state or None, seconds to load)."""
    with open(os.path.join(export_dir, "policy.json")) as f:
        info = json.load(f)
    start = time.time()
    model = tf.saved_model.load(export_dir)
    serve = model.signatures["serving_default"]
    initial = model.signatures["initial_state"] if info["recurrent"] else None
    serve(**_inputs(info, np.zeros([1] + info["observation"]["shape"], info["observation"]["dtype"]),
                    True, True, _state(initial)))  # the first call's tracing counts as loading
    return info, serve, initial, time.time() - start


def _state(initial):
    return {} if initial is None else initial(batch_size=tf.constant(1, tf.int32))


def _inputs(info, obs, first, deterministic, state):
    inputs = {"observation": tf.constant(obs[None] if obs.ndim == len(info["observation"]["shape"]) else obs),
              "deterministic": tf.constant(deterministic)}
    if info["recurrent"]:
        inputs.update(state, first=tf.constant([first]))
    return inputs


def play(info, serve, initial, env, episodes, deterministic, seed):
    """(returns, lengths) of `episodes` whole episodes, the first from reset(seed=seed), the others
    from plain resets (the env's own randomness, seeded once), as --mode=test plays them."""
    returns, lengths = [], []
    discrete = info["action_space"]["type"] == "Discrete"
    obs_dtype = np.dtype(info["observation"]["dtype"])
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        if returns:
            obs, _ = env.reset()
        state, first, ret, length, done = _state(initial), True, 0.0, 0, False
        while not done:
            out = serve(**_inputs(info, np.asarray(obs, obs_dtype), first, deterministic, state))
            state = {k: v for k, v in out.items() if k not in ("action", "value")}
            action = out["action"].numpy()[0]
            obs, reward, terminated, truncated, _ = env.step(int(action) if discrete else action)
            ret, length, first, done = ret + float(reward), length + 1, False, terminated or truncated
        returns.append(ret)
        lengths.append(length)
        print("episode %d/%d: return %.1f, length %d" % (len(returns), episodes, ret, length), flush=True)
    return returns, lengths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", help="a folder written by experiment.py --mode=export")
    parser.add_argument("--episodes", type=int, default=10, help="whole episodes to play")
    parser.add_argument("--seed", type=int, default=None, help="the env's seed (default: policy.json's test_mode_seed)")
    parser.add_argument("--deterministic", action="store_true", help="the policy's mode (argmax, a Gaussian's "
                        "mean) instead of a sample")
    parser.add_argument("--json", default=None, help="also write the returns and lengths to this file")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.export_dir, "policy.json")):
        print("play_policy.py: error: %s has no policy.json; give a folder written by experiment.py --mode=export"
              % args.export_dir, file=sys.stderr)
        return 2
    info, serve, initial, load_s = load(args.export_dir)
    print("loaded %s (%s, %s) in %.2f s" % (args.export_dir, info["agent_name"], info["env_id"], load_s), flush=True)
    seed = info.get("test_mode_seed", 0) if args.seed is None else args.seed
    env = make_env(info)
    returns, lengths = play(info, serve, initial, env, args.episodes, args.deterministic, seed)
    env.close()
    print("mean return %.2f +- %.2f over %d episodes (%s, seed %d)" % (
        np.mean(returns), np.std(returns), len(returns), "deterministic" if args.deterministic else "sampled", seed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"returns": returns, "lengths": lengths, "mean_return": float(np.mean(returns)),
                       "seed": seed, "deterministic": args.deterministic, "load_seconds": load_s}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
