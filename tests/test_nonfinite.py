"""Non-finite numbers never reach the weights the actors act on: the surrogate's ratio cannot
overflow, a gradient step with NaN gradients is refused and counted, a run of them stops the
learner with exit code 7, actors refuse non-finite weights, and an invalid action is an error
instead of a hang inside ale-py's vector env."""
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import experiment
import vtrace
from envs import batch as env_batch
from impala import actor as actor_lib
from impala import learner
from impala import loss as loss_lib
from impala import training
from tests.test_learner import _experiment_defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _surrogate_grad(ratio_fn):
    """The clipped surrogate's gradient for an action the reference policy gave e^-100."""
    logits = tf.Variable([[[0.0, 0.0]]])
    old = tf.constant([[[0.0, 100.0]]])
    action = tf.constant([[0]])
    with tf.GradientTape() as tape:
        log_ratio = (vtrace.log_probs_from_logits_and_actions(logits, action)
                     - vtrace.log_probs_from_logits_and_actions(old, action))
        loss = loss_lib.compute_clipped_surrogate_loss(ratio_fn(log_ratio), tf.constant([[-1.0]]), 0.1)
    return tape.gradient(loss, logits).numpy()


def test_an_all_but_impossible_action_gives_a_finite_gradient():
    assert not np.isfinite(_surrogate_grad(tf.exp)).all()  # what the plain ratio does
    np.testing.assert_array_equal(_surrogate_grad(loss_lib.bounded_ratio), 0.0)
    # Below the cap the ratio is exactly exp().
    x = tf.constant([-50.0, 0.0, 3.0, 19.9])
    np.testing.assert_allclose(loss_lib.bounded_ratio(x).numpy(), np.exp(x.numpy()), rtol=1e-6)


def _cartpole_learner(tmp_path, **kw):
    f = _experiment_defaults(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=4, unroll_length=5,
                             optimizer="adam", num_sgd_iter=2, num_minibatches=2, clip_param=0.2,
                             learning_rate=1e-2, total_environment_frames=10 ** 6, **kw)
    return learner.Learner(f, str(tmp_path))


def _batch(lrn, reward):
    B, T = 4, 5
    full = lrn.zero_batch(B)
    rng = np.random.default_rng(0)
    full.update(observation=rng.normal(size=(T + 1, B, 4)).astype(np.float32),
                action=rng.integers(0, 2, (T, B)).astype(np.int32),
                reward=np.full((T, B), reward, np.float32))
    return {k: tf.constant(v) for k, v in full.items()}


def test_a_nan_update_is_refused_and_counted(tmp_path):
    lrn = _cartpole_learner(tmp_path)
    before = lrn.flat_weights()
    stats = lrn._train_step(_batch(lrn, np.nan), tf.constant(20, tf.int64))
    assert int(stats["skipped_steps"]) == 4  # 2 passes x 2 minibatches, all refused
    assert not np.isfinite(float(stats["grad_norm"]))
    np.testing.assert_array_equal(lrn.flat_weights(), before)
    assert int(lrn.optimizer.step.numpy()) == 0  # Adam's moments and step did not move either
    stats = lrn._train_step(_batch(lrn, 1.0), tf.constant(20, tf.int64))
    assert int(stats["skipped_steps"]) == 4  # a finite batch adds nothing
    assert int(lrn.optimizer.step.numpy()) == 4
    assert not np.array_equal(lrn.flat_weights(), before)


class _Log(list):
    def __call__(self, msg):
        self.append(msg)


def _trainer(lrn, log):
    t = training.Trainer.__new__(training.Trainer)  # only check_finite's state
    t.learner, t.log, t.rank, t.version = lrn, log, 0, 0
    t.steps_per_update = lrn.flags.num_sgd_iter * lrn.flags.num_minibatches
    t.skipped_before, t.refused_in_a_row = 0, 0
    t.weights, t.last_batch = lrn.flat_weights(), {}
    return t


def test_a_run_of_nan_updates_stops_the_learner_and_nan_weights_are_never_published(tmp_path):
    lrn, log = _cartpole_learner(tmp_path), _Log()
    t = _trainer(lrn, log)
    for i in range(training.NONFINITE_UPDATES_IN_A_ROW):
        t.step_stats = lrn._train_step(_batch(lrn, np.nan), tf.constant(20, tf.int64))
        why = t.check_finite()
        assert (why is None) == (i + 1 < training.NONFINITE_UPDATES_IN_A_ROW)
        t.version += 1
    assert "non-finite gradients in every step of 20 updates" in why
    assert "4 of 4 gradient step(s) had non-finite gradients" in log[0]
    # A finite update in between starts the count again.
    t.refused_in_a_row = 0
    t.step_stats = lrn._train_step(_batch(lrn, 1.0), tf.constant(20, tf.int64))
    assert t.check_finite() is None and t.refused_in_a_row == 0
    # Weights that are not finite whatever the gradients did (a NaN observation in the
    # normaliser, say) stop the run before they are published.
    lrn.variables[0].assign(tf.fill(lrn.variables[0].shape, np.nan))
    assert "the weights are not finite after update" in t.check_finite()


