"""Time-limit bootstraps come from the learner's current net, not from the actor's older one.

At an episode cut by a time limit (truncated, not terminated) V-trace's reward there gains
gamma * V(last observation). The actor ships that last observation (the unroll's cut_* fields,
impala/transport.py); the learner evaluates it with its current weights (Learner.bootstrap_at_cuts)
and uses it in place of the actor's timeout_value, also for replayed unrolls."""
import types

import numpy as np
import pytest
import tensorflow as tf

from envs.batch import StepResult
from impala import actor as actor_lib
from impala import learner as learner_lib
from impala import replay_files
from impala import transport
from impala.batches import BATCH_START_PREFIX
from impala.timings import Timings
from tests.test_learner import _experiment_defaults

T, B, GAMMA = 3, 2, 0.9


def _learner(tmp_path, **kw):
    flags = _experiment_defaults(**dict(dict(
        level_name="CartPole-v1", agent_name="MLPAgent", batch_size=B, unroll_length=T, discounting=GAMMA,
        vtrace_lambda=1.0, vtrace_targets="batch_start", clip_param=0.0, total_environment_frames=1000), **kw))
    return learner_lib.Learner(flags, str(tmp_path))


def _value(agent, obs):
    out, _ = agent(tf.constant(obs, tf.float32), tf.zeros([len(obs)], tf.bool), ())
    return out.baseline.numpy()


def _hand_vs(rewards, done, timeout_value, values_T):
    """On-policy V-trace with lambda 1 (rho = c = 1): the n-step returns
    vs_t = r_t + gamma V_cut_t + gamma (1 - done_t) vs_{t+1}, vs_T = V(x_T)."""
    vs = np.zeros((T + 1, B))
    vs[T] = values_T
    for t in reversed(range(T)):
        vs[t] = rewards[t] + GAMMA * timeout_value[t] + GAMMA * (1.0 - done[t]) * vs[t + 1]
    return vs[:T]


@pytest.mark.parametrize("normalize_observations", [False, True])
def test_the_targets_bootstrap_a_cut_from_the_learners_current_value(tmp_path, normalize_observations):
    learner = _learner(tmp_path, normalize_observations=normalize_observations)
    agent = learner.agent
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(T + 1, B, 4)).astype(np.float32)
    last = rng.normal(size=(B, 4)).astype(np.float32) * 2.0  # the cut episodes' last observations
    early = rng.normal(size=(1, 4)).astype(np.float32)  # row 1's earlier cut, not stored
    # Row 0: one cut at step 1. Row 1: a cut at step 0 (its actor's value kept) and its last cut at 2.
    done = np.array([[False, True], [True, False], [False, True]])
    cut_step = np.array([1, 2], np.int32)
    # The actor's values: from the weights as they were when it acted.
    stale_last, stale_early = _value(agent, last), _value(agent, early)[0]
    timeout_value = np.zeros((T, B), np.float32)
    timeout_value[1, 0], timeout_value[2, 1], timeout_value[0, 1] = stale_last[0], stale_last[1], stale_early
    # The learner has moved on since: another baseline.
    head = agent._heads.value_layer
    head.w.assign(head.w + tf.constant(rng.normal(size=tuple(head.w.shape)), tf.float32))
    head.b.assign(head.b + 3.0)

    if normalize_observations:  # other statistics than the actor's; the batch leaves them (nothing fresh)
        learner.agent.obs_normaliser.mean.assign([0.5, -0.5, 1.0, 0.0])
        learner.agent.obs_normaliser.var.assign([4.0, 0.25, 1.0, 2.0])
    tensors = {k: tf.constant(v) for k, v in learner.zero_batch(B).items()}
    if normalize_observations:
        tensors["fresh"] = tf.zeros([B], tf.bool)
    out, _ = agent.unroll(tf.constant(obs), tf.zeros([T + 1, B], tf.bool), ())
    rewards = rng.uniform(size=(T, B)).astype(np.float32)
    tensors.update(observation=tf.constant(obs), reward=tf.constant(rewards), done=tf.constant(done),
                   timeout_value=tf.constant(timeout_value), behaviour_logits=out.policy_logits[:-1],
                   action=tf.zeros([T, B], tf.int32), cut_step=tf.constant(cut_step),
                   cut_observation=tf.constant(last))
    batch, _ = learner._batch_start(tensors)
    vs = batch[BATCH_START_PREFIX + "vs"].numpy()

    fresh = _value(agent, last)  # the current net and normaliser
    assert np.all(np.abs(fresh - stale_last) > 0.1)  # the test means something
    out, _ = agent.unroll(tf.constant(obs), tf.zeros([T + 1, B], tf.bool), ())
    expected_tv = timeout_value.copy()
    expected_tv[1, 0], expected_tv[2, 1] = fresh  # row 1's earlier cut keeps the actor's value
    expected = _hand_vs(rewards, done, expected_tv, out.baseline.numpy()[T])
    np.testing.assert_allclose(vs, expected, rtol=1e-4, atol=1e-4)
    stale = _hand_vs(rewards, done, timeout_value, out.baseline.numpy()[T])
    assert not np.allclose(vs, stale, atol=1e-3)


