"""vtrace.py against a direct numpy transcription of equation 1 (the sum form)."""

import numpy as np
import pytest
import tensorflow as tf

import vtrace


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
                     clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, lambda_=1.0):
    """v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t, literally."""
    T = log_rhos.shape[0]
    rhos = np.exp(log_rhos)
    clipped = rhos if clip_rho_threshold is None else np.minimum(clip_rho_threshold, rhos)
    pg_rhos = rhos if clip_pg_rho_threshold is None else np.minimum(clip_pg_rho_threshold,
                                                                      rhos)
    cs = lambda_ * np.minimum(1.0, rhos)
    values_next = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    vs = np.zeros_like(values)
    for s in range(T):
        total = values[s].copy()
        for t in range(s, T):
            weight = np.ones_like(values[s])
            for i in range(s, t):
                weight = weight * discounts[i] * cs[i]
            delta = clipped[t] * (rewards[t] + discounts[t] * values_next[t] - values[t])
            total = total + weight * delta
        vs[s] = total
    vs_next = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg_adv = pg_rhos * (rewards + discounts * vs_next - values)
    return vs, pg_adv


def random_inputs(rng, T, B, done_prob=0.2):
    log_rhos = rng.normal(0, 1.0, size=(T, B)).astype(np.float32)
    discounts = (0.99 * (rng.random((T, B)) > done_prob)).astype(np.float32)
    rewards = rng.normal(0, 1, size=(T, B)).astype(np.float32)
    values = rng.normal(0, 1, size=(T, B)).astype(np.float32)
    bootstrap = rng.normal(0, 1, size=(B,)).astype(np.float32)
    return log_rhos, discounts, rewards, values, bootstrap


@pytest.mark.parametrize("T,B", [(1, 1), (1, 4), (5, 3), (20, 8), (40, 2)])
@pytest.mark.parametrize("clip_rho,clip_pg", [(1.0, 1.0), (None, None), (2.0, 0.5),
                                              (None, 1.0)])
def test_matches_numpy_sum_form(T, B, clip_rho, clip_pg):
    rng = np.random.default_rng(T * 100 + B)
    inputs = random_inputs(rng, T, B)
    out = vtrace.from_importance_weights(*inputs, clip_rho_threshold=clip_rho,
                                         clip_pg_rho_threshold=clip_pg)
    ref_vs, ref_adv = reference_vtrace(*[x.astype(np.float64) for x in inputs],
                                       clip_rho_threshold=clip_rho,
                                       clip_pg_rho_threshold=clip_pg)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lambda_", [1.0, 0.95, 0.8, 0.3])
def test_lambda_matches_numpy_sum_form(lambda_):
    rng = np.random.default_rng(7)
    inputs = random_inputs(rng, 12, 5)
    out = vtrace.from_importance_weights(*inputs, lambda_=lambda_)
    ref_vs, ref_adv = reference_vtrace(*[x.astype(np.float64) for x in inputs], lambda_=lambda_)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-5, atol=1e-5)


def test_on_policy_lambda_gives_the_lambda_return():
    """On-policy (rho = c = 1 before lambda), v_s - V(x_s) is GAE(gamma, lambda)'s advantage:
    sum_t (gamma lambda)^(t-s) delta_t."""
    T, B, gamma, lam = 10, 3, 0.9, 0.7
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    bootstrap = rng.normal(size=(B,)).astype(np.float32)
    discounts = np.full((T, B), gamma, np.float32)
    out = vtrace.from_importance_weights(np.zeros((T, B), np.float32), discounts, rewards, values,
                                         bootstrap, lambda_=lam)
    values_next = np.concatenate([values[1:], bootstrap[None]], axis=0)
    deltas = rewards + gamma * values_next - values
    gae = np.zeros((T, B))
    acc = np.zeros(B)
    for t in reversed(range(T)):
        acc = deltas[t] + gamma * lam * acc
        gae[t] = acc
    np.testing.assert_allclose(out.vs.numpy() - values, gae, rtol=1e-5, atol=1e-5)


def test_gae_advantage_on_policy_is_walle_gae_across_episode_ends():
    """pg_advantage="gae" with the actors on the target policy is PPO's GAE(lambda), as WALL-E
    computes it (walle/agent.py compute_gae), episode ends inside the unroll included; the
    paper's advantage is not (it weighs the steps after the first 1/lambda more)."""
    from walle.agent import compute_gae
    T, gamma, lam = 12, 0.99, 0.95
    rng = np.random.default_rng(5)
    rewards = rng.normal(size=(T, 1)).astype(np.float32)
    values = rng.normal(size=(T, 1)).astype(np.float32)
    bootstrap = rng.normal(size=(1,)).astype(np.float32)
    dones = np.zeros(T, np.float32)
    dones[[3, 8]] = 1.0  # terminations: no bootstrap, the trace stops
    discounts = (gamma * (1.0 - dones))[:, None].astype(np.float32)
    args = (np.zeros((T, 1), np.float32), discounts, rewards, values, bootstrap)
    gae_out = vtrace.from_importance_weights(*args, lambda_=lam, pg_advantage="gae")
    paper = vtrace.from_importance_weights(*args, lambda_=lam)
    next_values = np.concatenate([values[1:, 0], bootstrap]) * (1.0 - dones)
    want, _ = compute_gae(rewards[:, 0], values[:, 0], next_values, dones, gamma, lam)
    np.testing.assert_allclose(gae_out.pg_advantages.numpy()[:, 0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gae_out.vs.numpy(), paper.vs.numpy())  # the value targets are the same
    assert np.abs(paper.pg_advantages.numpy()[:, 0] - want).max() > 1e-2


def test_gae_advantage_off_policy_is_the_target_minus_the_value():
    """Off the target policy the "gae" advantage is v_s - V(x_s): its first step weighted by
    min(rho_bar, rho_s), the later ones by V-trace's traces."""
    rng = np.random.default_rng(6)
    args = random_inputs(rng, 20, 4)
    out = vtrace.from_importance_weights(*args, lambda_=0.9, pg_advantage="gae")
    np.testing.assert_allclose(out.pg_advantages.numpy(), out.vs.numpy() - args[3], rtol=1e-5, atol=1e-5)
    vs, _ = reference_vtrace(*args, lambda_=0.9)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-4, atol=1e-4)


