"""The learner's loss and optimizer pieces, on small tensors (no processes), and its
training loop on a real transport server in this process."""
import collections
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from impala import agent as agent_lib
from impala import batches
from impala.batches import BATCH_START_PREFIX
from impala import learner
from impala import loss as loss_lib
from impala import training
import nets
from impala import transport
from tests.test_experiment import _free_base_port


def _experiment_defaults(**overrides):
    """experiment.py's flag defaults as a namespace (no parsing of sys.argv)."""
    import experiment
    values = {name: experiment.FLAGS[name].default for name in experiment.FLAGS}
    values.update(overrides)
    # as main() resolves it at start-up: abs_one for an Atari game, none otherwise
    values["reward_clipping"] = experiment.reward_clipping_for(values["reward_clipping"], values["level_name"])[0]
    return types.SimpleNamespace(**values)


def _flags(**kw):
    """The defaults with a larger learning rate and entropy cost, for visible effects."""
    return _experiment_defaults(**{"learning_rate": 0.01, "entropy_cost": 0.01, **kw})


def test_rmsprop_starts_like_tf1_with_mean_square_one():
    """TF1's RMSPropOptimizer (the original IMPALA's) starts ms at 1; the first step is
    lr * g / sqrt(decay + (1 - decay) g^2 + eps), not Sonnet's ~10x lr burst."""
    v = tf.Variable([1.0, -2.0, 3.0])
    f = _flags()
    opt = learner.make_optimizer(f, tf.constant(f.learning_rate), [v])
    np.testing.assert_allclose(v.numpy(), [1.0, -2.0, 3.0])  # slot creation moved nothing
    g = np.array([0.05, -0.5, 2.0], np.float32)
    opt.apply([tf.constant(g)], [v])
    ms = f.decay * 1.0 + (1 - f.decay) * g ** 2
    expected = np.array([1.0, -2.0, 3.0]) - f.learning_rate * g / np.sqrt(ms + f.epsilon)
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-5)
    # For a small gradient the step is far below lr (the warm-up TF1 had).
    assert abs(1.0 - v.numpy()[0]) < 0.1 * f.learning_rate


def test_adam_first_step_is_lr_in_the_sign_of_the_gradient():
    v = tf.Variable([0.0, 0.0])
    f = _flags(optimizer="adam", learning_rate=0.001)
    opt = learner.make_optimizer(f, tf.constant(f.learning_rate), [v])
    opt.apply([tf.constant([0.3, -7.0])], [v])
    np.testing.assert_allclose(v.numpy(), [-0.001, 0.001], rtol=1e-3)


def _batch(T=5, B=3, A=4, seed=0):
    rng = np.random.default_rng(seed)
    return {"reward": tf.constant(rng.normal(size=(T, B)), tf.float32),
            "done": tf.constant(rng.random((T, B)) < 0.2),
            "action": tf.constant(rng.integers(A, size=(T, B)), tf.int32),
            "behaviour_logits": tf.constant(rng.normal(size=(T, B, A)), tf.float32)}


def _out(logits, baseline):
    return nets.AgentOutput(action=None, policy_logits=logits, baseline=baseline)


def test_clip_param_on_policy_equals_the_impala_policy_gradient():
    """At ratio 1 (target = behaviour) the clipped surrogate -sum(ratio * A) has the
    gradient of IMPALA's -sum(log pi * A) (its value differs: it is not a log)."""
    T, B, A = 5, 3, 4
    batch = _batch(T, B, A)
    rng = np.random.default_rng(1)
    baseline = tf.constant(rng.normal(size=(T + 1, B)), tf.float32)
    logits = tf.Variable(tf.concat([batch["behaviour_logits"], tf.zeros([1, B, A])], axis=0))
    results = []
    for clip in (0.0, 0.2):
        with tf.GradientTape() as tape:
            loss, _ = loss_lib.compute_losses(_out(logits, baseline), batch, _flags(clip_param=clip))
        results.append(tape.gradient(loss, logits).numpy())
    assert np.abs(results[0]).sum() > 0.1
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4, atol=1e-6)


def test_clip_param_stops_the_gradient_past_the_clip():
    """A step whose ratio pi/mu is already past 1 + clip with a positive advantage (or
    below 1 - clip with a negative one) contributes no policy gradient."""
    T, B, A = 1, 2, 2
    batch = {"reward": tf.constant([[1.0, -1.0]]), "done": tf.constant([[True, True]]),
             "action": tf.constant([[0, 0]]), "behaviour_logits": tf.zeros([1, B, A])}
    baseline = tf.zeros([T + 1, B])  # advantages: +1 for env 0, -1 for env 1
    # pi(a=0) = 0.8 (ratio 1.6) for env 0; 0.2 (ratio 0.4) for env 1.
    l0 = np.log([[0.8, 0.2], [0.2, 0.8]]).astype(np.float32)[None]
    logits = tf.Variable(tf.concat([l0, tf.zeros([1, B, A])], axis=0))
    flags = _flags(clip_param=0.2, entropy_cost=0.0, baseline_cost=0.0)
    with tf.GradientTape() as tape:
        loss, _ = loss_lib.compute_losses(_out(logits, baseline), batch, flags)
    np.testing.assert_allclose(tape.gradient(loss, logits).numpy(), 0.0, atol=1e-7)
    # Without the clip both steps push the policy.
    with tf.GradientTape() as tape:
        loss, _ = loss_lib.compute_losses(_out(logits, baseline), batch, _flags(
            entropy_cost=0.0, baseline_cost=0.0, clip_param=0.0))
    assert np.abs(tape.gradient(loss, logits).numpy()).sum() > 0.1


def test_clip_ratio_to_batch_start_keeps_a_stale_batch_learning():
    """The batch of test_clip_param_stops_the_gradient_past_the_clip, whose actors' policy
    lags far behind: against mu the clip stops every gradient; against pi_old (the policy
    when the batch arrived, here = pi) the ratio is 1 and the policy moves, by V-trace's
    advantages to pi_old: +rho_bar * 1 and -rho_bar * 1 with rho_bar = min(1, pi_old / mu)."""
    T, B, A = 1, 2, 2
    batch = {"reward": tf.constant([[1.0, -1.0]]), "done": tf.constant([[True, True]]),
             "action": tf.constant([[0, 0]]), "behaviour_logits": tf.zeros([1, B, A])}
    baseline = tf.zeros([T + 1, B])
    l0 = np.log([[0.8, 0.2], [0.2, 0.8]]).astype(np.float32)[None]
    logits = tf.Variable(tf.concat([l0, tf.zeros([1, B, A])], axis=0))
    flags = _flags(clip_param=0.2, entropy_cost=0.0, baseline_cost=0.0, clip_ratio_to="batch_start")
    with tf.GradientTape() as tape:
        loss, _ = loss_lib.compute_losses(_out(logits, baseline), dict(batch, old_logits=tf.constant(l0)), flags)
    grad = tape.gradient(loss, logits).numpy()[0]
    # d(-ratio * adv)/d logits at ratio 1 = -adv * (onehot(a) - pi); adv = (+1, -0.4).
    pi = np.exp(l0[0])
    expected = np.stack([-1.0 * (np.array([1, 0]) - pi[0]), 0.4 * (np.array([1, 0]) - pi[1])])
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


