"""Sonnet's Adam with each variable's update in one fused kernel.

snt.optimizers.Adam builds its update from about ten elementwise ops per variable (two moment
updates, two bias corrections, a square root, a division, the assignments), each a pass over the
variable's memory. TensorFlow's ResourceApplyAdam does the same arithmetic in one pass per
variable: the Pong recipe's update (16 gradient steps of a 0.7M-weight net) runs 1.04x faster
with it on a 2-core AMD EPYC (bench/kernels.py optimizer; bench/results/<machine>/optimizer.md).

The update is Sonnet's exactly, not Keras's approximation: the fused kernel computes
    var -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps'),
which equals Sonnet's lr m_hat / (sqrt(v_hat) + eps) when eps' = eps sqrt(1 - b2^t), so eps'
is passed. The variables (step, m, v) are Sonnet's own, so checkpoints written with either class
restore into the other (tests/test_optimizers.py checks both)."""
import sonnet as snt
import tensorflow as tf
from sonnet.src.optimizers import optimizer_utils


class FusedAdam(snt.optimizers.Adam):

    def apply(self, updates, parameters):
        """As snt.optimizers.Adam.apply; sparse updates (tf.IndexedSlices) take Sonnet's path."""
        if any(isinstance(u, tf.IndexedSlices) for u in updates):
            return super().apply(updates, parameters)
        optimizer_utils.check_distribution_strategy()
        optimizer_utils.check_updates_parameters(updates, parameters)
        self._initialize(parameters)
        self.step.assign_add(1)
        for update, param, m_var, v_var in zip(updates, parameters, self.m, self.v):
            if update is None:
                continue
            optimizer_utils.check_same_dtype(update, param)
            cast = lambda x: tf.cast(x, update.dtype)  # noqa: E731
            beta_1, beta_2, step = cast(self.beta1), cast(self.beta2), cast(self.step)
            beta_2_power = tf.pow(beta_2, step)
            tf.raw_ops.ResourceApplyAdam(
                var=param.handle, m=m_var.handle, v=v_var.handle, beta1_power=tf.pow(beta_1, step),
                beta2_power=beta_2_power, lr=cast(self.learning_rate), beta1=beta_1, beta2=beta_2,
                epsilon=cast(self.epsilon) * tf.sqrt(1.0 - beta_2_power), grad=update, use_locking=False)
