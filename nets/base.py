"""What every agent shares: the output type, the policy/baseline heads, and
the two agent shapes -- feed-forward and LSTM -- built around a torso.

An agent maps observations to an `AgentOutput`:

    agent(obs[B, ...], first[B], core_state)        -> (AgentOutput[B], core_state)
    agent.unroll(obs[T, B, ...], first[T, B], state) -> (AgentOutput[T, B], state)

`first[t]` is True where obs[t] is the first observation of a new episode: the
LSTM agents reset their state to the initial state before they read obs[t].
uint8 observations (Atari frames) are scaled to [0, 1] floats here, then, with
--normalize_observations, standardised by the running statistics of a
`RunningNormaliser` (agent.obs_normaliser); with --normalize_returns the
baseline head is trained on standardised returns and reported in return units.
"""
import re
from typing import NamedTuple

import numpy as np
import sonnet as snt
import tensorflow as tf

from nets import LSTM_INPUT_NORM, distributions


class AgentOutput(NamedTuple):
    action: tf.Tensor  # sampled from policy_logits: int32 [...], or float32 [..., action_dim] (Gaussian)
    policy_logits: tf.Tensor  # float32 [..., param_size]: the policy's parameters (nets/distributions.py)
    baseline: tf.Tensor  # float32 [...]


FRAME_SCALE = 1 / 255.0  # uint8 frames -> [0, 1]


def preprocess_observation(obs, dtype=tf.float32):
    """uint8 frames -> `dtype` in [0, 1]; anything else -> float32 (its torso casts it)."""
    obs = tf.convert_to_tensor(obs)
    if obs.dtype == tf.uint8:  # 0..255 are exact in bfloat16 too
        return tf.cast(obs, dtype) * tf.constant(FRAME_SCALE, dtype)
    return tf.cast(obs, tf.float32)


class RunningNormaliser(snt.Module):
    """Running per-element mean and variance, as Sample Factory's RunningMeanStd (both kinds
    are on in its Atari settings):

    - observations (--normalize_observations): x -> clip((x - mean) / sqrt(var + 1e-5), -5, 5).
      On Pong the static screen becomes zeros and the moving ball and paddles, rare at any
      one pixel, large values.
    - returns (--normalize_returns, shape ()): the baseline head learns the value targets
      standardised by their running statistics; the agent reports its baseline in return
      units (`denormalise`), so V-trace, the actors' time-limit bootstrap and the logs see
      real values.

    The learner updates the statistics once per batch (`update`); they travel to the actors
    with the weights (`published_variables`) and are saved in the agent's checkpoints."""

    CLIP, EPS = 5.0, 1e-5

    def __init__(self, shape, name):
        super().__init__(name=name)
        shape = tuple(int(d) for d in shape)
        self.mean = tf.Variable(tf.zeros(shape), trainable=False, name="mean")
        self.var = tf.Variable(tf.ones(shape), trainable=False, name="var")
        # Samples seen (a prior of one at mean 0, variance 1); float64 so that batch/total
        # stays exact after billions of frames. Only the learner needs it: not published.
        self.count = tf.Variable(1.0, dtype=tf.float64, trainable=False, name="count")

    def std(self):
        return tf.sqrt(self.var + self.EPS)

    def __call__(self, x):  # float32 [..., *shape]
        return tf.clip_by_value((x - self.mean) / self.std(), -self.CLIP, self.CLIP)

    def denormalise(self, y):
        return y * self.std() + self.mean

    def update(self, x, average=None, mask=None):
        """Folds the moments of x [T, B, *shape] into the running ones (Chan et al.'s
        parallel formula). mask [B] (0/1): the unrolls whose samples count, so that a
        replayed unroll, already counted when it was new, does not weigh again; all when
        None. `average` (Horovod's allreduce mean over the learner ranks) makes every rank
        fold in the same moments, so their statistics stay identical."""
        m = tf.ones(tf.shape(x)[1:2]) if mask is None else tf.cast(mask, tf.float32)
        per = tf.reshape(m, tf.concat([[1, -1], tf.ones([len(self.mean.shape)], tf.int32)], 0))
        n = tf.cast(tf.shape(x)[0], tf.float32) * tf.reduce_sum(m)
        total_x, total_sq = tf.reduce_sum(x * per, axis=[0, 1]), tf.reduce_sum(tf.square(x) * per, axis=[0, 1])
        if average is not None:  # n: the mean samples per rank
            n, total_x, total_sq = average(n), average(total_x), average(total_sq)
        mean, mean_sq = total_x / tf.maximum(n, 1.0), total_sq / tf.maximum(n, 1.0)
        var = tf.maximum(mean_sq - tf.square(mean), 0.0)
        total = self.count + tf.cast(n, tf.float64)
        w = tf.cast(tf.cast(n, tf.float64) / total, tf.float32)  # the batch's weight; 0 with nothing fresh
        delta = mean - self.mean
        self.var.assign((1 - w) * self.var + w * var + tf.square(delta) * w * (1 - w))
        self.mean.assign(self.mean + delta * w)
        self.count.assign(total)