def test_no_cut_leaves_the_actors_values(tmp_path):
    learner = _learner(tmp_path)
    tensors = {k: tf.constant(v) for k, v in learner.zero_batch(B).items()}
    tv = tf.constant(np.arange(T * B, dtype=np.float32).reshape(T, B))
    tensors.update(timeout_value=tv, cut_step=tf.constant([-1, -1], tf.int32))
    np.testing.assert_array_equal(learner.bootstrap_at_cuts(tensors)["timeout_value"].numpy(), tv.numpy())


def test_a_recurrent_learner_bootstraps_a_cut_from_its_core_state_there(tmp_path):
    """An LSTM's value of a cut episode's last observation depends on what it carried out of the
    cut's step: the learner unrolls its current net from the unroll's stored core state up to the
    cut (resetting where a game began) and takes the value there, as the actor did with its own."""
    learner = _learner(tmp_path, agent_name="MLPLSTMAgent")
    agent = learner.agent
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(T + 1, B, 4)).astype(np.float32)
    first = np.zeros((T + 1, B), bool)
    first[1, 1] = True  # row 1 begins a new game at step 1, before its cut at step 2
    last = rng.normal(size=(B, 4)).astype(np.float32)
    cut_step = np.array([1, 2], np.int32)
    tensors = {k: tf.constant(v) for k, v in learner.zero_batch(B).items()}
    start = tf.nest.map_structure(lambda s: tf.constant(rng.normal(size=s.shape).astype(np.float32)),
                                  agent.initial_state(B))
    for i, s in enumerate(tf.nest.flatten(start)):
        tensors["core_state_%d" % i] = s
    tensors.update(observation=tf.constant(obs), first=tf.constant(first), cut_step=tf.constant(cut_step),
                   cut_observation=tf.constant(last), timeout_value=tf.zeros([T, B]))
    got = tf.function(learner.bootstrap_at_cuts, autograph=False)(tensors)["timeout_value"].numpy()

    want, state = [], start
    for t in range(T):  # the actor's way: one step at a time, the value after the cut's step
        _, state = agent(tf.constant(obs[t]), tf.constant(first[t]), state)
        value, _ = agent(tf.constant(last), tf.zeros([B], tf.bool), state)
        want.append(value.baseline.numpy())
    for b in range(B):
        assert got[cut_step[b], b] == pytest.approx(float(want[cut_step[b]][b]), abs=1e-5)
    fresh, _ = agent(tf.constant(last), tf.zeros([B], tf.bool), agent.initial_state(B))
    assert np.all(np.abs(got[cut_step, range(B)] - fresh.baseline.numpy()) > 1e-3)  # the state matters
    assert np.count_nonzero(got) == B  # nothing else moved


def test_the_unroll_carries_the_cut_fields_and_their_bytes():
    """Every agent ships cut_step and the last observation (recurrent ones too: the learner
    unrolls to the cut for the core state); with newest frames only its newest frame (the
    learner rebuilds the rest)."""
    from impala import agent as agent_lib
    for name in ("MLPAgent", "MLPLSTMAgent"):
        _, spec, _ = agent_lib.build_agent("CartPole-v1", name, 16)
        assert {"cut_observation", "cut_step"} <= set(spec.names)

    def extra(obs_shape, dtype, newest):
        with_cut = transport.make_unroll_spec(obs_shape, dtype, 6, 20, [], 10, newest, cut_observation=True)
        without = transport.make_unroll_spec(obs_shape, dtype, 6, 20, [], 10, newest, cut_observation=False)
        return with_cut.nbytes() - without.nbytes(), without.nbytes()
    assert extra((84, 84, 4), np.uint8, True)[0] == 84 * 84 + 4
    assert extra((84, 84, 4), np.uint8, False)[0] == 84 * 84 * 4 + 4
    assert extra((4,), np.float32, False)[0] == 4 * 4 + 4