def test_fresh_batch_start_clips_replayed_steps_against_mu():
    """--clip_ratio_to=fresh_batch_start: the same stale batch with env 0 from the queue and env 1
    replayed. Env 0 moves as under batch_start; env 1's ratio is taken against mu (0.4 with a
    negative advantage: past the clip), so it gets no gradient, as under behaviour."""
    T, B, A = 1, 2, 2
    batch = {"reward": tf.constant([[1.0, -1.0]]), "done": tf.constant([[True, True]]),
             "action": tf.constant([[0, 0]]), "behaviour_logits": tf.zeros([1, B, A]),
             "fresh": tf.constant([True, False])}
    baseline = tf.zeros([T + 1, B])
    l0 = np.log([[0.8, 0.2], [0.2, 0.8]]).astype(np.float32)[None]
    logits = tf.Variable(tf.concat([l0, tf.zeros([1, B, A])], axis=0))
    flags = _flags(clip_param=0.2, entropy_cost=0.0, baseline_cost=0.0, clip_ratio_to="fresh_batch_start")
    anchored = dict(batch, old_logits=tf.constant(l0), **loss_lib.fresh_steps(batch))
    with tf.GradientTape() as tape:
        loss, _ = loss_lib.compute_losses(_out(logits, baseline), anchored, flags)
    grad = tape.gradient(loss, logits).numpy()[0]
    pi = np.exp(l0[0])
    np.testing.assert_allclose(grad[0], -1.0 * (np.array([1, 0]) - pi[0]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad[1], 0.0, atol=1e-7)
    # Without a "fresh" field every step counts as the queue's: batch_start's gradient throughout.
    assert loss_lib.fresh_steps({"action": batch["action"]})["batch_start/fresh"].numpy().all()


def test_action_bound_cost_pulls_only_a_mean_past_the_bounds():
    """--action_bound_cost: a Gaussian's mean beyond the Box's bounds costs its squared overshoot,
    which pulls it back; a mean inside them, an infinite bound, a discrete policy or a cost of 0
    add nothing."""
    T, B = 1, 2
    low, high = (-2.0, -np.inf), (2.0, np.inf)
    mean = np.array([[[3.0, 50.0], [-2.5, 0.5]]], np.float32)  # overshoots 1 and 0.5 in dimension 0
    params = np.concatenate([mean, np.zeros_like(mean)], -1)  # log-std 0
    batch = {"reward": tf.zeros([T, B]), "done": tf.constant([[True, True]]),
             "action": tf.constant(mean), "behaviour_logits": tf.constant(params)}
    logits = tf.Variable(tf.concat([params, tf.zeros([1, B, 4])], axis=0))
    out = _out(logits, tf.zeros([T + 1, B]))
    quiet = dict(entropy_cost=0.0, baseline_cost=0.0)
    with tf.GradientTape() as tape:
        loss, stats = loss_lib.compute_losses(out, batch, _flags(action_bound_cost=2.0, **quiet), 1.0, (low, high))
    np.testing.assert_allclose(stats["action_bound_loss"].numpy(), 2.0 * (1.0 ** 2 + 0.5 ** 2), rtol=1e-6)
    without, _ = loss_lib.compute_losses(out, batch, _flags(**quiet), 1.0, (low, high))
    np.testing.assert_allclose(loss.numpy(), without.numpy() + 2.5, rtol=1e-5)
    grad = tape.gradient(loss, logits).numpy()[0, :, :2]
    # Zero advantages: the mean's gradient is the bound term's alone, 2 * cost * overshoot, outward-signed.
    np.testing.assert_allclose(grad, [[4.0, 0.0], [-2.0, 0.0]], atol=1e-5)
    assert stats["mean_outside_bounds"].numpy() == 1.0  # both steps' means are out in dimension 0
    _, stats = loss_lib.compute_losses(out, batch, _flags(action_bound_cost=2.0, **quiet))  # no bounds given
    assert "action_bound_loss" not in stats and "mean_outside_bounds" not in stats
    discrete, _ = loss_lib.compute_losses(_out(tf.zeros([T + 1, B, 3]), tf.zeros([T + 1, B])),
                                          dict(batch, action=tf.zeros([T, B], tf.int32),
                                               behaviour_logits=tf.zeros([T, B, 3])),
                                          _flags(action_bound_cost=2.0, **quiet), 1.0, (low, high))
    assert np.isfinite(discrete.numpy())


def test_clip_ratio_to_batch_start_in_a_learner_step(tmp_path):
    """The learner computes pi_old once per batch; its first gradient step equals the
    behaviour-ratio step when the actors acted with the learner's own policy."""
    kw = dict(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=4, unroll_length=5,
              optimizer="adam", num_sgd_iter=1, clip_param=0.2, learning_rate=1e-2,
              total_environment_frames=10 ** 6)
    rng = np.random.default_rng(0)
    B, T = 4, 5
    obs = rng.normal(size=(T + 1, B, 4)).astype(np.float32)
    weights = []
    for to in ("behaviour", "batch_start"):
        lrn = learner.Learner(_experiment_defaults(clip_ratio_to=to, **kw), str(tmp_path / to))
        if not weights:
            weights.append(lrn.flat_weights())
        else:
            agent_lib.make_weight_setter(lrn.variables)(tf.constant(weights[0]))
        out, _ = lrn.agent.unroll(tf.constant(obs), tf.zeros([T + 1, B], bool), ())
        batch = {"observation": obs, "first": np.zeros((T + 1, B), bool),
                 "action": np.ones((T, B), np.int32),
                 "reward": np.ones((T, B), np.float32), "done": np.zeros((T, B), bool),
                 "behaviour_logits": out.policy_logits.numpy()[:-1]}
        lrn._train_step({k: tf.constant(v) for k, v in batch.items()}, tf.constant(20, tf.int64))
        weights.append(lrn.flat_weights())
    assert not np.allclose(weights[0], weights[1])
    np.testing.assert_allclose(weights[1], weights[2], rtol=1e-4, atol=1e-6)


def test_normalized_advantages_do_not_depend_on_the_reward_scale():
    """With --normalize_advantages the policy gradient is the same for rewards x1 and x100."""
    T, B, A = 6, 4, 3
    batch = _batch(T, B, A, seed=2)
    logits = tf.Variable(tf.random.stateless_normal([T + 1, B, A], seed=[1, 2]))
    grads = []
    for scale in (1.0, 100.0):
        b = dict(batch, reward=batch["reward"] * scale)
        baseline = tf.zeros([T + 1, B])
        flags = _flags(reward_clipping="none", entropy_cost=0.0, baseline_cost=0.0, normalize_advantages=True)
        with tf.GradientTape() as tape:
            loss, _ = loss_lib.compute_losses(_out(logits, baseline), b, flags)
        grads.append(tape.gradient(loss, logits).numpy())
    assert np.abs(grads[0]).sum() > 0.1
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-3, atol=1e-5)


