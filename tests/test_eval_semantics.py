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
    returns, lengths, capped = evaluator.play_episodes(_random_policy(0, seen), _NoState(), env, 1)
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
    assert dones == 5 and returns == [total] == [float(r.episode_return[0])] and capped == [False]


def test_python_backend_for_classic_control():
    env = evaluator.EvalEnv("CartPole-v1", "auto", seed=4)
    assert isinstance(env.batch, env_batch.PythonBatch)
    seen = []
    returns, lengths, _ = evaluator.play_episodes(_random_policy(0, seen, 2), _NoState(), env, 2)
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
    assert result["eval_policy"] == "sample" and result["capped_episodes"] == []  # --eval_policy=auto on Atari
    import imageio
    frames = imageio.mimread(str(tmp_path / "run" / "test_episodes.gif"))
    assert frames[0].shape[:2] == (210, 160)


def _never_fire(seen):
    """A policy that only ever plays NOOP, as an argmax can; records `first`."""
    def policy(o, f, s):
        seen.append(bool(f.numpy()[0]))
        return tf.constant([0]), s
    return policy


def test_a_policy_that_never_presses_fire_is_capped_not_left_standing(capsys):
    """Native Breakout: ALE presses FIRE at a game's start but not after a lost life (nor in training),
    so a policy that never presses FIRE stands still after its first life. The episode ends at the
    stall cap (18,000 frames without a reward or a lost life: 4,500 steps), says so and is marked
    capped, and a new game starts; it used to stand until ALE's 108,000-frame limit (27,000 steps)."""
    env, seen = evaluator.EvalEnv("BreakoutNoFrameskip-v4", "auto", seed=3), []
    try:
        episodes = evaluator.play_episodes(_never_fire(seen), _NoState(), env, 1, should_stop=lambda: len(seen) >= 6000)
        assert len(episodes[0]) == 1, "no episode ended in %d steps" % len(seen)
        returns, lengths, capped = episodes
        assert capped == [True] and lengths == [len(seen)] and 4500 < len(seen) < 6000 and seen.count(True) == 1
        assert capsys.readouterr().out == (
            "warning: episode 1 capped after %d steps, return %.1f so far: no reward and no lost life for 18000 "
            "frames (--eval_stall_frames=18000); it is marked capped in the results\n" % (len(seen), returns[0]))
        assert not env.obs[0, ..., :3].any() and env.obs[0, ..., 3].any()  # a new game's first stack
    finally:
        env.close()


def test_the_python_backend_presses_fire_after_a_lost_life_as_in_training():
    """The Python backend's training envs press FIRE and UP after each lost life (EpisodicLife's
    reset, then FireReset); its evaluation envs now do too, so a policy that never presses FIRE
    plays the whole game, the training batch's game for the same actions. It stood still after
    the first life."""
    env, seen = evaluator.EvalEnv("BreakoutNoFrameskip-v4", "python", seed=5), []
    try:
        episodes = evaluator.play_episodes(_never_fire(seen), _NoState(), env, 1, should_stop=lambda: len(seen) >= 3000)
    finally:
        env.close()
    assert len(episodes[0]) == 1, "no episode ended in %d steps" % len(seen)
    train = env_batch.make_batch("python", "BreakoutNoFrameskip-v4", 1, 5, training=True)
    obs = np.zeros((1, 84, 84, 4), np.uint8)
    train.reset(obs)
    ends, lives_lost = [], 0
    for _ in seen:
        train.send([0])
        r = train.recv(obs)
        ends.append(bool(r.episode_end[0]))
        lives_lost += bool(r.done[0] and not r.episode_end[0])
    train.close()
    assert ends.index(True) == len(seen) - 1 and lives_lost == 4
    assert episodes == ([float(r.episode_return[0])], [int(r.episode_length[0])], [False])


def test_evaluation_samples_on_atari_and_plays_greedily_elsewhere():
    """--eval_policy=auto: sampled on Atari (an argmax can stand still there), greedy (the argmax, a
    Gaussian's mean) elsewhere, as the continuous recipes' evaluation curves were measured."""
    assert evaluator.policy_kind("auto", "BreakoutNoFrameskip-v4") == "sample"
    assert evaluator.policy_kind("auto", "CartPole-v1") == evaluator.policy_kind("auto", "Pendulum-v1") == "greedy"
    assert evaluator.policy_kind("greedy", "PongNoFrameskip-v4") == "greedy"
    assert evaluator.policy_kind("sample", "Pendulum-v1") == "sample"
    with pytest.raises(ValueError, match="--eval_policy=best: choose one of auto, sample, greedy"):
        evaluator.policy_kind("best", "CartPole-v1")


def test_an_evaluator_round_plays_eval_policy_and_counts_capped_episodes():
    """The evaluator's rounds: with a policy head whose argmax is NOOP, --eval_policy=greedy stands
    still after the first life and the round's episode is capped (eval.csv's `capped`, the log);
    auto samples on Atari, presses FIRE now and then and plays the game to its end."""
    from types import SimpleNamespace
    from impala import agent as agent_lib
    agent, _, _ = agent_lib.build_agent("BreakoutNoFrameskip-v4", "SimpleConvNetAgent", 20, (42, 42))
    logits = agent._heads._policy
    logits.w.assign(tf.zeros_like(logits.w))
    logits.b.assign([3.0, 0.0, 0.0, 0.0])  # NOOP: 87 % of the samples, every argmax

    class Client:
        version = 7

        def fetch_weights_if_new(self):
            return None

    def one_round(eval_policy):
        rows, lines = [], []
        csv_rows = SimpleNamespace(write=lambda row, step: rows.append(row))
        flags = SimpleNamespace(eval_policy=eval_policy, level_name="BreakoutNoFrameskip-v4", test_num_episodes=1,
                                eval_stall_frames=2000, test_every_s=0)
        env = evaluator.EvalEnv("BreakoutNoFrameskip-v4", "auto", 9, (42, 42))
        try:
            assert evaluator._evaluate_until_stopped(flags, Client(), agent, None, env, csv_rows, lambda: bool(rows),
                                                     lines.append) == 1
        finally:
            env.close()
        return rows[0], lines
    row, lines = one_round("greedy")
    assert row["capped"] == 1 and lines[0].startswith("evaluator: warning: episode 1 capped"), lines
    assert lines[-1].startswith("evaluator: policy version 7: greedy return") and lines[-1].endswith("(1 capped)")
    row, lines = one_round("auto")
    assert row["capped"] == 0 and len(lines) == 1 and "sample return" in lines[0], lines