def test_bad_pg_advantage_is_named():
    with pytest.raises(ValueError, match="pg_advantage must be 'vtrace' or 'gae', got 'td'"):
        vtrace.from_importance_weights(*random_inputs(np.random.default_rng(0), 3, 2), pg_advantage="td")


def test_bad_lambda_is_rejected():
    rng = np.random.default_rng(0)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="lambda_"):
            vtrace.from_importance_weights(*random_inputs(rng, 3, 2), lambda_=bad)


def test_episode_end_cuts_the_trace():
    """With gamma_s = 0, v_s depends only on r_s and V(x_s): nothing after the end leaks in."""
    rng = np.random.default_rng(0)
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(rng, 6, 3, done_prob=0)
    discounts[2, :] = 0.0
    a = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    rewards2, values2, bootstrap2 = rewards.copy(), values.copy(), bootstrap + 100.0
    rewards2[3:] += 50.0
    values2[3:] -= 20.0
    b = vtrace.from_importance_weights(log_rhos, discounts, rewards2, values2, bootstrap2)
    np.testing.assert_allclose(a.vs.numpy()[:3], b.vs.numpy()[:3], atol=1e-5)
    rho = np.minimum(1.0, np.exp(log_rhos[2]))
    np.testing.assert_allclose(a.vs.numpy()[2], values[2] + rho * (rewards[2] - values[2]),
                               atol=1e-5)


def test_on_policy_gives_n_step_returns():
    """pi == mu: rho = c = 1, so v_s is the discounted n-step return bootstrapped by V(x_T)."""
    rng = np.random.default_rng(1)
    T, B = 7, 4
    _, discounts, rewards, values, bootstrap = random_inputs(rng, T, B)
    out = vtrace.from_importance_weights(np.zeros((T, B), np.float32), discounts, rewards,
                                         values, bootstrap)
    ret = bootstrap.astype(np.float64)
    expected = np.zeros((T, B))
    for s in reversed(range(T)):
        ret = rewards[s] + discounts[s] * ret
        expected[s] = ret
    np.testing.assert_allclose(out.vs.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_from_logits_matches_importance_weights_and_log_probs():
    rng = np.random.default_rng(2)
    T, B, A = 9, 5, 4
    behaviour = rng.normal(size=(T, B, A)).astype(np.float32)
    target = rng.normal(size=(T, B, A)).astype(np.float32)
    actions = rng.integers(0, A, size=(T, B)).astype(np.int32)
    _, discounts, rewards, values, bootstrap = random_inputs(rng, T, B)
    out = vtrace.from_logits(behaviour, target, actions, discounts, rewards, values, bootstrap)

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    pick = lambda logp: np.take_along_axis(logp, actions[..., None], -1)[..., 0]
    target_lp = pick(log_softmax(target.astype(np.float64)))
    behaviour_lp = pick(log_softmax(behaviour.astype(np.float64)))
    np.testing.assert_allclose(out.target_action_log_probs.numpy(), target_lp, atol=1e-5)
    np.testing.assert_allclose(out.behaviour_action_log_probs.numpy(), behaviour_lp, atol=1e-5)
    np.testing.assert_allclose(out.log_rhos.numpy(), target_lp - behaviour_lp, atol=1e-5)
    ref_vs, ref_adv = reference_vtrace(target_lp - behaviour_lp, discounts, rewards, values,
                                       bootstrap)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-5, atol=1e-5)


def test_works_inside_tf_function_and_blocks_gradients():
    rng = np.random.default_rng(3)
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(rng, 8, 3)
    values_var = tf.Variable(values)

    @tf.function
    def f():
        with tf.GradientTape() as tape:
            out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values_var,
                                                 bootstrap)
            loss = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
        return out.vs, tape.gradient(loss, values_var)

    vs, grad = f()
    ref_vs, _ = reference_vtrace(log_rhos, discounts, rewards, values, bootstrap)
    np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    assert grad is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(bootstrap_value=np.zeros((2, 3), np.float32)), "bootstrap_value"),
    (dict(rewards=np.zeros((4,), np.float32)), "rewards"),
    (dict(clip_rho_threshold=0.0), "clip_rho_threshold"),
    (dict(clip_pg_rho_threshold=-1.0), "clip_pg_rho_threshold"),
])
def test_bad_shapes_and_thresholds_are_named(kwargs, match):
    args = dict(log_rhos=np.zeros((4, 3), np.float32), discounts=np.ones((4, 3), np.float32),
                rewards=np.zeros((4, 3), np.float32), values=np.zeros((4, 3), np.float32),
                bootstrap_value=np.zeros((3,), np.float32))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        vtrace.from_importance_weights(**args)


def test_bad_logits_rank_is_named():
    with pytest.raises(ValueError, match="NUM_ACTIONS"):
        vtrace.from_logits(np.zeros((4, 3), np.float32), np.zeros((4, 3, 2), np.float32),
                           np.zeros((4, 3), np.int32), np.ones((4, 3), np.float32),
                           np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32),
                           np.zeros((3,), np.float32))
