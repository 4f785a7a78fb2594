"""impala/optimizers.py's FusedAdam: Sonnet's Adam, step for step, and checkpoints of either restore
into the other."""
import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

from impala.optimizers import FusedAdam

SHAPES = [(7, 5), (5,), (3, 3, 2, 4)]


def _variables(seed):
    rng = np.random.RandomState(seed)
    return [tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]


def _gradients(rng):
    # Mixed scales, as a net's layers have: the moments and eps' both matter.
    return [tf.constant(rng.standard_normal(s).astype(np.float32) * 10.0 ** rng.randint(-4, 2)) for s in SHAPES]


def _state(opt, variables):
    return [v.numpy() for v in variables + opt.m + opt.v] + [opt.step.numpy()]


@pytest.mark.parametrize("epsilon", [1e-8, 0.0026, 1.0])
def test_fused_adam_takes_sonnets_steps(epsilon):
    """60 steps on the same gradients, in a tf.function as the learner runs them: the same
    weights and moments to float32 rounding, with a variable skipped (None) now and then."""
    ours, theirs = _variables(0), _variables(0)
    fused, sonnet = FusedAdam(1e-2, epsilon=epsilon), snt.optimizers.Adam(1e-2, epsilon=epsilon)
    apply_fused = tf.function(lambda g: fused.apply(g, ours))
    apply_sonnet = tf.function(lambda g: sonnet.apply(g, theirs))
    rng = np.random.RandomState(1)
    for step in range(60):
        grads = _gradients(rng)
        if step % 7 == 3:
            grads[1] = None
        apply_fused(grads), apply_sonnet(grads)
    for a, b in zip(_state(fused, ours), _state(sonnet, theirs)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    assert fused.step.numpy() == 60


def test_fused_adam_sparse_update_is_sonnets():
    """An embedding's gradient (tf.IndexedSlices) goes through Sonnet's own sparse path."""
    ours, theirs = tf.Variable(tf.ones([6, 3])), tf.Variable(tf.ones([6, 3]))
    fused, sonnet = FusedAdam(0.1), snt.optimizers.Adam(0.1)
    for opt, var in ((fused, ours), (sonnet, theirs)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(var, [1, 4, 4]) ** 2)
        grad = tape.gradient(loss, [var])
        assert isinstance(grad[0], tf.IndexedSlices)
        opt.apply(grad, [var])
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
    assert ours.numpy()[0, 0] == 1.0 and ours.numpy()[1, 0] < 1.0


@pytest.mark.parametrize("first,second", [(FusedAdam, snt.optimizers.Adam), (snt.optimizers.Adam, FusedAdam)])
def test_fused_adam_checkpoints_are_sonnets(tmp_path, first, second):
    """A run can resume with either class: the step and the moments come back."""
    variables = _variables(0)
    opt = first(1e-3)
    rng = np.random.RandomState(2)
    for _ in range(5):
        opt.apply(_gradients(rng), variables)
    path = tf.train.Checkpoint(opt=opt, v=variables).save(str(tmp_path / "ckpt"))
    fresh_vars, fresh = _variables(3), second(1e-3)
    fresh.apply([tf.zeros_like(v) for v in fresh_vars], fresh_vars)  # slots made, as make_optimizer does
    tf.train.Checkpoint(opt=fresh, v=fresh_vars).restore(path).assert_consumed()
    for a, b in zip(_state(opt, variables), _state(fresh, fresh_vars)):
        np.testing.assert_array_equal(a, b)


def test_learner_update_is_the_same_with_sonnets_adam(tmp_path):
    """The learner's whole update (3 passes in its graph loop, the skip of non-finite steps)
    moves the weights as with Sonnet's Adam, which bench/kernels.py's optimizer lever swaps in."""
    from bench import kernels
    from impala import learner
    from tests.test_learner import _experiment_defaults
    f = _experiment_defaults(level_name="CartPole-v1", agent_name="MLPAgent", batch_size=4, unroll_length=5,
                             optimizer="adam", num_sgd_iter=3, adam_epsilon=1e-5, learning_rate=0.01)
    lrn = learner.Learner(f, str(tmp_path))
    assert isinstance(lrn.optimizer, FusedAdam)
    batch, frames = kernels.random_batch(lrn), tf.constant(10, tf.int64)
    before, start = [v.numpy() for v in lrn.variables], lrn.flat_weights()
    lrn._train_step(batch, frames)
    fused = lrn.flat_weights()
    for v, b in zip(lrn.variables, before):
        v.assign(b)
    lrn.optimizer = kernels.sonnet_adam(lrn)
    assert type(lrn.optimizer) is snt.optimizers.Adam
    tf.function(lrn._step, autograph=False)(batch, frames)
    np.testing.assert_allclose(fused, lrn.flat_weights(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(fused, start)
    assert int(lrn.optimizer.step.numpy()) == 3
