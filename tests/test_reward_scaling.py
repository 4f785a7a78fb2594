"""--normalize_rewards: rewards divided by the running standard deviation of each env's discounted
return, clipped to +-10 (SB3 VecNormalize's norm_reward, CleanRL's and WALL-E's reward scaling).

The actor keeps each env's discounted return across unrolls (the "discounted_return" field); the
learner folds the fresh unrolls' returns into its statistics once per batch and scales the rewards
every gradient step reads."""
import types

import numpy as np
import tensorflow as tf

from envs.batch import StepResult
from impala import actor as actor_lib
from impala import agent as agent_lib
from impala import learner as learner_lib
from impala.timings import Timings
from tests.test_learner import _experiment_defaults, feed_half_replayed

GAMMA = 0.9


class _RewardEnvs:
    """Two envs paying rewards[t] on step t; env 0's episode ends at step 2 (terminated) and
    env 1's at step 4 (a time limit: not `done`, but a new episode starts after it)."""

    def __init__(self, rewards):
        self.rewards, self.t = rewards, 0

    def reset(self, obs):
        obs[:] = 0.0

    def send(self, actions):
        pass

    def recv(self, obs):
        t, self.t = self.t, self.t + 1
        done = np.array([t == 2, False])
        new = np.array([t == 2, t == 4])
        zeros = np.zeros(2, np.float32)
        return StepResult(self.rewards[t].copy(), done, new & ~done, None, new, zeros, np.zeros(2, np.int32),
                          np.zeros(2, np.int32), new)


def _reference_returns(rewards):
    """Each env's discounted return after each step, 0 again after its episode's last step."""
    out, ret = np.zeros_like(rewards), np.zeros(2)
    for t in range(len(rewards)):
        ret = GAMMA * ret + rewards[t]
        out[t] = ret
        ret[[t == 2, t == 4]] = 0.0
    return out


def test_the_actor_carries_each_envs_discounted_return_across_unrolls():
    T = 3
    spec = agent_lib.build_agent("CartPole-v1", "MLPAgent", T, discounted_return=True)[1]
    buf = {f.name: np.zeros((2,) + f.shape, f.dtype) for f in spec.fields}
    rewards = np.arange(1, 13, dtype=np.float32).reshape(6, 2)
    group = actor_lib.EnvGroup(_RewardEnvs(rewards), slice(0, 2), (4,), np.float32, ())

    def step(o, f, s):
        return types.SimpleNamespace(action=tf.zeros([2], tf.int32), policy_logits=tf.zeros([2, 2]),
                                     baseline=tf.zeros([2])), s
    got = []
    for _ in range(2):  # the second unroll goes on from the first one's returns
        actor_lib.fill_unroll([group], buf, step, T, Timings(*actor_lib.PHASES), GAMMA)
        got.append(buf["discounted_return"].T.copy())
    np.testing.assert_allclose(np.concatenate(got), _reference_returns(rewards), rtol=1e-6)


def test_the_unrolls_carry_returns_only_with_the_flag():
    names = [f.name for f in agent_lib.build_agent("CartPole-v1", "MLPAgent", 5)[1].fields]
    assert "discounted_return" not in names


def _learner(tmp_path, **kw):
    flags = _experiment_defaults(**dict(dict(
        level_name="Pendulum-v1", agent_name="MLPAgent", batch_size=4, unroll_length=5, discounting=GAMMA,
        normalize_rewards=True, total_environment_frames=10 ** 6), **kw))
    return learner_lib.Learner(flags, str(tmp_path))


def test_rewards_are_divided_by_the_pooled_std_of_the_returns_and_clipped(tmp_path):
    lrn = _learner(tmp_path)
    rng = np.random.default_rng(0)
    returns = rng.normal(3.0, 2.0, (5, 4)).astype(np.float32)
    rewards = rng.normal(0.0, 1.0, (5, 4)).astype(np.float32)
    rewards[0, 0] = 1000.0  # far past the clip
    batch = lrn.scale_rewards({"discounted_return": tf.constant(returns), "reward": tf.constant(rewards)})
    # Chan's pooling of the prior (one sample at mean 0, variance 1) with the 20 returns
    n, m, v = returns.size, returns.mean(), returns.var()
    mean = n * m / (n + 1)
    var = (1 * 1.0 + n * v) / (n + 1) + m ** 2 * n / (n + 1) ** 2
    np.testing.assert_allclose(lrn.reward_normaliser.var.numpy(), var, rtol=1e-5)
    np.testing.assert_allclose(lrn.reward_normaliser.mean.numpy(), mean, rtol=1e-5)
    want = np.clip(rewards / np.sqrt(var + 1e-5), -10.0, 10.0)
    np.testing.assert_allclose(batch["reward"].numpy(), want, rtol=1e-5)
    assert batch["reward"].numpy()[0, 0] == 10.0


def test_the_update_scales_fresh_unrolls_once_and_a_checkpoint_keeps_the_statistics(tmp_path):
    """Half of each batch replayed: the statistics count each unroll once, when it is new (T samples
    per fresh unroll), and a restored learner scales as the saved one did."""
    replay = ('[{"type":"queue","capacity":1,"sample_ratio":0.5},'
              '{"type":"standard","capacity":16,"sample_ratio":0.5}]')
    lrn = _learner(tmp_path / "run", replay_parameters=replay)

    def fill(live, rng):
        live["reward"][:] = rng.normal(size=live["reward"].shape)
        live["discounted_return"][:] = rng.normal(5.0, 3.0, size=live["discounted_return"].shape)
    fed = feed_half_replayed(lrn, fill)
    assert float(lrn.reward_normaliser.count.numpy()) == 1 + 5 * fed
    assert 4.0 < float(lrn.reward_normaliser.var.numpy()) < 16.0
    prefix = lrn.save()
    restored = _learner(tmp_path / "restored", replay_parameters=replay)
    restored.restore(prefix)
    np.testing.assert_array_equal(restored.reward_normaliser.var.numpy(), lrn.reward_normaliser.var.numpy())
    assert float(restored.reward_normaliser.count.numpy()) == 1 + 5 * fed