def normalisers(agent):
    """The agent's running normalisers that exist: observations, then returns."""
    return [n for n in (agent.obs_normaliser, agent.return_normaliser) if n is not None]


def published_variables(agent):
    """What the learner sends the actors: the trainable variables, then the statistics of
    the normalisers (--normalize_observations, --normalize_returns)."""
    return list(agent.trainable_variables) + [v for n in normalisers(agent) for v in (n.mean, n.var)]


def run_torso(torso, x, dtype, frame_scale=1.0):
    """torso(x * frame_scale) computed in `dtype`, float32 out; a frame_scale other than 1 is
    passed to the torso, whose first layer folds it into its weights (uint8 frames come
    unscaled: see AgentBase._preprocess). With bfloat16 the frames and, as they are
    read, the torso's float32 variables are cast to bfloat16 (the variables, the optimizer
    and everything after the torso -- LSTM, heads, losses -- stay float32; gradients flow
    back through the casts in float32). On CPUs with AVX512_BF16 or AMX oneDNN runs the
    convs and matmuls about 1.5x faster (bench/results/<machine>/compute_dtype.md)."""
    kwargs = {} if frame_scale == 1.0 else {"frame_scale": frame_scale}
    if dtype == tf.float32:
        return torso(x, **kwargs)
    if not tf.Module.trainable_variables.fget(torso):  # Sonnet builds on the first call: in float32
        torso(tf.cast(x[:1], tf.float32), **kwargs)
    cast = getattr(torso, "frozen_cast", None) or (lambda v: tf.cast(v, dtype))  # see freeze_casts
    with snt.custom_variable_getter(cast):
        y = torso(tf.cast(x, dtype), **kwargs)
    return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), y)


def freeze_casts(agent):
    """For an agent that only infers (an actor): its torsos read copies of their variables cast
    to the compute dtype once, not on every call (the FC's 663K weights were 1.4 % of the cores
    at 84x84 in bfloat16). Returns refresh(), to call after every change of the weights.
    The copies live in a closure, out of the agent's variables and checkpoints."""
    dtype = agent.compute_dtype
    if dtype == tf.float32:  # nothing is cast
        return lambda: None
    torsos = [t for t in (getattr(agent, "_torso", None), getattr(agent, "_value_torso", None)) if t is not None]
    pairs = [(v, tf.Variable(tf.cast(v, dtype), trainable=False))
             for t in torsos for v in tf.Module.trainable_variables.fget(t)]
    if not pairs:
        return lambda: None
    copies = {v.ref(): c for v, c in pairs}
    for t in torsos:
        t.frozen_cast = lambda v: copies[v.ref()]

    def refresh():
        for v, c in pairs:
            c.assign(tf.cast(v, dtype))
    return refresh


RESIDUAL_TORSO_CONV = re.compile(r"resnet_torso/.*conv")  # nets/resnet.py's conv sections and blocks


