"""The V-trace actor-critic loss (Espeholt et al. 2018, section 4.2), as scalable_agent writes it:
one small function per term, each summed over time and batch, on time-major [T, B] tensors."""
import tensorflow as tf

from impala.batches import BATCH_START_PREFIX
from nets import distributions
import vtrace


def clip_rewards(rewards, mode):
    """--reward_clipping: abs_one clips to [-1, 1]; soft_asymmetric squashes with tanh and
    weighs losses less; none leaves them. auto must have been resolved for the env before
    (experiment.resolve_reward_clipping): taken here as none it would leave Atari's unclipped."""
    if mode == "abs_one":
        return tf.clip_by_value(rewards, -1.0, 1.0)
    if mode == "soft_asymmetric":
        squeezed = tf.tanh(rewards / 5.0)
        # Negative rewards count 0.3 as much: makes the agent less risk-averse.
        return tf.where(rewards < 0, 0.3 * squeezed, squeezed) * 5.0
    if mode == "none":
        return rewards
    raise ValueError("--reward_clipping=%s: the loss takes abs_one, soft_asymmetric or none (auto is resolved "
                     "for --level_name at start-up, by experiment.resolve_reward_clipping)" % (mode,))


def vtrace_targets(agent_out, batch, flags):
    """V-trace's value targets vs and policy-gradient advantages for a time-major batch.
    With --clip_ratio_to=batch_start, V-trace corrects from the actors' policy mu to the
    learner's policy pi_old as the batch arrived (fixed for all the batch's gradient steps);
    otherwise to the current policy pi."""
    rewards = clip_rewards(batch["reward"], flags.reward_clipping)
    if "timeout_value" in batch:  # bootstrap where a time limit, not the task, ended the episode
        rewards += flags.discounting * batch["timeout_value"]
    discounts = tf.cast(~batch["done"], tf.float32) * flags.discounting
    anchor = batch.get("old_logits")
    target = agent_out.policy_logits[:-1] if anchor is None else anchor
    values = dict(discounts=discounts, rewards=rewards, values=agent_out.baseline[:-1],
                  bootstrap_value=agent_out.baseline[-1], lambda_=flags.vtrace_lambda,
                  pg_advantage=flags.pg_advantage)
    policy = policy_of(batch)
    if not policy.continuous:
        return vtrace.from_logits(behaviour_policy_logits=batch["behaviour_logits"], target_policy_logits=target,
                                  actions=batch["action"], **values)
    # A Gaussian's importance weights come from the log-densities of the actions taken.
    target_lp = policy.log_prob(target, batch["action"])
    behaviour_lp = policy.log_prob(batch["behaviour_logits"], batch["action"])
    log_rhos = target_lp - behaviour_lp
    vt = vtrace.from_importance_weights(log_rhos=log_rhos, **values)
    return vtrace.VTraceFromLogitsReturns(vs=vt.vs, pg_advantages=vt.pg_advantages, log_rhos=log_rhos,
                                          behaviour_action_log_probs=behaviour_lp, target_action_log_probs=target_lp)


def fixed_targets(vt):
    """V-trace's outputs as batch fields (--vtrace_targets=batch_start): computed once from the
    batch as it arrived, they stay the same in all its gradient steps and minibatches."""
    return {BATCH_START_PREFIX + k: tf.stop_gradient(v) for k, v in vt._asdict().items()}


def step_targets(agent_out, batch, flags):
    """(V-trace's outputs for one gradient step, whether they were fixed at the batch's start)."""
    if BATCH_START_PREFIX + "vs" not in batch:
        return vtrace_targets(agent_out, batch, flags), False
    return vtrace.VTraceFromLogitsReturns(**{k: batch[BATCH_START_PREFIX + k]
                                             for k in vtrace.VTraceFromLogitsReturns._fields}), True


def policy_of(batch):
    """The action distribution of a batch's policy (nets/distributions.py), from its actions."""
    return distributions.of_batch(batch["action"], batch["behaviour_logits"])


def compute_baseline_loss(vs, values, value_scale=1.0):
    """1/2 sum ((v_s - V(x_s)) / value_scale)^2: with --normalize_returns the head predicts
    standardised returns, so its error is measured in those units."""
    return 0.5 * tf.reduce_sum(tf.square((vs - values) / value_scale))


def compute_entropy_loss(step_entropy):
    """-sum H(pi) over the [T, B] entropies: minimising it keeps the policy exploring."""
    return -tf.reduce_sum(step_entropy)


def compute_policy_gradient_loss(target_action_log_probs, advantages):
    """IMPALA's policy gradient: -sum log pi(a_s|x_s) * rho_s (r_s + gamma v_{s+1} - V(x_s))."""
    return tf.reduce_sum(-target_action_log_probs * advantages)


def compute_clipped_surrogate_loss(ratio, advantages, clip):
    """APPO (RLlib): PPO's clipped surrogate on the V-trace advantages. It bounds how far one
    batch may move the policy when the learner reuses it (--num_sgd_iter > 1)."""
    return -tf.reduce_sum(tf.minimum(ratio * advantages,
                                     tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * advantages))


def compute_action_bound_loss(mean, low, high):
    """How far a Gaussian's mean [..., d] lies beyond the action space's bounds (`low`, `high`, d
    each), squared and summed. The env batch clips actions to the bounds, so a mean far outside
    them gets every sample clipped to the same action: no advantage then tells the mean which way
    to move, and Pendulum's runs fell back from -300 to -1,500 and stayed there for 300K frames
    (configs/pendulum.flags). An infinite bound adds nothing."""
    low, high = tf.constant(low, tf.float32), tf.constant(high, tf.float32)
    return tf.reduce_sum(tf.square(tf.nn.relu(mean - high) + tf.nn.relu(low - mean)))