def test_the_loss_clips_rewards_as_resolved_and_refuses_an_unresolved_auto():
    """--reward_clipping reaches the loss resolved (experiment.resolve_reward_clipping): auto there,
    taken as none, would leave an Atari game's rewards unclipped, so it is refused."""
    r = tf.constant([-3.0, -0.5, 0.5, 7.0])
    np.testing.assert_allclose(loss_lib.clip_rewards(r, "abs_one").numpy(), [-1.0, -0.5, 0.5, 1.0])
    np.testing.assert_allclose(loss_lib.clip_rewards(r, "none").numpy(), r.numpy())
    with pytest.raises(ValueError, match="--reward_clipping=auto"):
        loss_lib.clip_rewards(r, "auto")
    assert _flags().reward_clipping == "abs_one"  # the defaults' level, Pong, as main() resolves it
    assert _flags(level_name="CartPole-v1").reward_clipping == "none"
    assert _flags(level_name="CartPole-v1", reward_clipping="abs_one").reward_clipping == "abs_one"


@pytest.mark.parametrize("bad", ["--num_sgd_iter=0", "--clip_param=1.5", "--optimizer=sgd",
                                 "--adam_epsilon=0", "--clip_ratio_to=target", "--prefetch_batches=-1"])
def test_new_training_flags_are_validated(bad):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(root, "experiment.py"), "--level_name=CartPole-v1",
                           "--agent_name=MLPAgent", bad], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode != 0
    name = bad.split("=")[0]
    assert name in proc.stderr or name.lstrip("-") in proc.stderr


def test_sgd_passes_and_minibatches_on_42x42_pong(tmp_path):
    """num_sgd_iter x num_minibatches gradient steps per update (Adam counts them), on
    --width=--height=42 Atari frames; the frame counter moves once."""
    f = _experiment_defaults(level_name="PongNoFrameskip-v4", agent_name="SimpleConvNetAgent", width=42,
                             height=42, batch_size=4, unroll_length=5, optimizer="adam", num_sgd_iter=3,
                             num_minibatches=2, clip_param=0.2, learning_rate=1e-3,
                             total_environment_frames=10 ** 6)
    lrn = learner.Learner(f, str(tmp_path))
    # Native Pong (the default backend): unrolls carry 4 + T frames, rebuilt into T + 1 stacks.
    assert lrn.spec.fields[0].name == "frames" and lrn.spec.fields[0].shape == (9, 42, 42)
    assert lrn.zero_batch(4)["observation"].shape == (6, 4, 42, 42, 4)
    rng = np.random.default_rng(0)
    B, T = 4, 5
    batch = {"observation": rng.integers(0, 255, (T + 1, B, 42, 42, 4)).astype(np.uint8),
             "first": np.zeros((T + 1, B), bool), "action": rng.integers(0, 6, (T, B)).astype(np.int32),
             "reward": rng.normal(size=(T, B)).astype(np.float32), "done": np.zeros((T, B), bool),
             "behaviour_logits": rng.normal(size=(T, B, 6)).astype(np.float32)}
    # Every field the transport delivers, as the learner's loop passes them.
    full = lrn.zero_batch(B)
    full.update(batch)
    before = lrn.flat_weights()
    lrn.warm_up()  # traces without running: nothing moves
    np.testing.assert_array_equal(before, lrn.flat_weights())
    assert int(lrn.optimizer.step.numpy()) == 0
    stats = lrn._train_step({k: tf.constant(v) for k, v in full.items()}, tf.constant(80, tf.int64))
    assert lrn._train_step.experimental_get_tracing_count() == 1  # the warm-up's graph was used
    assert int(lrn.optimizer.step.numpy()) == 3 * 2
    assert int(lrn.update_step.numpy()) == 1 and int(lrn.num_env_frames.numpy()) == 80
    assert np.isfinite(float(stats["total_loss"]))
    assert not np.allclose(before, lrn.flat_weights())