def test_cut_stack_rebuilds_the_envs_last_stack():
    """With newest frames, the cut's last stack is observation cut_step's newest C-1 frames and
    the last frame, as envs/batch.py pushes it, also right after a new game's black frames."""
    C, H, W, n = 4, 3, 2, 5
    rng = np.random.default_rng(1)
    frames = rng.integers(1, 255, size=(2, n + C, H, W), dtype=np.uint8)
    stack_reset = np.zeros((2, n + 1), bool)
    stack_reset[1, 2] = True  # row 1: a new game at observation 2
    frames[1, 2 + 0:2 + C - 1] = 0  # its stack there: C-1 black frames and the new one
    obs = transport.stack_frames(frames, stack_reset)  # [n+1, 2, H, W, C]
    last = rng.integers(1, 255, size=(2, H, W), dtype=np.uint8)
    cut_step = np.array([3, 2], np.int32)
    got = transport.cut_stack(tf.constant(obs), tf.constant(cut_step), tf.constant(last)).numpy()
    for b in range(2):
        want = np.concatenate([obs[cut_step[b], b, ..., 1:], last[b][..., None]], -1)
        np.testing.assert_array_equal(got[b], want)
    assert not got[1, ..., :C - 2].any() and (got[1, ..., C - 2] == obs[2, 1, ..., C - 1]).all()


class _FakeEnvs:
    """Two envs whose episodes are cut by a time limit: env 0 at steps 0 and 2, env 1 never."""

    def __init__(self):
        self.t = 0

    def reset(self, obs):
        obs[:] = 0.0

    def send(self, actions):
        pass

    def recv(self, obs):
        n, t = 2, self.t
        self.t += 1
        obs[:] = t + 1
        cut = np.array([t in (0, 2), False])
        final = np.full((n, 4), 100.0 + t, np.float32) if cut.any() else None
        return StepResult(np.ones(n, np.float32), cut.copy(), cut, final, cut.copy(), np.zeros(n, np.float32),
                          np.zeros(n, np.int32), np.zeros(n, np.int32), cut.copy())


def test_the_actor_records_the_last_cut_of_each_row():
    spec = transport.make_unroll_spec((4,), np.float32, 2, T, [], 10, cut_observation=True)
    buf = {f.name: np.zeros((2,) + f.shape, f.dtype) for f in spec.fields}
    group = actor_lib.EnvGroup(_FakeEnvs(), slice(0, 2), (4,), np.float32, ())

    def step(o, f, s):
        base = tf.reduce_sum(o, axis=-1)  # the actor's value: the sum of the observation
        return types.SimpleNamespace(action=tf.zeros([2], tf.int32), policy_logits=tf.zeros([2, 2]),
                                     baseline=base), s
    actor_lib.fill_unroll([group], buf, step, T, Timings(*actor_lib.PHASES))
    assert buf["cut_step"].tolist() == [2, -1]
    np.testing.assert_array_equal(buf["cut_observation"][0], np.full(4, 102.0))
    np.testing.assert_array_equal(buf["timeout_value"][0], [400.0, 0.0, 408.0])  # the fallback stays
    assert not buf["timeout_value"][1].any()


def test_replay_state_without_the_cut_fields_is_refused_in_one_line():
    """A replay file saved before the cut fields does not fit: load() warns and starts afresh."""
    old = {"sources": [{"slots": [{"observation": 0, "timeout_value": 0}], "carry": []}]}
    with pytest.raises(ValueError, match="cut_observation.*cut_step"):
        replay_files._check_fields(old, ["observation", "timeout_value", "cut_observation", "cut_step"])


def test_an_atari_learner_rebuilds_the_cut_stack_from_the_newest_frame(tmp_path):
    """Native Atari sends newest frames: the unroll carries only the cut's last frame, and the
    learner's value (traced, as in its update) is that of the rebuilt stack."""
    flags = _experiment_defaults(level_name="PongNoFrameskip-v4", agent_name="SimpleConvNetAgent", width=42,
                                 height=42, batch_size=B, unroll_length=T, total_environment_frames=1000)
    learner = learner_lib.Learner(flags, str(tmp_path))
    assert "cut_frame" in learner.spec.names and "cut_observation" not in learner.spec.names
    rng = np.random.default_rng(2)
    full = learner.zero_batch(B)
    full["observation"] = rng.integers(0, 255, (T + 1, B, 42, 42, 4)).astype(np.uint8)
    full["cut_step"] = np.array([1, -1], np.int32)
    full["cut_frame"] = rng.integers(0, 255, (B, 42, 42)).astype(np.uint8)
    full["timeout_value"] = np.full((T, B), 7.0, np.float32)
    got = tf.function(learner.bootstrap_at_cuts, autograph=False)(
        {k: tf.constant(v) for k, v in full.items()})["timeout_value"].numpy()
    stack = np.concatenate([full["observation"][1, 0, ..., 1:], full["cut_frame"][0][..., None]], -1)
    out, _ = learner.agent(tf.constant(stack[None]), tf.zeros([1], tf.bool), ())
    assert got[1, 0] == pytest.approx(float(out.baseline[0]), abs=1e-5)
    got[1, 0] = 7.0
    np.testing.assert_array_equal(got, 7.0)