def orthogonal_init(agent, seed=0):
    """Re-initialises an agent as CleanRL / OpenAI baselines do: orthogonal weights with gain
    sqrt(2) under ReLUs, 1 for the baseline, 0.01 for the policy logits (a near-uniform
    first policy that the screen can move), zero biases. LSTM weights are left alone, and so are
    the deep IMPALA torso's convs: its stream runs conv, max-pool and residual adds with no ReLU
    between sections, and He's gain there gave features 30x the shallow net's (tests/test_learner.py);
    Sonnet's init, the paper's, keeps them at the shallow net's scale."""
    for i, v in enumerate(agent.trainable_variables):
        name = v.name
        if "lstm" in name or "log_std" in name or RESIDUAL_TORSO_CONV.search(name):
            continue
        if name.endswith("/b:0"):
            v.assign(tf.zeros_like(v))
            continue
        gain = 0.01 if "policy_logits" in name else 1.0 if "baseline" in name else 2 ** 0.5
        fan_out = int(v.shape[-1])
        fan_in = int(np.prod(v.shape[:-1]))
        w = tf.keras.initializers.Orthogonal(gain=gain, seed=seed + i)((fan_in, fan_out))
        v.assign(tf.reshape(w, v.shape))


def batch_time(fn, x):
    """Applies `fn` (which takes [N, ...]) to x [T, B, ...]: outputs are [T, B, ...]."""
    x = tf.convert_to_tensor(x)
    t, b = tf.shape(x)[0], tf.shape(x)[1]
    outputs = fn(tf.reshape(x, [t * b] + x.shape[2:].as_list()))
    return tf.nest.map_structure(
        lambda y: tf.reshape(y, [t, b] + y.shape[1:].as_list()), outputs)


class PolicyValueHeads(snt.Module):
    """Linear policy and baseline heads on top of features; samples an action. `actions`: a
    number of discrete actions (logits) or a distributions.DiagGaussian, whose means are linear
    in the features and whose log standard deviations are one trainable vector, the same in
    every state (as SB3's and CleanRL's PPO for MuJoCo), starting at the distribution's
    initial_log_std (--initial_log_std). The head's parameters carry the log-std clamped to the
    distribution's floor (--min_log_std) and ceiling (LOG_STD_MAX), so the actors sample, and the
    learner reads back, one and the same distribution; the variable keeps the log-std itself (a
    checkpoint's means what it meant), and past a bound it still gets the gradient that brings it
    back (distributions.clamp_toward)."""

    def __init__(self, actions, name="heads"):
        super().__init__(name=name)
        self.distribution = distributions.make(actions)
        width = self.distribution.param_size // (2 if self.distribution.continuous else 1)
        self._policy = snt.Linear(width, name="policy_logits")
        self._baseline = snt.Linear(1, name="baseline")  # the attribute's name is a key in checkpoints
        self._log_std = (tf.Variable(tf.fill([width], self.distribution.initial_log_std), name="log_std")
                         if self.distribution.continuous else None)

    @property
    def value_layer(self):
        """The baseline's linear layer (its w and b exist once the heads have been called)."""
        return self._baseline

    def __call__(self, features, value_features=None):  # features [N, F]
        params = self._policy(features)
        if self._log_std is not None:
            log_std = distributions.clamp_toward(self._log_std, self.distribution.min_log_std,
                                                 distributions.LOG_STD_MAX)
            params = tf.concat([params, tf.broadcast_to(log_std, tf.shape(params))], axis=-1)
        value_features = features if value_features is None else value_features
        baseline = tf.squeeze(self._baseline(value_features), axis=-1)
        return AgentOutput(self.distribution.sample(params), params, baseline)


