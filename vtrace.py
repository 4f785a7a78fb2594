"""V-trace off-policy actor-critic targets (Espeholt et al. 2018, section 4.1).

All tensors are time-major: a leading time axis T, then the batch axis B.
Index s runs over the T steps of an unroll, x_s is the state at step s,
a_s the action, r_s the reward and gamma_s the discount (0 at an episode end).

The behaviour policy mu produced the actions; the target policy pi is the
learner's current policy. With truncated importance weights

    rho_s = min(rho_bar, pi(a_s|x_s) / mu(a_s|x_s))                      (clip_rho_threshold)
    c_s   = lambda min(1, pi(a_s|x_s) / mu(a_s|x_s))                     (the "trace cutting")

(lambda = 1 is the paper's main form; lambda < 1 is its remark borrowed from Retrace(lambda): like
GAE's lambda, it trades variance for bias, and an on-policy lambda < 1 turns v_s into a
lambda-return.)

the n-step V-trace target for V(x_s) is (equation 1 of the paper)

    v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V,
    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),

which we compute for n = T (the whole unroll) with the recursion of Remark 1

    v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1})),

run backwards from v_T = V(x_T), the bootstrap value. The policy-gradient
advantage (section 4.2) uses its own clipping rho_bar_pg (clip_pg_rho_threshold):

    A_s = min(rho_bar_pg, pi/mu) (r_s + gamma_s v_{s+1} - V(x_s)).

Neither vs nor the advantages carry gradients (tf.stop_gradient): they are targets.
The code follows the structure of DeepMind's scalable_agent/vtrace.py.
"""

import collections

import tensorflow as tf

VTraceFromLogitsReturns = collections.namedtuple(
    "VTraceFromLogitsReturns",
    ["vs", "pg_advantages", "log_rhos", "behaviour_action_log_probs",
     "target_action_log_probs"])

VTraceReturns = collections.namedtuple("VTraceReturns", ["vs", "pg_advantages"])


def log_probs_from_logits_and_actions(policy_logits, actions):
    """log pi(a|x) for logits [T, B, A] (float) and actions [T, B] (int)."""
    policy_logits = tf.convert_to_tensor(policy_logits, dtype=tf.float32)
    actions = tf.convert_to_tensor(actions, dtype=tf.int32)
    if policy_logits.shape.rank != 3:
        raise ValueError(f"policy_logits must be [T, B, NUM_ACTIONS], got shape "
                         f"{policy_logits.shape}")
    if actions.shape.rank != 2:
        raise ValueError(f"actions must be [T, B], got shape {actions.shape}")
    return -tf.nn.sparse_softmax_cross_entropy_with_logits(logits=policy_logits,
                                                           labels=actions)


def from_logits(behaviour_policy_logits, target_policy_logits, actions, discounts,
                rewards, values, bootstrap_value, clip_rho_threshold=1.0,
                clip_pg_rho_threshold=1.0, lambda_=1.0, pg_advantage="vtrace", name="vtrace_from_logits"):
    """V-trace for softmax policies given as logits.

    behaviour_policy_logits, target_policy_logits: [T, B, NUM_ACTIONS] float32.
    actions: [T, B] int. discounts, rewards, values: [T, B] float32.
    bootstrap_value: [B] float32, V(x_T).
    Returns VTraceFromLogitsReturns(vs, pg_advantages, log_rhos,
    behaviour_action_log_probs, target_action_log_probs), each [T, B].
    """
    with tf.name_scope(name):
        behaviour_policy_logits = tf.convert_to_tensor(behaviour_policy_logits, tf.float32)
        target_policy_logits = tf.convert_to_tensor(target_policy_logits, tf.float32)
        if behaviour_policy_logits.shape.rank != 3 or target_policy_logits.shape.rank != 3:
            raise ValueError(
                "behaviour_policy_logits and target_policy_logits must be [T, B, NUM_ACTIONS];"
                f" got {behaviour_policy_logits.shape} and {target_policy_logits.shape}")
        target_action_log_probs = log_probs_from_logits_and_actions(
            target_policy_logits, actions)
        behaviour_action_log_probs = log_probs_from_logits_and_actions(
            behaviour_policy_logits, actions)
        log_rhos = target_action_log_probs - behaviour_action_log_probs
        vtrace_returns = from_importance_weights(
            log_rhos=log_rhos, discounts=discounts, rewards=rewards, values=values,
            bootstrap_value=bootstrap_value, clip_rho_threshold=clip_rho_threshold,
            clip_pg_rho_threshold=clip_pg_rho_threshold, lambda_=lambda_, pg_advantage=pg_advantage)
        return VTraceFromLogitsReturns(
            vs=vtrace_returns.vs, pg_advantages=vtrace_returns.pg_advantages,
            log_rhos=log_rhos, behaviour_action_log_probs=behaviour_action_log_probs,
            target_action_log_probs=target_action_log_probs)


