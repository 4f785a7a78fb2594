"""Evaluation (the evaluator worker, --mode=test) steps its env as the training actors step theirs:
the same backend for the level, so the same observations for the same actions."""
import json
import os
import subprocess
import sys

import ale_py
import cv2
import numpy as np
import pytest
import tensorflow as tf
from ale_py import roms

from envs import batch as env_batch
from impala import evaluator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _NoState:
    def initial_state(self, n):
        return ()


def _random_policy(seed, seen, num_actions=4):
    """A policy of random actions that records what it was given: (obs, first, action)."""
    rng = np.random.default_rng(seed)

    def policy(o, f, s):
        action = int(rng.integers(0, num_actions))
        seen.append((o.numpy()[0].copy(), bool(f.numpy()[0]), action))
        return tf.constant([action]), s
    return policy


@pytest.mark.parametrize("level", ["PongNoFrameskip-v4", "BreakoutNoFrameskip-v4"])
def test_evaluation_sees_what_training_sees(level):
    """The first observation is the training batch's, three black frames and the first frame,
    and the same actions give the same observations, through lost lives (Breakout: ALE presses
    nothing after one, where the Python wrappers would press FIRE and UP)."""
    env = evaluator.EvalEnv(level, "auto", seed=7)
    train = env_batch.make_batch("auto", level, 1, 7, training=True)
    try:
        obs = np.zeros_like(env.obs)
        train.reset(obs)
        np.testing.assert_array_equal(env.obs, obs)
        assert not env.obs[0, ..., :3].any() and env.obs[0, ..., 3].max() > 0
        actions, lives_lost = np.random.default_rng(1).integers(0, 4, 400), 0
        for a in actions:
            r_eval = env.step(a)
            train.send([a])
            r_train = train.recv(obs)
            np.testing.assert_array_equal(env.obs, obs)
            assert r_eval.reward[0] == r_train.reward[0] and r_eval.episode_end[0] == r_train.episode_end[0]
            lives_lost += bool(r_train.done[0] and not r_train.episode_end[0])
            assert not (r_eval.done[0] and not r_eval.episode_end[0])  # a lost life ends no episode here
        assert lives_lost > 0 or level.startswith("Pong")
    finally:
        env.close()
        train.close()


def test_native_reset_presses_fire_once_then_no_ops():
    """ale-py's reset as the native backend asks it (use_fire_reset): ALE's reset, FIRE for one
    frame, then 0-28 no-op frames; nothing else (no UP or RIGHT, unlike the Python FireReset)."""
    vec = env_batch.ale_vector_env("BreakoutNoFrameskip-v4", 1, 1, frame_size=env_batch.ALE_SCREEN,
                                   stack_num=1)
    first = vec.reset(seed=8)[0][0, 0]
    vec.close()

    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.setInt("random_seed", 8)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(roms.get_rom_path("breakout"))
    ale.reset_game()
    after_reset = ale.cloneState()

    def screen_after(actions):
        ale.restoreState(after_reset)
        for a in actions:
            ale.act(a)
        return ale.getScreenGrayscale()

    fire, noop = ale_py.Action.FIRE, ale_py.Action.NOOP
    assert any(np.array_equal(screen_after([fire] + [noop] * k), first) for k in range(29))
    assert not any(np.array_equal(screen_after([noop] * k + [fire]), first) for k in range(30))


def test_play_episodes_scores_whole_games():
    """Breakout with 5 lives: one episode is the whole game; `first` only at its start; the return
    and length are the game's, as the training batch reports them for the same actions."""
    env, seen = evaluator.EvalEnv("BreakoutNoFrameskip-v4", "auto", seed=3), []
    returns, lengths = evaluator.play_episodes(_random_policy(0, seen), _NoState(), env, 1)
    env.close()
    assert lengths == [len(seen)] and [f for _, f, _ in seen].count(True) == 1 and seen[0][1]
    train = env_batch.make_batch("auto", "BreakoutNoFrameskip-v4", 1, 3, training=True)
    obs = np.zeros((1, 84, 84, 4), np.uint8)
    train.reset(obs)
    dones, total = 0, 0.0
    for t, (o, _, a) in enumerate(seen):
        np.testing.assert_array_equal(o, obs[0])
        train.send([a])
        r = train.recv(obs)
        dones, total = dones + int(r.done[0]), total + float(r.reward[0])
        assert r.episode_end[0] == (t == len(seen) - 1)
    train.close()
    assert dones == 5 and returns == [total] == [float(r.episode_return[0])]


def test_python_backend_for_classic_control():
    env = evaluator.EvalEnv("CartPole-v1", "auto", seed=4)
    assert isinstance(env.batch, env_batch.PythonBatch)
    seen = []
    returns, lengths = evaluator.play_episodes(_random_policy(0, seen, 2), _NoState(), env, 2)
    env.close()
    assert returns == lengths and sum(lengths) == len(seen)
    assert [f for _, f, _ in seen].count(True) == 2


def test_rendered_screens_follow_the_agents_game():
    """render(): a colour twin of the native env plays the same games (through a game's end)."""
    plain = evaluator.EvalEnv("BreakoutNoFrameskip-v4", "auto", seed=5)
    shown = evaluator.EvalEnv("BreakoutNoFrameskip-v4", "auto", seed=5, render=True)
    try:
        ended = False
        for a in np.random.default_rng(2).integers(0, 4, 500):
            screen = shown.render()
            assert screen.shape == (210, 160, 3) and screen.dtype == np.uint8
            gray = cv2.resize(cv2.cvtColor(screen, cv2.COLOR_RGB2GRAY), (84, 84), interpolation=cv2.INTER_AREA)
            assert np.abs(gray.astype(int) - shown.obs[0, ..., -1]).mean() < 2.0
            ended |= bool(plain.step(a).episode_end[0])
            shown.step(a)
            np.testing.assert_array_equal(plain.obs, shown.obs)
        assert ended
    finally:
        plain.close()
        shown.close()


def test_test_mode_plays_atari_through_the_native_backend(tmp_path):
    """--mode=test on an Atari checkpoint: whole games scored, the GIF in colour at full size."""
    from impala import agent as agent_lib
    agent, _, _ = agent_lib.build_agent("BreakoutNoFrameskip-v4", "SimpleConvNetAgent", 20, (42, 42))
    prefix = tf.train.Checkpoint(agent=agent).save(str(tmp_path / "run" / "checkpoints" / "ckpt"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=test",
                        "--load_model_url=" + prefix, "--level_name=BreakoutNoFrameskip-v4", "--width=42",
                        "--height=42", "--test_num_episodes=1", "--render"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.load(open(tmp_path / "run" / "test_results.json"))
    assert result["env_backend"] == "native" and result["episodes"] == 1 and result["mean_length"] > 50
    import imageio
    frames = imageio.mimread(str(tmp_path / "run" / "test_episodes.gif"))
    assert frames[0].shape[:2] == (210, 160)