def test_value_scale_trains_the_head_on_standardised_returns():
    """--normalize_returns: the agent reports raw * std + mean; measuring the baseline's error
    in units of std gives the raw head the gradient of a regression on (vs - mean) / std."""
    T, B, A = 5, 3, 4
    batch = _batch(T, B, A)
    rng = np.random.default_rng(3)
    logits = tf.constant(rng.normal(size=(T + 1, B, A)), tf.float32)
    raw = tf.Variable(rng.normal(size=(T + 1, B)).astype(np.float32))
    mean, std = 0.5, 3.0
    flags = _flags(entropy_cost=0.0, baseline_cost=0.5, reward_clipping="none")
    with tf.GradientTape() as tape:
        out = _out(logits, raw * std + mean)
        loss, stats = loss_lib.compute_losses(out, batch, flags, value_scale=std)
    grad = tape.gradient(loss, raw).numpy()
    vs = loss_lib.vtrace_targets(out, batch, flags).vs.numpy()
    np.testing.assert_allclose(grad[:T], 0.5 * (raw.numpy()[:T] - (vs - mean) / std), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(grad[T], 0.0)  # the bootstrap value is only in the targets
    np.testing.assert_allclose(float(stats["baseline_loss"]),
                               0.25 * np.sum(((vs - (raw.numpy()[:T] * std + mean)) / std) ** 2), rtol=1e-4)


def _one_update(tmp_path, level, weights=None, **kw):
    """One learner update (RMSProp: its first step is linear in the gradient) on a fixed batch
    of random states, acted with the learner's own policy; returns the weights before and
    after it (and starts from `weights` when given)."""
    flags = _experiment_defaults(level_name=level, agent_name="MLPAgent", batch_size=4, unroll_length=5,
                                 optimizer="rmsprop", learning_rate=1e-2, total_environment_frames=10 ** 6, **kw)
    lrn = learner.Learner(flags, str(tmp_path / ("run%d" % len(os.listdir(tmp_path)))))
    if weights is not None:
        agent_lib.make_weight_setter(nets.published_variables(lrn.agent))(tf.constant(weights))
    if lrn.agent.return_normaliser is not None:  # past the first batch, which replaces the prior
        lrn.agent.return_normaliser.count.assign(1000.0)
    rng = np.random.default_rng(0)
    T, B = 5, 4
    obs = rng.normal(size=(T + 1, B, {"Pendulum-v1": 3, "CartPole-v1": 4}[level])).astype(np.float32)
    out, _ = lrn.agent.unroll(tf.constant(obs), tf.zeros([T + 1, B], bool), ())
    sampled = out.action.numpy()[:-1]
    batch = {"observation": obs, "first": np.zeros((T + 1, B), bool), "action": sampled,
             "reward": rng.normal(size=(T, B)).astype(np.float32), "done": np.zeros((T, B), bool),
             "behaviour_logits": out.policy_logits.numpy()[:-1]}
    before = lrn.flat_weights()
    lrn._train_step({k: tf.constant(v) for k, v in batch.items()}, tf.constant(20, tf.int64))
    return before, lrn.flat_weights()


@pytest.mark.parametrize("level, kw", [
    ("Pendulum-v1", dict(clip_param=0.1, clip_ratio_to="batch_start", normalize_returns=True,
                         normalize_advantages=True)),
    ("Pendulum-v1", dict(clip_param=0.1, clip_ratio_to="behaviour")),
    ("CartPole-v1", dict(clip_param=0.1, clip_ratio_to="fresh_batch_start")),
    ("CartPole-v1", dict())])
def test_targets_fixed_at_the_batch_start_equal_every_step_targets_in_a_single_step(tmp_path, level, kw):
    """--vtrace_targets=batch_start computes V-trace once per batch; with one gradient step per
    batch that step sees the same values as every_step's, so the updates agree (Gaussian and
    discrete heads, the clipped surrogate against pi_old or mu, and IMPALA's policy gradient)."""
    start, every = _one_update(tmp_path, level, vtrace_targets="every_step", **kw)
    _, fixed = _one_update(tmp_path, level, weights=start, vtrace_targets="batch_start", **kw)
    assert not np.allclose(start, every)
    np.testing.assert_allclose(fixed, every, rtol=1e-4, atol=1e-6)


def test_targets_fixed_at_the_batch_start_do_not_follow_the_values():
    """With the targets in the batch, a step's baseline loss is measured against them, not
    against targets bootstrapped from the values the step sees."""
    batch = _batch()
    T, B = batch["action"].shape
    fixed_vs = np.full((T, B), 3.0, np.float32)
    flags = _flags(vtrace_lambda=0.9)
    logits = tf.concat([batch["behaviour_logits"], batch["behaviour_logits"][:1]], axis=0)
    out = _out(logits, tf.ones([T + 1, B]))
    vt = loss_lib.vtrace_targets(out, batch, flags)._replace(vs=tf.constant(fixed_vs))
    _, stats = loss_lib.compute_losses(out, dict(batch, **loss_lib.fixed_targets(vt)), flags)
    np.testing.assert_allclose(stats["baseline_loss"], flags.baseline_cost * 0.5 * T * B * (3.0 - 1.0) ** 2, rtol=1e-5)
    _, moving = loss_lib.compute_losses(out, batch, flags)
    assert not np.isclose(moving["baseline_loss"], stats["baseline_loss"])


@pytest.mark.parametrize("kw", [dict(), dict(normalize_advantages=True, normalize_returns=True)])
def test_one_minibatch_of_all_the_steps_gives_the_update_of_the_whole_batch(tmp_path, kw):
    """--minibatch_over=steps with one minibatch trains on every step of the batch in a random
    order; the loss is a sum over steps, so the update is the whole batch's."""
    kw = dict(kw, level="Pendulum-v1", clip_param=0.1, clip_ratio_to="batch_start", vtrace_targets="batch_start")
    start, whole = _one_update(tmp_path, minibatch_over="unrolls", **kw)
    _, steps = _one_update(tmp_path, weights=start, minibatch_over="steps", **kw)
    assert not np.allclose(start, whole)
    np.testing.assert_allclose(steps, whole, rtol=1e-4, atol=1e-6)


def test_step_minibatches_hold_each_step_once_with_its_own_fields():
    """One pass of --minibatch_over=steps's slices covers every (t, b) of the batch once, each
    row's observation, action and fixed target from the same step, and most minibatches mix
    unrolls (a minibatch of unrolls holds one stretch of one unroll)."""
    T, B, parts = 6, 4, 3
    tb = np.arange(T * B, dtype=np.float32).reshape(T, B)
    obs = np.concatenate([tb, np.full((1, B), -1.0, np.float32)])[..., None].repeat(2, axis=-1)
    batch = {"observation": tf.constant(obs), "first": tf.zeros([T + 1, B], bool),
             "action": tf.constant(tb[..., None] + 0.5), BATCH_START_PREFIX + "vs": tf.constant(2 * tb),
             "core_state_0": tf.zeros([B, 3])}
    flat = batches.step_fields(batch)
    order = tf.random.shuffle(tf.range(T * B), seed=3)
    size = T * B // parts
    seen, mixed = [], 0
    for i in range(parts):
        mb = batches.step_minibatch(flat, order[i * size:(i + 1) * size])
        assert mb["observation"].shape == (size + 1, 1, 2) and mb["action"].shape == (size, 1, 1)
        ids = mb["observation"].numpy()[:-1, 0, 0]
        np.testing.assert_array_equal(mb["action"].numpy()[:, 0, 0], ids + 0.5)
        np.testing.assert_array_equal(mb[BATCH_START_PREFIX + "vs"].numpy()[:, 0], 2 * ids)
        assert "core_state_0" not in mb
        seen += list(ids)
        mixed += len(set(ids.astype(int) % B)) > 1
    assert sorted(seen) == list(range(T * B))
    assert mixed >= parts - 1


def _values_after_updates(preserve, updates=40):
    """A CartPole MLP agent whose value head starts with a wide spread (x 20), trained on
    nothing: each update's targets are 0.98 x its own values of a fixed batch of states
    (zero rewards), as V-trace's are when the episodes go on. Returns (values before,
    values after, the return normaliser's std after)."""
    tf.random.set_seed(0)
    agent, _, _ = agent_lib.build_agent("CartPole-v1", "MLPAgent", 5, normalize_returns=True)
    head = agent._heads.value_layer
    head.w.assign(head.w * 20.0)
    obs = tf.constant(np.random.default_rng(1).normal(size=(6, 8, 4)).astype(np.float32))
    values = lambda: agent(tf.reshape(obs, [-1, 4]), tf.zeros([48], bool), ())[0].baseline.numpy()
    update = lambda: agent.update_return_statistics(tf.constant(0.98 * values().reshape(6, 8)),
                                                    preserve_outputs=preserve)
    untrained = values()
    update()  # the first targets replace the prior statistics (mean 0, std 1) and move the values
    before = values()
    assert not np.allclose(before, untrained, rtol=0.1)
    for _ in range(updates):
        update()
    return before, values(), float(agent.return_normaliser.std())


def test_moving_return_statistics_leave_the_values_in_return_units_as_they_were():
    """--preserve_value_outputs (PopArt): after the first targets, the head's last layer is
    rescaled with every move of the statistics, so the values the actors and V-trace read do
    not move with them and the statistics settle on the targets' own spread. The plain normaliser moves every value
    with its statistics, the bootstrapped targets follow, and here its std grows by orders
    of magnitude in 40 updates, or overflows (as a HalfCheetah run's did)."""
    before, after, std = _values_after_updates(preserve=True)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * np.abs(before).max())
    assert 0.3 * before.std() < std < 3 * before.std()
    before, after, std = _values_after_updates(preserve=False)
    assert not std < 1000 * before.std()  # far larger, or overflowed to NaN on other initial weights
    assert not np.abs(after).max() < 1000 * np.abs(before).max()


