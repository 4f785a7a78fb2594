"""The memory task of sandbox/memory_env.py: its rules (a cue seen only at the first step, paid for at
the last), and configs/memory.flags training a recurrent agent past 0.9 while a feed-forward agent,
which cannot see the cue when it must act, stays at chance. Real local clusters (processes, loopback
gRPC), as a user runs the recipe."""
import csv
import json
import os

import gymnasium as gym
import numpy as np
import pytest

from sandbox import memory_env
from tests.test_custom_envs import _train
from tests.test_experiment import _run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _play(env, actions_from_cue):
    """One episode; actions_from_cue(cue) gives the action at the decision. Returns (observations,
    rewards, the cue)."""
    obs, _ = env.reset()
    cue = int(np.argmax(obs[:env.num_cues]))
    observations, rewards, done = [obs], [], False
    while not done:
        last = observations[-1][env.num_cues + 1] == 1.0
        obs, reward, terminated, truncated, _ = env.step(actions_from_cue(cue) if last else 0)
        observations.append(obs)
        rewards.append(reward)
        done = terminated or truncated
    return observations, rewards, cue


def test_the_cue_is_seen_only_at_the_first_step_and_paid_for_only_at_the_last():
    env = gym.make(memory_env.ENV_ID, delay=5, num_cues=3).unwrapped
    env.reset(seed=3)
    seen = set()
    for _ in range(30):
        observations, rewards, cue = _play(env, lambda cue: cue)
        seen.add(cue)
        assert len(rewards) == 5 + 2 and rewards[:-1] == [0.0] * 6 and rewards[-1] == 1.0
        assert observations[0][cue] == 1.0 and observations[0][3] == 1.0  # the cue and the cue bit
        for later in observations[1:]:  # nothing after the first step tells the cue
            assert not later[:4].any()
        assert [o[4] for o in observations[:-1]] == [0.0] * 6 + [1.0]  # the decide bit, once
    assert seen == {0, 1, 2}
    _, rewards, _ = _play(env, lambda cue: (cue + 1) % 3)
    assert rewards[-1] == 0.0


def test_a_step_past_the_end_and_bad_settings_are_refused_in_one_line():
    env = memory_env.CueMemory()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    _play(env, lambda cue: cue)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    for kwargs in (dict(delay=-1), dict(num_cues=1)):
        with pytest.raises(ValueError, match="delay=.*num_cues="):
            memory_env.CueMemory(**kwargs)


def _train_and_test(tmp_path, name, extra):
    """Trains the recipe; returns the best mean-20 return of training and test mode's mean over 100
    episodes of the checkpoint (0.5 +- 0.05 for a policy blind to the cue)."""
    logdir = str(tmp_path / name)
    _train(logdir, ["--flagfile=%s/configs/memory.flags" % ROOT, "--seed=1"] + extra, timeout=300)
    rows = list(csv.DictReader(open(os.path.join(logdir, "metrics.csv"))))
    best = max(float(r["mean_return_20"]) for r in rows if r["mean_return_20"] != "nan")
    r = _run_experiment(["--mode=test", "--load_model_url=" + logdir, "--test_num_episodes=100"])
    assert r.returncode == 0, r.stderr
    return best, json.load(open(os.path.join(logdir, "test_results.json")))["mean_return"]


@pytest.mark.long  # two runs of the recipe and their test modes, about 2 minutes
def test_an_lstm_learns_the_cue_and_a_feed_forward_net_stays_at_chance(tmp_path):
    best, tested = _train_and_test(tmp_path, "lstm", [])
    assert best >= 0.9 and tested >= 0.9, "MLPLSTMAgent: best mean-20 return %.2f, test mode %.2f" % (best, tested)
    best, tested = _train_and_test(tmp_path, "mlp", ["--agent_name=MLPAgent"])
    assert tested <= 0.65, "MLPAgent, which cannot see the cue when it acts, scored %.2f in test mode" % tested
