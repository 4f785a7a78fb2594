"""The agent every IMPALA process builds the same way (learner, actors, evaluator, test mode), the
unroll layout it implies, and the agent's weights as one flat vector, the form in which the learner
publishes them and actors and the evaluator read them (transport.py)."""
import numpy as np
import tensorflow as tf

import envs
import nets
from impala import transport
from impala.obs_transfer import sends_frames  # noqa: F401  (callers take it from here too)
from nets import distributions


def frame_size_of(flags):
    """The Atari frame size of --width/--height, as envs takes it: (width, height)."""
    return (flags.width, flags.height)


def build_agent(level_name, agent_name, unroll_length, frame_size=envs.FRAME_SIZE, compute_dtype="float32",
                newest_frames=False, normalize_observations=False, normalize_returns=False, net=None,
                discounted_return=False):
    """The agent with its (float32) variables built, its torso then computing in
    `compute_dtype` (--compute_dtype), its observations and value targets standardised by
    running statistics with `normalize_observations` and `normalize_returns`, plus the
    unroll layout both sides share (newest_frames: see transport.make_unroll_spec; the
    weights' size counts the published statistics). `net`: net_options(flags). discounted_return:
    the unrolls carry each env's discounted return (--normalize_rewards). Returns (agent, unroll
    spec, env spec)."""
    net = net or {}
    spec = envs.env_spec(level_name, frame_size)
    policy = distributions.make(spec.num_actions, None if spec.discrete else spec.action_dim,
                                net.get("initial_log_std", 0.0), net.get("min_log_std", distributions.LOG_STD_MIN))
    agent = nets.make_agent(agent_name, policy, spec.obs_shape, net.get("mlp_hidden"), net.get("mlp_activation"),
                            net.get("lstm_forget_bias", 1.0), net.get("lstm_input_norm", nets.LSTM_INPUT_NORM))
    if normalize_observations:
        agent.obs_normaliser = nets.RunningNormaliser(spec.obs_shape, "obs_normaliser")
    if normalize_returns:
        agent.return_normaliser = nets.RunningNormaliser((), "return_normaliser")
    obs = tf.zeros((1,) + tuple(spec.obs_shape), tf.as_dtype(spec.obs_dtype))
    state = agent.initial_state(1)
    agent(obs, tf.ones([1], tf.bool), state)  # creates the variables
    agent.compute_dtype = tf.as_dtype(compute_dtype)
    core_shapes = [tuple(s.shape[1:]) for s in tf.nest.flatten(state)]
    size = sum(int(np.prod(v.shape)) for v in nets.published_variables(agent))
    # Every unroll ships its cuts' last observations for the learner's current value there.
    unroll_spec = transport.make_unroll_spec(spec.obs_shape, spec.obs_dtype, policy,
                                             unroll_length, core_shapes, size, newest_frames,
                                             cut_observation=True, discounted_return=discounted_return)
    return agent, unroll_spec, spec


def net_options(flags):
    """The net's shape flags (--mlp_hidden, --mlp_activation, --initial_log_std, --min_log_std,
    --lstm_forget_bias, --lstm_input_norm) as build_agent takes them."""
    hidden = getattr(flags, "mlp_hidden", None)
    return {"mlp_hidden": tuple(int(w) for w in hidden) if hidden else None,
            "mlp_activation": getattr(flags, "mlp_activation", None),
            "initial_log_std": getattr(flags, "initial_log_std", 0.0),
            "min_log_std": getattr(flags, "min_log_std", distributions.LOG_STD_MIN),
            "lstm_forget_bias": getattr(flags, "lstm_forget_bias", 1.0),
            "lstm_input_norm": getattr(flags, "lstm_input_norm", nets.LSTM_INPUT_NORM)}


def build_from_flags(flags, newest_frames=None):
    """build_agent with the run's flags; newest_frames defaults to what the actors send. With
    --compute_dtype=auto the agent computes in float32 until precision.resolve, which needs the
    process's batch, times both precisions."""
    dtype = "float32" if flags.compute_dtype == "auto" else flags.compute_dtype
    return build_agent(flags.level_name, flags.agent_name, flags.unroll_length, frame_size_of(flags), dtype,
                       sends_frames(flags) if newest_frames is None else newest_frames,
                       flags.normalize_observations, flags.normalize_returns, net_options(flags),
                       flags.normalize_rewards)


def make_weight_setter(variables):
    """tf.function that splits a flat float32 vector into the variables."""
    shapes = [v.shape for v in variables]
    sizes = [int(np.prod(s)) for s in shapes]

    @tf.function
    def set_weights(flat):
        parts = tf.split(flat, sizes)
        for v, p, s in zip(variables, parts, shapes):
            v.assign(tf.reshape(p, s))
    return set_weights


def flatten_weights(variables):
    """The variables as one flat float32 vector, in published_variables' order."""
    return tf.concat([tf.reshape(v, [-1]) for v in variables], axis=0)


def published_weights(agent):
    """The agent's published weights (trainable variables and normaliser statistics), flat."""
    return flatten_weights(nets.published_variables(agent)).numpy()