def _run_folder(tmp_path, **kw):
    """(a run folder with the options.json a run writes, a CartPole learner of those flags in it)."""
    run = tmp_path / "run"
    run.mkdir()
    lrn = _cartpole_learner(run, **kw)
    with open(run / "options.json", "w") as f:
        json.dump({name: getattr(lrn.flags, name) for name in experiment.RUN_FLAGS}, f)
    return run, lrn


def _replay_nonfinite(run):
    """experiment.py --mode=replay_nonfinite on the run folder, as a user runs it: (its result, which
    must be exit code 1, and its NOT FINITE lines in order)."""
    r = subprocess.run([sys.executable, "experiment.py", "--mode=replay_nonfinite", "--load_model_url=%s" % run],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    return r, [line for line in r.stdout.splitlines() if "NOT FINITE" in line]


def test_the_batch_that_made_the_weights_nan_is_kept_and_the_replay_names_the_stage(tmp_path):
    """A NaN observation makes the observation normaliser's statistics NaN: the learner stops,
    writes that batch and the finite weights it met to the run folder, and
    experiment.py --mode=replay_nonfinite, run on the folder as a user would, replays the
    update and names the observations as where it went wrong (exit code 1)."""
    run, lrn = _run_folder(tmp_path, normalize_observations=True, normalize_returns=True)
    t = _trainer(lrn, _Log())
    good = lrn.flat_weights()
    bad = _batch(lrn, 1.0)
    obs = bad["observation"].numpy()
    obs[2, 1, 3] = np.nan
    bad["observation"] = tf.constant(obs)
    t.last_batch = bad
    t.step_stats = lrn._train_step(bad, tf.constant(20, tf.int64))
    why = t.check_finite()
    assert "the weights are not finite after update 1" in why and str(run / "nonfinite_batch_rank0.npz") in why
    kept = np.load(run / "nonfinite_batch_rank0.npz")
    np.testing.assert_array_equal(kept["weights_before"], good)
    np.testing.assert_array_equal(kept["batch/observation"], obs)
    samples = obs.shape[1] * (obs.shape[0] - 1)  # the prior counts one
    assert kept["count/obs_normaliser"] == kept["count/return_normaliser"] == 1 + samples
    r, lines = _replay_nonfinite(run)
    assert lines[0].split()[0] == "observation" and "first at [2, 1, 3]" in lines[0], r.stdout
    assert "observation normaliser mean" in lines[1], r.stdout
    assert re.search(r"obs_normaliser +1 samples seen before the update", r.stdout), r.stdout


def test_an_actor_keeps_its_weights_when_the_published_ones_are_not_finite():
    log = _Log()
    set_to = []
    fake = types.SimpleNamespace(
        client=types.SimpleNamespace(fetch_weights_if_new=lambda: (5, np.array([1.0, np.nan], np.float32))),
        timings=actor_lib.Timings(*actor_lib.PHASES), log=log, task=3, learner="127.0.0.1:1",
        refused_version=None, set_weights=set_to.append, refresh_casts=lambda: None)
    assert actor_lib.Actor.read_weights(fake) and actor_lib.Actor.read_weights(fake)
    assert set_to == [] and len(log) == 1 and "version 5" in log[0] and "not finite" in log[0]
    fake.client.fetch_weights_if_new = lambda: (6, np.array([1.0, 2.0], np.float32))
    assert actor_lib.Actor.read_weights(fake) and len(set_to) == 1


def test_an_invalid_action_is_an_error_not_a_hang():
    b = env_batch.make_batch("native", "PongNoFrameskip-v4", 2, seed=1, frame_size=(42, 42))
    try:
        obs = np.zeros((2, 42, 42, 4), np.uint8)
        b.reset(obs)
        with pytest.raises(ValueError, match=r"actions \[6\] for envs \[1\] are outside 0..5"):
            b.send(np.array([0, 6]))
        b.send(np.array([0, 5]))  # the env was not sent the bad actions: it still steps
        b.recv(obs)
    finally:
        b.close()


def test_a_nan_return_is_named_by_the_replay_with_the_reward_statistics_kept(tmp_path):
    """--normalize_rewards: the reward normaliser is the learner's, not among the weights, and NaN in it
    would refuse every later step. The run stops on it as on NaN weights; the kept file holds its
    statistics, and the replay names the returns the actor sent, then the statistics."""
    run, lrn = _run_folder(tmp_path, normalize_rewards=True)
    t = _trainer(lrn, _Log())
    bad = _batch(lrn, 1.0)
    returns = np.ones(bad["discounted_return"].shape, np.float32)
    returns[3, 2] = np.nan
    bad["discounted_return"] = tf.constant(returns)
    t.last_batch = bad
    t.step_stats = lrn._train_step(bad, tf.constant(20, tf.int64))
    why = t.check_finite()
    assert "the reward statistics (--normalize_rewards) are not finite after update 1" in why, why
    kept = np.load(run / "nonfinite_batch_rank0.npz")
    assert np.isnan(kept["reward_normaliser/var"]) and kept["reward_normaliser/count"] == 1 + returns.size
    r, lines = _replay_nonfinite(run)
    assert lines[0].split()[0] == "discounted_return" and "first at [3, 2]" in lines[0], r.stdout
    assert "reward normaliser var" in lines[1], r.stdout
    assert "reward_normaliser: the statistics after the update" in r.stdout, r.stdout
