"""Continuous actions in the IMPALA path: the Gaussian head's densities, actions clipped for the env
but learned from unclipped, Pendulum learning through a local cluster with the evaluator and test
mode, and two Horovod ranks with replay and a resume (real processes, loopback gRPC, mpirun)."""
import csv
import json
import math
import os
import re

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import nets
from envs import batch as env_batch
from impala import loss as loss_lib
from nets import distributions
from local_cluster import LocalCluster
from tests.test_custom_envs import _log, _summary, _train
from tests.test_experiment import _free_base_port, _no_leftovers, _run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RecordsActions(gym.Env):
    """A 2-D action in [-1, 1] x [0, 3]; remembers what step() was given (for the clipping test)."""

    def __init__(self):
        self.seen = []
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.seen.append(np.array(action))
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_the_gaussian_head_gives_the_densities_of_its_actions():
    policy = distributions.make(action_dim=2)
    mean, log_std = np.array([[0.5, -1.0]]), np.array([[0.0, math.log(0.5)]])
    params = tf.constant(np.concatenate([mean, log_std], -1), tf.float32)
    a = np.array([[1.5, -1.25]])
    std = np.exp(log_std)
    expected = np.sum(-0.5 * ((a - mean) / std) ** 2 - np.log(std * math.sqrt(2 * math.pi)), -1)
    np.testing.assert_allclose(policy.log_prob(params, tf.constant(a, tf.float32)).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(policy.entropy(params).numpy(),
                               np.sum(np.log(std * math.sqrt(2 * math.pi * math.e)), -1), rtol=1e-5)
    np.testing.assert_allclose(policy.mode(params).numpy(), mean, rtol=1e-6)
    tf.random.set_seed(0)
    draws = policy.sample(tf.repeat(params, 20000, axis=0)).numpy()
    np.testing.assert_allclose(draws.mean(0), mean[0], atol=0.03)
    np.testing.assert_allclose(draws.std(0), std[0], rtol=0.03)
    # The batch's action dtype tells the loss which distribution it reads.
    assert loss_lib.policy_of({"action": tf.zeros([2, 3, 2]), "behaviour_logits": tf.zeros([2, 3, 4])}).continuous
    assert not loss_lib.policy_of({"action": tf.zeros([2, 3], tf.int32),
                                   "behaviour_logits": tf.zeros([2, 3, 4])}).continuous


def test_an_agent_for_box_actions_samples_floats_and_learns_its_log_std():
    agent = nets.make_agent("MLPAgent", distributions.make(action_dim=2))
    out, _ = agent(tf.zeros([5, 3]), tf.ones([5], bool), ())
    assert out.action.dtype == tf.float32 and out.action.shape == (5, 2) and out.policy_logits.shape == (5, 4)
    assert any("log_std" in v.name for v in agent.trainable_variables)
    nets.orthogonal_init(agent)  # leaves the log-std at its start (a std of 1)
    np.testing.assert_array_equal(out.policy_logits.numpy()[:, 2:], 0.0)


def test_actions_are_clipped_for_the_env_only():
    b = env_batch.make_batch("python", "tests.test_continuous:RecordsActions", 2, seed=1)
    obs = np.zeros((2, 3), np.float32)
    b.reset(obs)
    actions = np.array([[5.0, -2.0], [0.25, 2.5]], np.float32)
    b.send(actions)
    b.recv(obs)
    np.testing.assert_array_equal([e.unwrapped.seen[0] for e in b.envs], [[1.0, 0.0], [0.25, 2.5]])
    np.testing.assert_array_equal(actions, [[5.0, -2.0], [0.25, 2.5]])  # the unroll's copy is untouched
    b.close()


@pytest.mark.long  # a learning run to a score, 45-90 s
def test_pendulum_learns_and_plays_in_test_mode(tmp_path):
    """configs/pendulum.flags for 200K of its 500K frames: a random policy scores about -1,200 a
    game. The run must learn and keep what it learned: the mean of 100 games passes -400 by 150K
    frames, never falls below -600 after that and ends above -300. Runs of the file passed -400 by
    66K-106K frames and ended at -202 to -211 at 150K frames (-172 to -195 at 500K); without its
    --action_bound_cost most runs fell back to -760..-1,520 for a while, once to the end
    (bench/results/2core-amd-epyc-without-avx-512/pendulum_bound.md). Test mode then plays the run's
    continuous policy from its checkpoint."""
    logdir = str(tmp_path / "run")
    _train(logdir, ["--flagfile=%s/configs/pendulum.flags" % ROOT, "--seed=3", "--log_every_s=2",
                    "--total_environment_frames=200000"], timeout=240)
    rows = list(csv.DictReader(open(os.path.join(logdir, "metrics.csv"))))
    assert int(rows[-1]["frames"]) >= 200000
    # A slow machine writes its first rows before a 200-step game has ended; those read nan.
    curve = [(int(r["frames"]), float(r["mean_return_100"])) for r in rows if r["mean_return_100"] != "nan"]
    passed = next((i for i, (_, score) in enumerate(curve) if score > -400), None)
    text = " ".join("%dK:%.0f" % (f // 1000, score) for f, score in curve)
    assert passed is not None and curve[passed][0] <= 150000, "mean of 100 by frames: " + text
    assert min(score for _, score in curve[passed:]) > -600 and curve[-1][1] > -300, "mean of 100 by frames: " + text
    r = _run_experiment(["--mode=test", "--load_model_url=" + logdir, "--test_num_episodes=5"])
    assert r.returncode == 0, r.stderr
    assert json.load(open(os.path.join(logdir, "test_results.json")))["episodes"] == 5


@pytest.mark.long  # 40-90 s; the default suite holds two ranks in step (test_experiment.py)
def test_two_ranks_with_replay_and_the_evaluator_hold_the_same_weights_and_resume(tmp_path):
    """The discrete path's machinery with a Gaussian policy: mpirun -np 2 with standard replay
    (the stored behaviour parameters are what V-trace reads when an unroll comes back) and the
    evaluator scoring the Gaussian's mean, then a resume from the checkpoint with train_w_load
    that goes on from its frame count."""
    logdir = str(tmp_path / "run")
    replay = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "standard", "capacity": 64, ' \
             '"sample_ratio": 0.5}]'
    flags = ["--flagfile=%s/configs/pendulum.flags" % ROOT, "--envs_per_actor=4", "--batch_size=8",
             "--queue_capacity=8", "--replay_parameters=" + replay, "--log_every_s=1"]
    c = LocalCluster(2, _free_base_port(), flags + ["--total_environment_frames=40000", "--test_every_s=2",
                                                    "--test_num_episodes=1"], logdir,
                     num_learners=2, evaluator=True).start()
    try:
        assert c.wait(timeout=240) == 0, _log(logdir)
    finally:
        c.stop()
    _no_leftovers(c)
    log = _log(logdir)
    sums = dict(re.findall(r"\[learner (\d)\] final weights sha256 ([0-9a-f]{64})", log))
    assert set(sums) == {"0", "1"} and sums["0"] == sums["1"], log
    evals = list(csv.DictReader(open(os.path.join(logdir, "eval.csv"))))
    assert evals and all(-2000 < float(r["mean_return"]) <= 0 for r in evals)
    frames = _summary(logdir)["frames"]
    assert frames >= 40000 and _summary(logdir)["replay"]
    _train(logdir, flags + ["--total_environment_frames=50000", "--mode=train_w_load", "--load_model_url=" + logdir],
           num_actors=1)
    assert "resumed from" in _log(logdir) and "at %d frames" % frames in _log(logdir)
    assert _summary(logdir)["frames"] >= 50000


def _log_std_variable(agent):
    agent(tf.zeros([5, 3]), tf.ones([5], bool), ())  # builds the variables
    return [v for v in agent.trainable_variables if "log_std" in v.name][0]


def test_the_log_std_floor_holds_what_actors_sample_and_the_learner_reads():
    """--min_log_std: the head's parameters carry the floored log-std (so behaviour and learner
    read one distribution), a loss that wants it lower gets nothing under the floor, and a floor
    out of range, or a start outside [floor, 2] (--initial_log_std), is refused."""
    def log_std_and_gradient(initial):
        agent = nets.make_agent("MLPAgent", distributions.make(action_dim=2, initial_log_std=max(initial, -3.0),
                                                               min_log_std=-3.0))
        variable = _log_std_variable(agent)
        variable.assign([initial] * 2)  # a start under the floor is refused; a checkpoint may hold one
        with tf.GradientTape() as tape:
            out, _ = agent(tf.zeros([5, 3]), tf.ones([5], bool), ())
            total = tf.reduce_sum(out.policy_logits[:, 2:])
        gradient = tape.gradient(total, variable)
        return out.policy_logits.numpy()[:, 2:], variable.numpy(), 0 * variable if gradient is None else gradient
    params, variable, gradient = log_std_and_gradient(-4.0)  # under the floor
    np.testing.assert_array_equal(params, -3.0)
    np.testing.assert_array_equal(variable, -4.0)
    np.testing.assert_array_equal(gradient, 0.0)
    params, _, gradient = log_std_and_gradient(-2.0)
    np.testing.assert_array_equal(params, -2.0)
    np.testing.assert_array_equal(gradient, 5.0)  # one per step of the batch
    for floor in (-6.0, 2.0):
        with pytest.raises(ValueError, match="--min_log_std"):
            distributions.make(action_dim=2, min_log_std=floor)
    for start in (-3.5, 2.5, float("nan")):
        with pytest.raises(ValueError, match=r"--initial_log_std=\S+: give a start from the floor --min_log_std=-3 "):
            distributions.make(action_dim=2, initial_log_std=start, min_log_std=-3.0)


def test_a_log_std_past_a_bound_still_learns_back_inside():
    """A log-std variable past the ceiling (2) or under the floor still gets the gradient of a loss
    that wants it back inside, and a few steps bring it there; a plain clip's gradient there was
    exactly zero, so once past 2 the std stayed at 7.4 for good. A loss that pushes it further out
    moves it no further (it would wander off, unseen behind the clamp)."""
    policy = distributions.make(action_dim=2, min_log_std=-3.0)
    agent = nets.make_agent("MLPAgent", policy)
    variable = _log_std_variable(agent)

    def log_std_and_gradient(sign):  # sign 1: a loss that wants a smaller std (the mean's -log density), -1: larger
        with tf.GradientTape() as tape:
            params = agent(tf.zeros([5, 3]), tf.ones([5], bool), ())[0].policy_logits
            loss = -sign * tf.reduce_mean(policy.log_prob(params, policy.mode(params)))
        return policy.split(params)[1].numpy(), tape.gradient(loss, variable).numpy()

    variable.assign([2.1, 2.5])
    log_std, gradient = log_std_and_gradient(1)
    np.testing.assert_array_less(0.0, gradient)  # descent lowers it
    np.testing.assert_array_equal(log_std, 2.0)  # the std the actors sample with: 7.4
    np.testing.assert_array_equal(log_std_and_gradient(-1)[1], 0.0)
    for _ in range(4):  # plain gradient descent, step 0.2: one per step and dimension
        variable.assign_sub(0.2 * log_std_and_gradient(1)[1])
    np.testing.assert_allclose(variable.numpy(), [1.3, 1.7], atol=1e-5)
    np.testing.assert_allclose(log_std_and_gradient(1)[0], np.tile([1.3, 1.7], (5, 1)), atol=1e-5)
    variable.assign([-3.2, -4.0])  # under the floor -3
    np.testing.assert_array_less(log_std_and_gradient(-1)[1], 0.0)  # a loss that wants more exploration
    np.testing.assert_array_equal(log_std_and_gradient(1)[1], 0.0)


def test_a_checkpoint_keeps_its_log_std(tmp_path):
    """The variable still holds the log-std itself: a checkpoint of a run from before reads back as the
    std it had (the variable clamped to [--min_log_std, 2]), in the head's parameters now too."""
    def agent_and_variable():
        agent = nets.make_agent("MLPAgent", distributions.make(action_dim=3, min_log_std=-3.0))
        return agent, _log_std_variable(agent)
    old, variable = agent_and_variable()
    variable.assign([-0.7, -4.0, 2.5])
    path = tf.train.Checkpoint(agent=old).save(str(tmp_path / "ckpt"))
    new, variable = agent_and_variable()
    tf.train.Checkpoint(agent=new).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(variable.numpy(), np.float32([-0.7, -4.0, 2.5]))
    params = new(tf.zeros([5, 3]), tf.ones([5], bool), ())[0].policy_logits
    np.testing.assert_array_equal(new.policy.split(params)[1], np.tile(np.float32([-0.7, -3.0, 2.0]), (5, 1)))
    np.testing.assert_array_equal(params[:, 3:], new.policy.split(params)[1])