def fraction_outside(mean, low, high):
    """The share of steps whose Gaussian mean lies outside the bounds in some dimension."""
    low, high = tf.constant(low, tf.float32), tf.constant(high, tf.float32)
    return tf.reduce_mean(tf.cast(tf.reduce_any((mean < low) | (mean > high), axis=-1), tf.float32))


def standardise(advantages):
    """PPO's per-minibatch standardisation (--normalize_advantages): the policy-gradient scale no
    longer depends on the reward scale, so the entropy cost means the same in every game."""
    mean, var = tf.nn.moments(advantages, axes=[0, 1])
    return (advantages - mean) / (tf.sqrt(var) + 1e-8)


def fresh_steps(batch):
    """{"batch_start/fresh": [T, B] bool}, True on the steps of the queue's unrolls (the batch's
    "fresh" [B]; all of them where it has none): --clip_ratio_to=fresh_batch_start takes the
    ratio of the other, replayed, steps against the actors' policy."""
    shape = tf.shape(batch["action"])[:2]
    fresh = batch.get("fresh")
    if fresh is None:
        return {BATCH_START_PREFIX + "fresh": tf.ones(shape, tf.bool)}
    return {BATCH_START_PREFIX + "fresh": tf.broadcast_to(tf.cast(fresh, tf.bool)[None, :], shape)}


MAX_LOG_RATIO = 20.0  # exp(20) = 4.9e8: far past any clip, far below float32's 3.4e38


def bounded_ratio(log_ratio):
    """exp(log_ratio), with log_ratio capped at MAX_LOG_RATIO. An action the reference policy
    all but ruled out (log-probability below -88) gives a ratio that overflows to inf, and
    the surrogate's gradient then becomes NaN even where the clipped branch is taken (0 * inf
    in tf.minimum's backward pass; tests/test_nonfinite.py), the likeliest way a Pong run with
    configs/atari.flags went NaN at 3.08M frames with entropy near 0.2
    (bench/results/2core-amd-epyc/pong_atari_flags.md). Beyond the cap the
    sample's gradient is zero, as it is for a clipped ratio."""
    return tf.exp(tf.minimum(log_ratio, MAX_LOG_RATIO))


def policy_ratio(vt, logits, batch, fixed=False):
    """r_s of the clipped surrogate: pi / mu against the behaviour policy mu, or (with
    --clip_ratio_to=batch_start) pi / pi_old, exactly 1 at the batch's first step however far
    the actors' policy lags behind; with fresh_batch_start, pi / pi_old on the queue's steps and
    pi / mu on replayed ones. `fixed`: vt was computed at the batch's start, so its
    log_rhos are not the current policy's."""
    if batch.get("old_logits") is None and not fixed:
        return bounded_ratio(vt.log_rhos)
    log_pi = policy_of(batch).log_prob(logits, batch["action"])
    reference = vt.behaviour_action_log_probs if batch.get("old_logits") is None else vt.target_action_log_probs
    if BATCH_START_PREFIX + "fresh" in batch:  # --clip_ratio_to=fresh_batch_start: replayed steps against mu
        reference = tf.where(batch[BATCH_START_PREFIX + "fresh"], reference, vt.behaviour_action_log_probs)
    return bounded_ratio(log_pi - reference)


def compute_losses(agent_out, batch, flags, value_scale=1.0, action_bounds=None):
    """The total loss on one time-major batch and its parts: the policy term (IMPALA's, or
    APPO's clipped surrogate with --clip_param > 0), the baseline and entropy terms weighted by
    --baseline_cost and --entropy_cost, and for a Gaussian policy with `action_bounds` (the action
    space's low and high) the mean's overshoot weighted by --action_bound_cost. `value_scale`:
    compute_baseline_loss's."""
    logits = agent_out.policy_logits[:-1]       # [T, B, A]
    vt, fixed = step_targets(agent_out, batch, flags)
    advantages = standardise(vt.pg_advantages) if flags.normalize_advantages else vt.pg_advantages
    if flags.clip_param > 0:
        pg_loss = compute_clipped_surrogate_loss(policy_ratio(vt, logits, batch, fixed), advantages, flags.clip_param)
    else:
        log_pi = policy_of(batch).log_prob(logits, batch["action"]) if fixed else vt.target_action_log_probs
        pg_loss = compute_policy_gradient_loss(log_pi, advantages)
    baseline_loss = flags.baseline_cost * compute_baseline_loss(vt.vs, agent_out.baseline[:-1], value_scale)
    step_entropy = policy_of(batch).entropy(logits)
    entropy_loss = flags.entropy_cost * compute_entropy_loss(step_entropy)
    total = pg_loss + baseline_loss + entropy_loss
    stats = {"pg_loss": pg_loss, "baseline_loss": baseline_loss, "entropy": tf.reduce_mean(step_entropy),
             "mean_rho": tf.reduce_mean(tf.exp(vt.log_rhos))}
    if action_bounds is not None and policy_of(batch).continuous:
        mean = policy_of(batch).mode(logits)
        stats["mean_outside_bounds"] = fraction_outside(mean, *action_bounds)  # TensorBoard: losses/
        if flags.action_bound_cost > 0:
            stats["action_bound_loss"] = flags.action_bound_cost * compute_action_bound_loss(mean, *action_bounds)
            total += stats["action_bound_loss"]
    return total, dict(stats, total_loss=total)