def test_observation_statistics_move_once_per_batch_and_travel_with_the_weights(tmp_path):
    """--normalize_observations and --normalize_returns: one update of the statistics per
    batch (not per gradient step), from the batch's T x B observations and value targets;
    the published weights carry them, so an actor's agent set from them acts as the
    learner's; checkpoints keep them."""
    f = _experiment_defaults(level_name="PongNoFrameskip-v4", agent_name="SimpleConvNetAgent", width=42,
                             height=42, batch_size=4, unroll_length=5, optimizer="adam", num_sgd_iter=2,
                             num_minibatches=2, clip_param=0.2, normalize_observations=True,
                             normalize_returns=True, total_environment_frames=10 ** 6)
    lrn = learner.Learner(f, str(tmp_path))
    rng = np.random.default_rng(0)
    B, T = 4, 5
    obs = rng.integers(0, 255, (T + 1, B, 42, 42, 4)).astype(np.uint8)
    full = lrn.zero_batch(B)
    full.update(observation=obs, action=rng.integers(0, 6, (T, B)).astype(np.int32),
                behaviour_logits=rng.normal(size=(T, B, 6)).astype(np.float32))
    norm, ret = lrn.agent.obs_normaliser, lrn.agent.return_normaliser
    lrn._train_step({k: tf.constant(v) for k, v in full.items()}, tf.constant(80, tf.int64))
    assert int(lrn.optimizer.step.numpy()) == 4 and float(norm.count.numpy()) == 1 + T * B
    assert float(ret.count.numpy()) == 1 + T * B and float(ret.var.numpy()) != 1.0
    seen = obs[:-1].reshape(T * B, 42, 42, 4) / 255.0  # the bootstrap observation is the next unroll's first
    np.testing.assert_allclose(norm.mean.numpy(), seen.sum(0) / (1 + T * B), atol=1e-5)
    weights = lrn.flat_weights()
    assert weights.size == lrn.spec.weights_size
    agent, _, _ = agent_lib.build_agent(f.level_name, f.agent_name, T, (42, 42),
                                                normalize_observations=True, normalize_returns=True)
    agent_lib.make_weight_setter(nets.published_variables(agent))(tf.constant(weights))
    np.testing.assert_array_equal(agent.obs_normaliser.var.numpy(), norm.var.numpy())
    np.testing.assert_array_equal(agent.return_normaliser.mean.numpy(), ret.mean.numpy())
    first = np.zeros(B, bool)
    mine, theirs = agent(obs[0], first, ())[0], lrn.agent(obs[0], first, ())[0]
    np.testing.assert_allclose(mine.policy_logits.numpy(), theirs.policy_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(mine.baseline.numpy(), theirs.baseline.numpy(), atol=1e-5)
    prefix = lrn.save()
    restored = learner.Learner(f, str(tmp_path / "restored"))
    restored.restore(prefix)
    np.testing.assert_array_equal(restored.agent.obs_normaliser.mean.numpy(), norm.mean.numpy())
    assert float(restored.agent.obs_normaliser.count.numpy()) == 1 + T * B
    np.testing.assert_array_equal(restored.agent.return_normaliser.var.numpy(), ret.var.numpy())


@pytest.mark.parametrize("option,flag", [("normalize_observations", "--normalize_observations"),
                                         ("normalize_returns", "--normalize_returns")])
@pytest.mark.parametrize("saved,built", [(True, False), (False, True)])
def test_a_restore_never_drops_the_normaliser_statistics(tmp_path, option, flag, saved, built):
    """--mode=test restores only the agent (expect_partial): a checkpoint's normaliser statistics
    into an agent built without that normaliser (options.json missing, or not saying it was on)
    would be dropped, and an agent whose normaliser the checkpoint lacks would play on its initial
    statistics. Either is refused in one line naming the checkpoint and the flag."""
    def agent(on):
        return agent_lib.build_agent("CartPole-v1", "MLPAgent", 5, **{option: on})[0]
    prefix = tf.train.Checkpoint(agent=agent(saved)).save(str(tmp_path / "ckpt"))
    for full in (False, True):
        with pytest.raises(learner.CheckpointMismatch) as e:
            learner.restore_newest_readable(tf.train.Checkpoint(agent=agent(built)), prefix, full=full)
        msg = str(e.value)
        assert prefix in msg and flag[2:] in msg and "\n" not in msg, msg
    assert learner.restore_newest_readable(tf.train.Checkpoint(agent=agent(saved)), prefix, full=False) == prefix


@pytest.mark.parametrize("saved,built", [(True, False), (False, True)])
def test_a_restore_never_plays_a_layer_norm_the_checkpoint_did_not_train(tmp_path, saved, built):
    """--lstm_input_norm adds a layer norm before the LSTM: a test-mode restore (expect_partial) into
    an agent built with it from a checkpoint trained without it would play the norm's initial scale
    and offset, and the other way round would drop the trained ones, either a policy unlike the one
    trained. Refused in one line naming the checkpoint and the flag."""
    def agent(on):
        return agent_lib.build_agent("CartPole-v1", "MLPLSTMAgent", 5, net={"lstm_input_norm": on})[0]
    prefix = tf.train.Checkpoint(agent=agent(saved)).save(str(tmp_path / "ckpt"))
    for full in (False, True):
        with pytest.raises(learner.CheckpointMismatch) as e:
            learner.restore_newest_readable(tf.train.Checkpoint(agent=agent(built)), prefix, full=full)
        msg = str(e.value)
        assert prefix in msg and "--%slstm_input_norm" % ("no" if built else "") in msg and "\n" not in msg, msg
    assert learner.restore_newest_readable(tf.train.Checkpoint(agent=agent(saved)), prefix, full=False) == prefix


def feed_half_replayed(lrn, fill, updates=4):
    """Trains `updates` batches of a learner whose replay takes part of each batch, its fresh unrolls
    random observations and whatever fill(fields, rng) writes; returns the fresh unrolls fed."""
    rng = np.random.default_rng(0)
    fed = 0
    for _ in range(updates):
        n = lrn.live_needed()
        live = {fld.name: np.zeros((n,) + fld.shape, fld.dtype) for fld in lrn.spec.fields}
        live["observation"][:] = rng.normal(size=live["observation"].shape)
        fill(live, rng)
        lrn._train_step(lrn.to_tensors(lrn.make_batch(live)), tf.constant(n * lrn.flags.unroll_length, tf.int64))
        fed += n
    assert fed < updates * lrn.flags.batch_size  # replay filled part of the later batches
    return fed


def test_replayed_unrolls_do_not_move_the_statistics_again(tmp_path):
    """With half of each batch from replay, the observation and return statistics count each
    unroll once, when it is new: T samples per fresh unroll, none per replayed one."""
    replay = ('[{"type":"queue","capacity":1,"sample_ratio":0.5},'
              '{"type":"standard","capacity":16,"sample_ratio":0.5}]')
    f = _experiment_defaults(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=4, unroll_length=5,
                             replay_parameters=replay, normalize_observations=True, normalize_returns=True,
                             total_environment_frames=10 ** 6)
    lrn = learner.Learner(f, str(tmp_path))
    fed = feed_half_replayed(lrn, lambda live, rng: None)
    assert float(lrn.agent.obs_normaliser.count.numpy()) == 1 + 5 * fed
    assert float(lrn.agent.return_normaliser.count.numpy()) == 1 + 5 * fed


_REPLAY = ('[{"type":"queue","capacity":1,"sample_ratio":0.5},'
           '{"type":"standard","capacity":16,"sample_ratio":0.5}]')


def _replay_learner(path, rank=0, size=1, **kw):
    f = _experiment_defaults(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=4, unroll_length=5,
                             replay_parameters=_REPLAY, total_environment_frames=10 ** 6, **kw)
    return learner.Learner(f, str(path), rank, size)


def _feed_replay(lrn, updates, seed):
    rng = np.random.default_rng(seed)
    for _ in range(updates):
        n = lrn.live_needed()
        live = {fld.name: np.zeros((n,) + fld.shape, fld.dtype) for fld in lrn.spec.fields}
        live["observation"][:] = rng.normal(size=live["observation"].shape)
        lrn.make_batch(live)
        lrn.update_step.assign_add(1)


def test_a_resume_that_falls_back_gets_the_replay_state_of_its_own_checkpoint(tmp_path):
    """Two checkpoints with different replay RNG states; the newest one unreadable: the
    resume from the older one must draw as the older one's replay would have, and each rank
    must get its own stream back (not rank 0's)."""
    ranks = [_replay_learner(tmp_path, rank=r, size=2) for r in (0, 1)]
    states = {}
    for step in (1, 2):
        for lrn in ranks:
            _feed_replay(lrn, 1, seed=step)
            lrn.save()
            states[step, lrn.rank] = lrn.mixer.rng.bit_generator.state
    assert states[1, 1] != states[2, 1] and states[1, 0] != states[1, 1]
    with open(ranks[0].manager.latest_checkpoint + ".index", "wb") as fh:
        fh.write(b"torn")
    for rank in (0, 1):
        resumed = _replay_learner(tmp_path / ("resumed%d" % rank), rank=rank, size=2)
        prefix = resumed.restore(str(tmp_path))
        assert prefix.endswith("ckpt-1")  # the older one
        assert resumed.mixer.rng.bit_generator.state == states[1, rank]


def test_checkpoint_replay_brings_the_buffer_contents_back(tmp_path):
    """--checkpoint_replay: the stored unrolls, their sample counts and the queue's carried
    unrolls come back with the checkpoint; without it the buffers start empty."""
    from impala import replay_files
    lrn = _replay_learner(tmp_path, checkpoint_replay=True)
    _feed_replay(lrn, 5, seed=0)
    before, stored = replay_files.digest(lrn.mixer), replay_files.stored_unrolls(lrn.mixer)
    prefix = lrn.save()
    assert stored > 4
    resumed = _replay_learner(tmp_path / "resumed", checkpoint_replay=True)
    resumed.restore(prefix)
    assert replay_files.digest(resumed.mixer) == before
    assert replay_files.stored_unrolls(resumed.mixer) == stored
    item_a, item_b = lrn.mixer.buffers[0].item(3), resumed.mixer.buffers[0].item(3)
    for k in item_a:
        np.testing.assert_array_equal(item_a[k], item_b[k])
    plain = _replay_learner(tmp_path / "plain")
    _feed_replay(plain, 5, seed=0)
    fresh = _replay_learner(tmp_path / "plain-resumed")
    fresh.restore(plain.save())
    assert replay_files.stored_unrolls(fresh.mixer) == 0
    assert fresh.mixer.rng.bit_generator.state == plain.mixer.rng.bit_generator.state


def test_minibatches_must_divide_the_batch():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(root, "experiment.py"), "--level_name=CartPole-v1",
                           "--agent_name=MLPAgent", "--batch_size=6", "--num_minibatches=4"],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode != 0 and "--num_minibatches" in proc.stderr