class AgentBase(snt.Module):
    """What the agents share: the torso's precision and the observation and return
    normalisers, all set by actor.build_agent after construction."""

    compute_dtype = tf.float32  # of the torso; see run_torso
    obs_normaliser = None  # RunningNormaliser of the observations (--normalize_observations)
    return_normaliser = None  # RunningNormaliser of the value targets (--normalize_returns)

    @property
    def policy(self):
        """The action distribution of the policy head (nets/distributions.py)."""
        return self._heads.distribution

    def _preprocess(self, obs):
        """(the torso's input, its frame_scale for run_torso). uint8 frames go as they are
        (0..255 are exact in bfloat16 too) with the 1/255 for the torso to fold into its first
        layer: one element-wise pass fewer over the largest tensor, 10 % of an actor's
        inference. With the observation normaliser: the normalised frames, scale 1."""
        obs = tf.convert_to_tensor(obs)
        if self.obs_normaliser is not None:
            return self.obs_normaliser(preprocess_observation(obs, tf.float32)), 1.0  # run_torso casts it
        if obs.dtype == tf.uint8:
            return tf.cast(obs, self.compute_dtype), FRAME_SCALE
        return preprocess_observation(obs), 1.0

    def update_return_statistics(self, targets, average=None, mask=None, preserve_outputs=True):
        """Folds value targets into the return normaliser (RunningNormaliser.update's
        arguments). With preserve_outputs the baseline head's last layer is rescaled so
        that every state's value in return units is what it was (PopArt, van Hasselt et al.
        2016): otherwise a new std or mean moves every value, the targets bootstrapped from
        them move too, and the statistics can chase their own targets geometrically (a
        HalfCheetah run's std passed 1e17 within 60 updates)."""
        norm = self.return_normaliser
        old_mean, old_std = norm.mean.read_value(), norm.std()
        # Before the first targets the statistics are the prior (mean 0, std 1), so the values
        # are the untrained head's: keeping those would leave the head to unlearn them step by
        # step at the optimizer's pace; the first batch sets them (as without preservation).
        seen = norm.count.read_value() > 1.0
        norm.update(targets, average, mask)
        if preserve_outputs:
            head = self._heads.value_layer
            scale = tf.cast(old_std / norm.std(), head.w.dtype)
            shift = tf.cast((old_mean - norm.mean) / norm.std(), head.b.dtype)
            head.w.assign(tf.where(seen, head.w * scale, head.w))
            head.b.assign(tf.where(seen, head.b * scale + shift, head.b))

    def _in_return_units(self, out):
        if self.return_normaliser is None:
            return out
        return out._replace(baseline=self.return_normaliser.denormalise(out.baseline))


class FeedForwardAgent(AgentBase):
    """torso -> heads. Its core state is the empty tuple ().

    With `separate_value_torso`, the baseline gets a torso of its own (SB3's and CleanRL's
    PPO do this for vector observations): in a shared torso the baseline's squared error,
    summed over the batch, outweighs the policy gradient."""

    def __init__(self, make_torso, actions, name, separate_value_torso=False):
        super().__init__(name=name)
        self._torso = make_torso()
        self._value_torso = make_torso() if separate_value_torso else None
        self._heads = PolicyValueHeads(actions)

    def initial_state(self, batch_size):
        del batch_size
        return ()

    def _step(self, obs):
        x, scale = self._preprocess(obs)
        value_features = (None if self._value_torso is None
                          else run_torso(self._value_torso, x, self.compute_dtype, scale))
        return self._in_return_units(self._heads(run_torso(self._torso, x, self.compute_dtype, scale), value_features))

    def __call__(self, obs, first, core_state):
        del first
        return self._step(obs), core_state

    def unroll(self, obs, first, core_state):
        del first
        return batch_time(self._step, obs), core_state


