"""The action distributions of the IMPALA agents' policy heads. The head outputs a distribution's
parameters as one float vector per step (`AgentOutput.policy_logits`, the unroll's
`behaviour_logits`), so that the transport, replay and V-trace carry discrete and continuous
policies alike:

    Categorical(n):   the n logits of a softmax; actions int32 [...]
    DiagGaussian(d):  the d means, then the d log standard deviations; actions float32 [..., d]

A Gaussian's actions are what the policy sampled, unbounded: its log-probability is of that
action. The env batch clips them to the action space's bounds when it steps the env
(envs/batch.py), so the probability learned from is the one the actor acted with.
"""
import math

import tensorflow as tf

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # std 0.007 .. 7.4: keeps exp() and 1/std finite


def clamp_toward(x, low, high):
    """clip(x, low, high) whose gradient passes wherever a descent step moves x toward [low, high]:
    inside it, and outside it when the loss wants x back in. A plain clip's gradient is zero
    outside, so a log-std variable that had once stepped past a bound stayed there for good
    (its std frozen at the bound); passing every gradient instead would let the variable wander
    off beyond the bound, unseen, for as long as the loss pushes it outward."""
    @tf.custom_gradient
    def clamp(v):
        def grad(dy):
            inward = tf.where(v < low, dy < 0, tf.where(v > high, dy > 0, tf.ones_like(v, tf.bool)))
            return tf.where(inward, dy, tf.zeros_like(dy))
        return tf.clip_by_value(v, low, high), grad
    return clamp(tf.convert_to_tensor(x))


class Categorical:
    continuous = False

    def __init__(self, num_actions):
        self.num_actions = self.param_size = int(num_actions)
        self.action_shape, self.action_dtype = (), tf.int32

    def sample(self, logits):
        return tf.random.categorical(logits, num_samples=1, dtype=tf.int32)[:, 0]

    def mode(self, logits):
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def log_prob(self, logits, actions):
        """log pi(a|x) for logits [..., n] and actions [...]."""
        return -tf.nn.sparse_softmax_cross_entropy_with_logits(logits=logits, labels=tf.cast(actions, tf.int32))

    def entropy(self, logits):
        return -tf.reduce_sum(tf.nn.softmax(logits) * tf.nn.log_softmax(logits), axis=-1)


class DiagGaussian:
    continuous = True

    def __init__(self, action_dim, initial_log_std=0.0, min_log_std=LOG_STD_MIN):
        self.action_dim = int(action_dim)
        if not LOG_STD_MIN <= min_log_std < LOG_STD_MAX:
            raise ValueError("--min_log_std=%g: give a floor from %g (a std of 0.007) to below %g"
                             % (min_log_std, LOG_STD_MIN, LOG_STD_MAX))
        self.min_log_std = float(min_log_std)  # the head's floor under it (PolicyValueHeads)
        if not min_log_std <= initial_log_std <= LOG_STD_MAX:  # outside, the std would start clamped
            raise ValueError("--initial_log_std=%g: give a start from the floor --min_log_std=%g to %g (a std "
                             "of %.3g to 7.4)" % (initial_log_std, min_log_std, LOG_STD_MAX, math.exp(min_log_std)))
        self.initial_log_std = float(initial_log_std)  # where the head's log-std vector starts
        self.param_size = 2 * self.action_dim
        self.action_shape, self.action_dtype = (self.action_dim,), tf.float32

    def split(self, params):
        mean, log_std = tf.split(params, 2, axis=-1)
        return mean, tf.clip_by_value(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, params):
        mean, log_std = self.split(params)
        return mean + tf.exp(log_std) * tf.random.normal(tf.shape(mean))

    def mode(self, params):
        return self.split(params)[0]

    def log_prob(self, params, actions):
        """log N(a; mean, std^2), summed over the action's dimensions: [...]."""
        mean, log_std = self.split(params)
        z = (tf.cast(actions, tf.float32) - mean) * tf.exp(-log_std)
        return tf.reduce_sum(-0.5 * tf.square(z) - log_std, axis=-1) - 0.5 * self.action_dim * math.log(2 * math.pi)

    def entropy(self, params):
        log_std = self.split(params)[1]
        return tf.reduce_sum(log_std, axis=-1) + 0.5 * self.action_dim * math.log(2 * math.pi * math.e)


def make(num_actions=None, action_dim=None, initial_log_std=0.0, min_log_std=LOG_STD_MIN):
    """Categorical for a Discrete action space of `num_actions`, DiagGaussian for a 1-D Box of
    `action_dim` (its log-std starting at `initial_log_std`, never below `min_log_std`); an int
    alone is taken as a number of discrete actions."""
    if action_dim is not None:
        if not isinstance(action_dim, int) or action_dim < 1:
            raise ValueError("a continuous action space needs a positive integer action_dim, got %r" % (action_dim,))
        return DiagGaussian(action_dim, initial_log_std, min_log_std)
    if isinstance(num_actions, (Categorical, DiagGaussian)):
        return num_actions
    try:
        count = int(num_actions) if int(num_actions) == num_actions and not isinstance(num_actions, bool) else 0
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise ValueError("a positive integer number of discrete actions is needed, got num_actions=%r (is the "
                         "env's action space continuous? then give action_dim)" % (num_actions,))
    return Categorical(count)


def of_batch(actions, params):
    """The distribution that the unrolls' `actions` and policy `params` come from: float actions
    [..., d] are a Gaussian's, integer ones a softmax's over params' last axis."""
    if actions.dtype.is_floating:
        return DiagGaussian(int(actions.shape[-1]))
    return Categorical(int(params.shape[-1]))
