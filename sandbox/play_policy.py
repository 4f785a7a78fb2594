"""Plays a policy exported by `experiment.py --mode=export` or WALL-E's `ppo_main.py --mode=export`
with tensorflow, gymnasium and numpy alone (ale_py too for Atari): none of this project's modules,
so the exported folder and this file are all a user needs to take away.

    python sandbox/play_policy.py results/<run>/exported --episodes=10 --deterministic

It makes the env as policy.json's `env_wrappers` say, seeds it once (the first reset and the
action space; later episodes follow from there, as --mode=test's env does; WALL-E's --mode=test
resets episode i with seed + i, and so does this where policy.json says so), and prints each
episode's return and the mean. The default --seed is policy.json's `test_mode_seed`, the seed of
--mode=test's env for that run (its --seed + 12345; WALL-E's --seed + 10000), so that
--deterministic replays the episodes --mode=test plays with --eval_policy=greedy (its default
outside Atari; WALL-E's --mode=test always plays the policy's mean). Atari games are
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


def make_env(info, render_mode=None):
    """The env, wrapped as policy.json's env_wrappers say (Atari, or gymnasium.make alone);
    render_mode: gymnasium's (rgb_array for --video_dir), only where given."""
    shown = {} if render_mode is None else {"render_mode": render_mode}
    steps = {w["wrapper"]: w["kwargs"] for w in info["env_wrappers"]}
    for name in info.get("env_module", []):  # the user's modules that register the env id
        importlib.import_module(name)
    if "gymnasium.wrappers.AtariPreprocessing" not in steps:
        return gym.make(info["env_id"], **shown)
    import ale_py
    gym.register_envs(ale_py)
    env = gym.make(info["env_id"], **dict(steps["gymnasium.make"], **shown))
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


class VideoError(Exception):
    """The env cannot show its screen for --video_dir."""


class EpisodeVideos(gym.Wrapper):
    """--video_dir: each episode as folder/episode_001.mp4, ..., as experiment.py --mode=test writes
    them: frame i is the screen the policy acted on at the episode's step i, so a video has as many
    frames as the episode's length; one screen per agent step (Atari: 4 emulator frames, so 15 fps,
    the game's speed). Frames go to ffmpeg as they come, under a hidden name renamed at the
    episode's end, so a Ctrl-C leaves no half-written file of a finished one's name."""

    def __init__(self, env, folder, fps):
        super().__init__(env)
        self.folder, self.fps, self.count, self._writer, self._tmp = folder, fps, 0, None, None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._abort()
        self.count += 1
        self._tmp = os.path.join(self.folder, ".episode_%03d.part.mp4" % self.count)
        self._frames, self._t0 = 0, time.time()
        self._add()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            self._finish()  # the screen after the last step: no action follows it
        else:
            self._add()
        return obs, reward, terminated, truncated, info

    def _add(self):
        try:
            frame = np.asarray(self.env.render(), np.uint8)
        except Exception as e:  # e.g. MuJoCo without an OpenGL context on a headless machine
            raise VideoError("%s cannot render on this machine (%s: %s)"
                             % (self.env.spec.id if self.env.spec else "the env", type(e).__name__, e))
        h, w = frame.shape[:2]  # libx264's yuv420p needs an even height and width: repeat the edge
        frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        if self._writer is None:
            import imageio.v2 as imageio
            # macro_block_size=1 keeps the screen's size (imageio would scale 210 rows up to 224)
            self._writer = imageio.get_writer(self._tmp, fps=self.fps, codec="libx264", macro_block_size=1,
                                              ffmpeg_log_level="error")
        self._writer.append_data(frame)
        self._frames += 1

    def _finish(self):
        self._writer.close()
        self._writer = None
        path = os.path.join(self.folder, "episode_%03d.mp4" % self.count)
        os.replace(self._tmp, path)
        print("wrote %s (%d frames, %.1f s at %g fps, %.0f kB; played and written in %.1f s)" % (
            path, self._frames, self._frames / self.fps, self.fps, os.path.getsize(path) / 1e3,
            time.time() - self._t0), flush=True)

    def _abort(self):
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # a broken pipe to an ffmpeg a Ctrl-C stopped: the file goes anyway
                pass
            self._writer = None
        if self._tmp is not None and os.path.exists(self._tmp):
            os.remove(self._tmp)

    def close(self):
        self._abort()
        super().close()