class ResetLSTM(snt.RNNCore):
    """snt.LSTM whose state goes back to the initial state where `first` is True.

    Input is a pair (features [B, F], first [B] bool), so `snt.dynamic_unroll`
    can carry `first` along the time axis.
    """

    def __init__(self, hidden_size, forget_bias=1.0, name="reset_lstm"):
        super().__init__(name=name)
        self._lstm = snt.LSTM(hidden_size, forget_bias=forget_bias, name="lstm")

    def initial_state(self, batch_size):
        return self._lstm.initial_state(batch_size)

    def __call__(self, inputs, prev_state):
        features, first = inputs
        return self._lstm(features, self._reset(first, prev_state))

    def gate_inputs(self, features, first, prev_state):
        """The gates' pre-activations [B, 4 * hidden] at one step, in Sonnet's order (input, forget,
        candidate, output), as snt.LSTM computes them from its variables _w_i, _w_h and b."""
        hidden = self._reset(first, prev_state).hidden
        return tf.matmul(features, self._lstm._w_i) + tf.matmul(hidden, self._lstm._w_h) + self._lstm.b

    def _reset(self, first, prev_state):
        initial = self._lstm.initial_state(tf.shape(first)[0])
        return tf.nest.map_structure(lambda init, prev: tf.where(first[:, None], init, prev), initial, prev_state)


class LSTMAgent(AgentBase):
    """torso -> LSTM (reset on `first`) -> heads. Core state: snt.LSTMState(hidden, cell).
    `forget_bias` is added to the forget gate before its sigmoid (--lstm_forget_bias); `input_norm`
    layer-normalises the torso's features before the LSTM reads them (--lstm_input_norm), so their
    growth in training cannot push its gates' inputs to where sigmoid and tanh are flat."""

    def __init__(self, make_torso, actions, name, hidden_size=256, forget_bias=1.0, input_norm=LSTM_INPUT_NORM):
        super().__init__(name=name)
        self._torso = make_torso()
        self._input_norm = snt.LayerNorm(-1, create_scale=True, create_offset=True,
                                         name="lstm_input_norm") if input_norm else None
        self._core = ResetLSTM(hidden_size, forget_bias)
        self._heads = PolicyValueHeads(actions)

    def initial_state(self, batch_size):
        return self._core.initial_state(batch_size)

    def __call__(self, obs, first, core_state):
        x, scale = self._preprocess(obs)
        features = self._lstm_input(run_torso(self._torso, x, self.compute_dtype, scale))
        core_output, core_state = self._core((features, tf.cast(first, tf.bool)), core_state)
        return self._in_return_units(self._heads(core_output)), core_state

    def unroll(self, obs, first, core_state):
        # The torso and the heads see all T*B frames at once; only the LSTM loops over time.
        features = self._torso_features(obs)
        core_outputs, core_state = snt.dynamic_unroll(
            self._core, (features, tf.cast(first, tf.bool)), core_state)
        return self._in_return_units(batch_time(self._heads, core_outputs)), core_state

    def gate_inputs(self, obs, first, core_state):
        """(the LSTM's gate pre-activations [B, 4 * hidden], the features it reads [B, F]) at one step
        of `obs` [B, ...]: a gate input far past |5| is a switch that passes no gradient
        (bench/lstm_state.py reports how many are)."""
        features = self._torso_features(obs[None])[0]
        return self._core.gate_inputs(features, tf.cast(first, tf.bool), core_state), features

    def core_states(self, obs, first, core_state):
        """The core state carried out of each of the steps of `obs` [T, B, ...] (before a reset
        at the next step's `first`): core_state's structure with a leading time axis, for a value
        taken where an episode was cut (impala/learner.py, bootstrap_at_cuts)."""
        features = self._torso_features(obs)

        def emit_state(inputs, state):
            _, state = self._core(inputs, state)
            return state, state
        states, _ = snt.dynamic_unroll(emit_state, (features, tf.cast(first, tf.bool)), core_state)
        return states

    def _torso_features(self, obs):
        """What the LSTM reads of all T*B frames of `obs` [T, B, ...] at once: the torso's features,
        layer-normalised with input_norm, [T, B, F]."""
        x, scale = self._preprocess(obs)
        return batch_time(lambda x: self._lstm_input(run_torso(self._torso, x, self.compute_dtype, scale)), x)

    def _lstm_input(self, features):
        return features if self._input_norm is None else self._input_norm(features)