def from_importance_weights(log_rhos, discounts, rewards, values, bootstrap_value,
                            clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, lambda_=1.0,
                            pg_advantage="vtrace", name="vtrace_from_importance_weights"):
    """V-trace from log importance weights log(pi(a_s|x_s) / mu(a_s|x_s)).

    log_rhos, discounts, rewards, values: [T, B] float32; bootstrap_value: [B].
    clip_rho_threshold: rho_bar, or None for no clipping of rho_s.
    clip_pg_rho_threshold: rho_bar_pg for the advantages, or None for no clipping.
    lambda_: the trace's lambda in (0, 1] (1: the paper's main V-trace).
    pg_advantage: "vtrace": the paper's rho_s (r_s + gamma v_{s+1} - V(x_s)); "gae": v_s - V(x_s),
      whose first step carries min(rho_bar, rho_s) and whose later steps the traces c: with the
      actors on the target policy it is GAE(lambda) exactly, where the paper's weighs every step
      after the first 1/lambda more (clip_pg_rho_threshold does not apply).
    Returns VTraceReturns(vs, pg_advantages), both [T, B], gradient-free.
    """
    with tf.name_scope(name):
        log_rhos, discounts, rewards, values, bootstrap_value = (
            tf.convert_to_tensor(t, dtype=tf.float32)
            for t in (log_rhos, discounts, rewards, values, bootstrap_value))
        _check_arguments(log_rhos, discounts, rewards, values, bootstrap_value,
                         clip_rho_threshold, clip_pg_rho_threshold, lambda_, pg_advantage)

        rhos = tf.exp(log_rhos)
        if clip_rho_threshold is not None:
            clipped_rhos = tf.minimum(float(clip_rho_threshold), rhos)
        else:
            clipped_rhos = rhos
        cs = lambda_ * tf.minimum(1.0, rhos)

        # V(x_{s+1}) for every s, with V(x_T) = bootstrap_value.
        values_t_plus_1 = tf.concat([values[1:], bootstrap_value[tf.newaxis]], axis=0)
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

        # Backward recursion: acc_s = delta_s + gamma_s c_s acc_{s+1}, acc_T = 0.
        def scan_fn(acc, elems):
            discount_t, c_t, delta_t = elems
            return delta_t + discount_t * c_t * acc

        vs_minus_v_xs = tf.scan(
            fn=scan_fn, elems=(discounts, cs, deltas),
            initializer=tf.zeros_like(bootstrap_value), parallel_iterations=1,
            reverse=True, name="scan")
        vs = vs_minus_v_xs + values

        if pg_advantage == "gae":
            return VTraceReturns(vs=tf.stop_gradient(vs), pg_advantages=tf.stop_gradient(vs_minus_v_xs))
        # Advantages use v_{s+1} (the V-trace target one step on).
        vs_t_plus_1 = tf.concat([vs[1:], bootstrap_value[tf.newaxis]], axis=0)
        if clip_pg_rho_threshold is not None:
            clipped_pg_rhos = tf.minimum(float(clip_pg_rho_threshold), rhos)
        else:
            clipped_pg_rhos = rhos
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)

        return VTraceReturns(vs=tf.stop_gradient(vs),
                             pg_advantages=tf.stop_gradient(pg_advantages))


def _check_arguments(log_rhos, discounts, rewards, values, bootstrap_value,
                     clip_rho_threshold, clip_pg_rho_threshold, lambda_, pg_advantage):
    """Ranks ([T, B] and [B]) and the thresholds' ranges, with a message naming the argument."""
    for label, tensor in (("discounts", discounts), ("rewards", rewards), ("values", values)):
        if tensor.shape.rank != log_rhos.shape.rank:
            raise ValueError(f"{label} has rank {tensor.shape.rank}, log_rhos has rank "
                             f"{log_rhos.shape.rank}; all must be [T, B]")
    if bootstrap_value.shape.rank != log_rhos.shape.rank - 1:
        raise ValueError(f"bootstrap_value must have rank {log_rhos.shape.rank - 1} "
                         f"([B]), got shape {bootstrap_value.shape}")
    for label, threshold in (("clip_rho_threshold", clip_rho_threshold),
                             ("clip_pg_rho_threshold", clip_pg_rho_threshold)):
        if threshold is not None and not threshold > 0:
            raise ValueError(f"{label} must be > 0 or None, got {threshold}")
    if pg_advantage not in ("vtrace", "gae"):
        raise ValueError(f"pg_advantage must be 'vtrace' or 'gae', got {pg_advantage!r}")
    if not 0 < lambda_ <= 1:
        raise ValueError(f"lambda_ must be in (0, 1], got {lambda_}")