def test_orthogonal_init_gains_and_zero_biases():
    agent = nets.make_agent("SimpleConvNetAgent", 6)
    agent(tf.zeros([1, 42, 42, 4], tf.uint8), tf.ones([1], bool), ())
    nets.orthogonal_init(agent, seed=1)
    for v in agent.trainable_variables:
        if v.name.endswith("/b:0"):
            assert not np.any(v.numpy())
            continue
        w = v.numpy().reshape(-1, v.shape[-1])
        gain = 0.01 if "policy_logits" in v.name else 1.0 if "baseline" in v.name else 2 ** 0.5
        # Orthogonal columns (fan_in >= fan_out here): W^T W = gain^2 I.
        np.testing.assert_allclose(w.T @ w, gain ** 2 * np.eye(w.shape[1]), atol=1e-4 * max(1, gain ** 2))


def _torso_scale(agent_name):
    """The std of an agent's torso features on unit-normal 42x42x4 input after orthogonal_init."""
    agent = nets.make_agent(agent_name, 6)
    agent(tf.zeros([1, 42, 42, 4], tf.uint8), tf.ones([1], bool), agent.initial_state(1))
    nets.orthogonal_init(agent, seed=1)
    torso = [m for m in agent.submodules if m.name.endswith("torso")][0]
    return float(tf.math.reduce_std(torso(tf.random.stateless_normal([16, 42, 42, 4], seed=[1, 2]))))