def video_fps(info, env):
    """One screen per agent step at the game's speed: 60 / 4 on Atari, else the env's render_fps (30)."""
    if any(w["wrapper"] == "gymnasium.wrappers.AtariPreprocessing" for w in info["env_wrappers"]):
        return 15
    fps = env.metadata.get("render_fps")
    return fps if isinstance(fps, (int, float)) and fps > 0 else 30


def video_dir_error(path):
    """Why --video_dir cannot hold the videos (None once the folder is there and writable)."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "%s is a file, not a folder" % path
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return "cannot make the folder %s (%s)" % (path, e.strerror or e)
    return None if os.access(path, os.W_OK | os.X_OK) else "the folder %s is not writable" % path


def recorded_env(info, video_dir):
    """make_env's env, recording its episodes into video_dir where one is given."""
    if not video_dir:
        return make_env(info)
    env = make_env(info, "rgb_array")
    return EpisodeVideos(env, video_dir, video_fps(info, env))


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
    as the run's --mode=test starts them: from plain resets (the env's own randomness, seeded once),
    or, where policy.json's test_mode_reset_seeds is "per_episode" (WALL-E's), episode i from
    reset(seed=seed + i)."""
    returns, lengths = [], []
    discrete = info["action_space"]["type"] == "Discrete"
    obs_dtype = np.dtype(info["observation"]["dtype"])
    per_episode = info.get("test_mode_reset_seeds") == "per_episode"
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        if returns:
            obs, _ = env.reset(seed=seed + len(returns)) if per_episode else env.reset()
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
    parser.add_argument("export_dir", help="a folder written by experiment.py or ppo_main.py --mode=export")
    parser.add_argument("--episodes", type=int, default=10, help="whole episodes to play")
    parser.add_argument("--seed", type=int, default=None, help="the env's seed (default: policy.json's test_mode_seed)")
    parser.add_argument("--deterministic", action="store_true", help="the policy's mode (argmax, a Gaussian's "
                        "mean) instead of a sample")
    parser.add_argument("--json", default=None, help="also write the returns and lengths to this file")
    parser.add_argument("--video_dir", default=None, help="also write each episode as an MP4 in this folder "
                        "(episode_001.mp4, ...): one frame per agent step, the screen the policy acted on, at "
                        "the game's speed (15 fps on Atari, the env's render_fps elsewhere)")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.export_dir, "policy.json")):
        print("play_policy.py: error: %s has no policy.json; give a folder written by experiment.py or "
              "ppo_main.py --mode=export" % args.export_dir, file=sys.stderr)
        return 2
    why = video_dir_error(args.video_dir) if args.video_dir else None
    if why:
        print("play_policy.py: error: --video_dir=%s: %s" % (args.video_dir, why), file=sys.stderr)
        return 2
    info, serve, initial, load_s = load(args.export_dir)
    print("loaded %s (%s, %s) in %.2f s" % (args.export_dir, info["agent_name"], info["env_id"], load_s), flush=True)
    seed = info.get("test_mode_seed", 0) if args.seed is None else args.seed
    env = recorded_env(info, args.video_dir)
    try:
        returns, lengths = play(info, serve, initial, env, args.episodes, args.deterministic, seed)
    except VideoError as e:
        print("play_policy.py: error: --video_dir=%s: %s" % (args.video_dir, e), file=sys.stderr)
        return 2
    finally:  # a Ctrl-C leaves no half-written video
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