@pytest.mark.parametrize("agent_name", ["ResNetAgent", "ResNetLSTMAgent"])
def test_orthogonal_init_keeps_the_residual_torso_at_the_shallow_nets_scale(agent_name):
    """He's gain on every conv of the deep IMPALA torso, whose stream has no ReLU between its
    sections' convs and max-pools, gave features 30x the shallow net's (std 20.7 against 0.64):
    every Adam step then moved the logits that much further. Its convs keep Sonnet's init."""
    shallow, deep = _torso_scale("SimpleConvNetAgent"), _torso_scale(agent_name)
    assert deep < 3 * shallow, (deep, shallow)


@pytest.mark.parametrize("decay,expected", [("linear", 0.5e-3), ("none", 1e-3)])
def test_learning_rate_decay(tmp_path, decay, expected):
    """linear: the rate falls to 0 at --total_environment_frames (half way: half the rate);
    none: it stays at --learning_rate."""
    f = _experiment_defaults(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=2, unroll_length=3,
                             learning_rate=1e-3, learning_rate_decay=decay, total_environment_frames=100)
    lrn = learner.Learner(f, str(tmp_path))
    rng = np.random.default_rng(0)
    batch = {"observation": rng.normal(size=(4, 2, 4)).astype(np.float32), "first": np.zeros((4, 2), bool),
             "action": np.zeros((3, 2), np.int32), "reward": np.ones((3, 2), np.float32),
             "done": np.zeros((3, 2), bool), "behaviour_logits": np.zeros((3, 2, 2), np.float32)}
    for _ in range(2):  # the rate of a step follows the frames counted before it
        lrn._train_step({k: tf.constant(v) for k, v in batch.items()}, tf.constant(50, tf.int64))
    assert float(lrn.learning_rate.numpy()) == pytest.approx(expected)


def test_a_resume_takes_the_learning_rate_from_the_command_line(tmp_path):
    """The optimizer's learning-rate variable is in the checkpoint; with
    --learning_rate_decay=none a resume with a new --learning_rate must train with the new one."""
    def make(rate, folder):
        f = _experiment_defaults(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=2, unroll_length=3,
                                 learning_rate=rate, learning_rate_decay="none", total_environment_frames=100)
        return learner.Learner(f, str(tmp_path / folder))
    prefix = make(1e-3, "first").save()
    resumed = make(2.5e-4, "resumed")
    resumed.restore(prefix)
    assert float(resumed.learning_rate.numpy()) == pytest.approx(2.5e-4)
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(2.5e-4)


def test_a_time_limit_bootstraps_from_the_actors_value():
    """done with timeout_value V: the target at that step is r + gamma V (a time limit is
    not a terminal state); without it, r alone."""
    batch = {"reward": tf.constant([[1.0, 1.0]]), "done": tf.constant([[True, True]]),
             "timeout_value": tf.constant([[0.0, 10.0]]), "action": tf.constant([[0, 0]]),
             "behaviour_logits": tf.zeros([1, 2, 2])}
    out = _out(tf.zeros([2, 2, 2]), tf.zeros([2, 2]))
    flags = _flags(discounting=0.9, baseline_cost=1.0, entropy_cost=0.0, reward_clipping="abs_one")
    _, stats = loss_lib.compute_losses(out, batch, flags)
    # targets 1 and 1 + 0.9 * 10 (the reward is clipped, the bootstrap is not); V = 0
    assert float(stats["baseline_loss"]) == pytest.approx(0.5 * (1.0 ** 2 + 10.0 ** 2))


# ---------------------------------------------------------------- train() in this process
_FPU = 5  # frames per CartPole unroll: unroll_length 5 x 1 frame per step


class _Feeder(threading.Thread):
    """Plays an actor: enqueues seeded random CartPole unrolls, one at a time (so that the
    order in the queue is the same in every run), until the learner closes its queue."""

    def __init__(self, address, spec, capacity, batch_size, on_version=None):
        super().__init__(daemon=True, name="test-feeder")
        self.client = transport.ActorClient(address, spec, capacity, batch_size)
        self.spec, self.on_version = spec, on_version
        self.halt = threading.Event()
        self.sent = 0

    def _unroll(self, rng):
        buf = {f.name: np.zeros((1,) + f.shape, f.dtype) for f in self.spec.fields}
        T = buf["action"].shape[1]
        buf["observation"][:] = rng.normal(size=buf["observation"].shape)
        buf["action"][:] = rng.integers(0, 2, size=(1, T))
        buf["reward"][:] = rng.normal(size=(1, T))
        buf["done"][:] = buf["episode_end"][:] = rng.random((1, T)) < 0.2
        buf["episode_return"][:] = 10.0
        buf["episode_length"][:] = 10
        buf["behaviour_logits"][:] = rng.normal(size=buf["behaviour_logits"].shape)
        buf["policy_version"][:] = self.sent
        # Numbered like a real actor's (sender.py): the learner drops a repeat, so a re-sent
        # unroll never shifts the stream the runs are compared on.
        buf["sender"][:] = 1
        buf["sequence"][:] = self.sent + 1
        return buf

    def run(self):
        if not self.client.connect(60):
            return
        rng = np.random.default_rng(0)
        buf = self._unroll(rng)
        while not self.halt.is_set():
            try:
                self.client.enqueue(buf, timeout_ms=200)
            except tf.errors.DeadlineExceededError:
                # Queue full, or the deadline fell after the queue took it (an in-process call
                # is cancelled only after it finished): the same numbered unroll again.
                continue
            except tf.errors.OpError:
                return  # the learner closed its queue
            self.sent += 1
            buf = self._unroll(rng)
            if self.on_version is not None:
                got = self.client.fetch_weights_if_new()
                if got is not None:
                    self.on_version(got[0])


def _train_in_process(tmp_path, monkeypatch, feed=True, on_version=None, **overrides):
    """training.train() on a real transport server in this process, fed by a _Feeder thread.
    Returns (exit code, summary.json, log lines, unrolls dequeued by each thread); the
    feeder's send numbers of the unrolls dequeued, in order, are in dequeued.versions."""
    f = _experiment_defaults(**dict(dict(
        level_name="CartPole-v1", agent_name="MLPAgent", batch_size=4, unroll_length=_FPU, queue_capacity=8,
        total_environment_frames=6 * 4 * _FPU, log_every_s=0.0, exit_when_no_actors_s=30.0), **overrides))
    dequeued, versions = collections.Counter(), []
    real_try_dequeue = transport.LearnerTransport.try_dequeue

    def counting_try_dequeue(self, n=None):
        got = real_try_dequeue(self, n)
        if got is not None:
            dequeued[threading.current_thread().name] += len(got["actor_id"])
            versions.extend(got["policy_version"].tolist())
        return got

    monkeypatch.setattr(transport.LearnerTransport, "try_dequeue", counting_try_dequeue)
    address = "127.0.0.1:%d" % _free_base_port()
    spec = learner.Learner(f, str(tmp_path / "spec")).spec
    feeder = _Feeder(address, spec, f.queue_capacity, f.batch_size, on_version)
    if feed:
        feeder.start()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    lines = []
    try:
        code = training.train(f, str(tmp_path / "run"), address, 1, log=lines.append)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        feeder.halt.set()
        if feed:
            feeder.join(30)
    with open(tmp_path / "run" / "summary.json") as fh:
        summary = json.load(fh)
    dequeued.versions = versions
    return code, summary, lines, dequeued


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("learner-prefetch")]


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_train_reaches_the_frame_budget_exactly(tmp_path, monkeypatch, prefetch):
    """6 updates of 4 unrolls: the run stops at the budget, trains every unroll it dequeued
    (none is lost to prefetching) and writes metrics, summary and the final weights."""
    code, summary, lines, dequeued = _train_in_process(tmp_path, monkeypatch, prefetch_batches=prefetch)
    assert code == 0, lines
    assert summary["reason"] == "frame budget reached"
    assert summary["frames"] == 6 * 4 * _FPU
    assert sum(dequeued.values()) * _FPU == summary["frames"], dequeued
    # Prefetching: every batch was dequeued by the prefetch thread; without it, by the loop.
    assert set(dequeued) == {"learner-prefetch" if prefetch else "MainThread"}, dequeued
    assert summary["episodes"] > 0 and summary["time_breakdown"]["learner_learn_s"] > 0
    with open(tmp_path / "run" / "metrics.csv") as fh:
        rows = fh.read().splitlines()
    assert rows[0] == ("time_s,frames,updates,fps,mean_return_20,episodes,queue_fill,"
                       "total_loss,entropy,grad_norm,mean_return_100,bottleneck,policy_lag,"
                       "baseline_loss,mean_rho,learning_rate")
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert last["bottleneck"] in ("actors", "learner")
    # This test's unrolls carry made-up policy versions, so the lag is only checked to be a number.
    assert math.isfinite(float(last["policy_lag"])) and float(last["baseline_loss"]) >= 0
    assert float(last["learning_rate"]) > 0
    assert len(rows) == 1 + 6 and rows[-1].split(",")[1:3] == [str(6 * 4 * _FPU), "6"]
    assert any("final weights sha256" in line for line in lines)
    assert os.path.exists(summary["checkpoint"] + ".index")
    assert not _prefetch_threads()


def test_a_run_shorter_than_the_log_interval_still_ends_in_metrics_csv(tmp_path, monkeypatch):
    """With --log_every_s longer than the run, metrics.csv still gets one row, at the frames reached:
    a short run (or a long run's tail) must not vanish from the curves and tables."""
    code, summary, lines, _ = _train_in_process(tmp_path, monkeypatch, log_every_s=3600.0)
    assert code == 0, lines
    with open(tmp_path / "run" / "metrics.csv") as fh:
        rows = fh.read().splitlines()
    assert len(rows) == 2 and rows[-1].split(",")[1:3] == [str(summary["frames"]), "6"], rows


@pytest.mark.parametrize("prefetch", [0, 1])
def test_train_stops_cleanly_on_sigint(tmp_path, monkeypatch, prefetch):
    """SIGINT after 3 updates: train() returns 0 soon, with a checkpoint; at most the
    batches in flight (--prefetch_batches of them) were dequeued and not trained on."""
    sent = []

    def interrupt(version):
        if version >= 3 and not sent:
            sent.append(time.time())
            os.kill(os.getpid(), signal.SIGINT)

    code, summary, lines, dequeued = _train_in_process(
        tmp_path, monkeypatch, on_version=interrupt, total_environment_frames=10 ** 9, prefetch_batches=prefetch)
    assert sent and code == 0, lines
    assert summary["reason"] == "stopped by signal %d" % signal.SIGINT
    assert summary["checkpoint"] and summary["frames"] >= 3 * 4 * _FPU
    lost = sum(dequeued.values()) - summary["frames"] // _FPU
    assert 0 <= lost <= 4 * prefetch, (dequeued, summary["frames"])
    assert not _prefetch_threads()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_train_without_actors_exits_with_code_4(tmp_path, monkeypatch, prefetch):
    code, summary, lines, _ = _train_in_process(tmp_path, monkeypatch, feed=False, exit_when_no_actors_s=1.0,
                                                actor_timeout_s=0.5, prefetch_batches=prefetch)
    assert code == 4 and summary["reason"] == "no actors" and summary["frames"] == 0
    assert any("WARNING: no unroll from any of its 1 actor(s)" in line for line in lines)
    assert not _prefetch_threads()


_REPLAY = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "standard", "capacity": 16, "sample_ratio": 0.5}]'


@pytest.mark.slow  # two learners trained side by side, about 11 s each
@pytest.mark.parametrize("replay", [None, _REPLAY])
def test_prefetching_trains_the_same_batches_as_without(tmp_path, monkeypatch, replay):
    """The same unrolls in the same order give the same final weights with and without the
    prefetch thread; with replay (the batch made in the loop's thread, fresh unrolls per
    update varying while the buffer fills) the frame budget still ends the run exactly."""
    extra = {} if replay is None else {"replay_parameters": replay}
    runs = {}
    for prefetch in (0, 1, 3):
        code, summary, lines, dequeued = _train_in_process(
            tmp_path / str(prefetch), monkeypatch, prefetch_batches=prefetch, total_environment_frames=10 * 4 * _FPU,
            **extra)
        assert code == 0 and summary["reason"] == "frame budget reached", lines
        versions = dequeued.versions
        assert sum(dequeued.values()) * _FPU == summary["frames"], dequeued
        # Every unroll once, in the order sent (a repeat was dropped, never trained on twice).
        assert versions == list(range(len(versions))), versions
        with open(tmp_path / str(prefetch) / "run" / "metrics.csv") as fh:
            updates = len(fh.read().splitlines()) - 1
        runs[prefetch] = (summary["frames"], updates, [line for line in lines if "final weights sha256" in line])
    assert runs[0] == runs[1] == runs[3] and runs[0][2]
    # With replay half of each batch is fresh once the buffer holds 2 unrolls: more updates.
    assert runs[0][1] == 10 if replay is None else runs[0][1] > 15
    assert not _prefetch_threads()
