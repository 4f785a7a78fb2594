"""env_batch.py: the native (ale-py C++ vector env) and Python backends give the actor the same thing."""
import gymnasium as gym
import numpy as np
import pytest

from envs import batch as env_batch
import envs

BACKENDS = ("python", "native")


def run_steps(batch, n, actions_fn, obs):
    """Steps n times; returns the StepResults."""
    out = []
    for t in range(n):
        batch.send(actions_fn(t))
        out.append(batch.recv(obs))
    return out


@pytest.mark.parametrize("size", [(84, 84), (42, 42), (64, 48)])
def test_both_backends_give_the_shapes_and_dtypes_the_nets_take(size):
    spec = envs.env_spec("PongNoFrameskip-v4", size)
    for backend in BACKENDS:
        batch = env_batch.make_batch(backend, "PongNoFrameskip-v4", 3, seed=5, frame_size=size)
        try:
            obs = np.zeros((3,) + spec.obs_shape, spec.obs_dtype)
            batch.reset(obs)
            assert obs.shape == (3, size[1], size[0], 4) and obs.dtype == np.uint8
            assert obs.max() > 0  # a real frame arrived
            r = run_steps(batch, 3, lambda t: np.zeros(3, np.int64), obs)[-1]
            assert r.reward.dtype == np.float32 and r.reward.shape == (3,)
            assert r.done.dtype == bool and r.episode_end.dtype == bool and r.cut.dtype == bool
            assert r.episode_return.dtype == np.float32 and r.episode_length.dtype == np.int32
            # the stack shifts: the newest frame is last, as in envs.FrameStack
            before = obs.copy()
            run_steps(batch, 1, lambda t: np.zeros(3, np.int64), obs)
            np.testing.assert_array_equal(obs[..., :3], before[..., 1:])
        finally:
            batch.close()


def test_native_frames_match_the_python_pipeline():
    """Same preprocessing: the first frame after reset is Pong's court in both, to within
    the resize's rounding (the two resets take different random no-ops, so compare the
    static background, the top rows with the score)."""
    frames = {}
    for backend in BACKENDS:
        batch = env_batch.make_batch(backend, "PongNoFrameskip-v4", 1, seed=3)
        obs = np.zeros((1, 84, 84, 4), np.uint8)
        batch.reset(obs)
        frames[backend] = obs[0, :14, :, -1].astype(int)
        batch.close()
    assert np.abs(frames["python"] - frames["native"]).mean() < 2.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_same_seed_gives_the_same_games(backend):
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 6, (60, 2))
    trajectories = []
    for seed in (11, 11, 12):
        batch = env_batch.make_batch(backend, "PongNoFrameskip-v4", 2, seed=seed)
        obs = np.zeros((2, 84, 84, 4), np.uint8)
        batch.reset(obs)
        seen = [obs.copy()]
        for t in range(60):
            batch.send(actions[t])
            batch.recv(obs)
            seen.append(obs.copy())
        batch.close()
        trajectories.append(np.stack(seen))
    np.testing.assert_array_equal(trajectories[0], trajectories[1])
    assert not np.array_equal(trajectories[0], trajectories[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lost_life_ends_an_episode_for_training_but_not_the_game(backend):
    """Breakout, 5 lives: in training every lost life is a `done` for the learner, but
    episode_end (and the return and length reported) come once, for the whole game."""
    batch = env_batch.make_batch(backend, "ALE/Breakout-v5", 1, seed=2, training=True)
    obs = np.zeros((1, 84, 84, 4), np.uint8)
    batch.reset(obs)
    rng = np.random.default_rng(1)
    dones, total, steps = 0, 0.0, 0
    for _ in range(8000):
        batch.send(rng.integers(0, 4, 1))
        r = batch.recv(obs)
        steps += 1
        total += float(r.reward[0])
        if r.episode_end[0]:
            break
        assert not r.cut[0]
        dones += int(r.done[0])
    else:
        pytest.fail("a random Breakout game did not end in 8000 steps")
    batch.close()
    assert r.done[0] and not r.cut[0]
    assert dones == 4  # the four lives before the last one
    assert r.episode_return[0] == pytest.approx(total)
    # envs/factory.py's FireReset takes FIRE and UP as agent steps of the game after every reset
    extra = 2 * (dones + 1) if backend == "python" else 0
    assert r.episode_length[0] == steps + extra


@pytest.mark.parametrize("backend", BACKENDS)
def test_evaluation_plays_all_lives_as_one_episode(backend):
    batch = env_batch.make_batch(backend, "ALE/Breakout-v5", 1, seed=2, training=False)
    obs = np.zeros((1, 84, 84, 4), np.uint8)
    batch.reset(obs)
    rng = np.random.default_rng(1)
    for _ in range(8000):
        batch.send(rng.integers(0, 4, 1))
        r = batch.recv(obs)
        if r.done[0]:
            break
    batch.close()
    assert r.episode_end[0]  # the first `done` is the end of the game


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_limit_is_a_truncation_with_the_last_observation(backend):
    """At the frame limit: done, cut (not terminated), the game's stats, the last observation
    of the old episode in final_obs, and a fresh episode in the observation."""
    batch = env_batch.make_batch(backend, "PongNoFrameskip-v4", 2, seed=4, max_episode_frames=400)
    obs = np.zeros((2, 84, 84, 4), np.uint8)
    batch.reset(obs)
    seen = {}  # env -> (observation before, the step's result, observation after)
    for t in range(200):
        before = obs.copy()
        batch.send(np.array([2, 3]))
        r = batch.recv(obs)
        for i in np.flatnonzero(r.done):
            seen.setdefault(i, (before[i], r, obs[i].copy(), i))
        if len(seen) == 2:
            break
    batch.close()
    assert sorted(seen) == [0, 1]
    for before, r, after, i in seen.values():
        assert r.cut[i] and r.episode_end[i]
        assert 80 <= r.episode_length[i] <= 100  # 400 frames / 4, minus the no-ops
        assert r.final_obs is not None
        # the last observation continues the old stack; the new episode starts a fresh one
        np.testing.assert_array_equal(r.final_obs[i][..., :3], before[..., 1:])
        assert not np.array_equal(r.final_obs[i], after)
        assert all(np.array_equal(after[..., 0], after[..., c]) for c in range(1, 3))


def test_native_stacks_equal_ale_pys_own_stacking():
    """The frame stacks NativeAtariBatch keeps (ale-py steps with stack_num=1) are exactly those of
    ale-py's own stacking (stack_num=4), in the observations and the cut games' final_obs, over
    games that restart at the time limit."""
    E, seed = 3, 5
    batch = env_batch.make_batch("native", "PongNoFrameskip-v4", E, seed=seed, max_episode_frames=400)
    ale = env_batch.ale_vector_env("PongNoFrameskip-v4", E, threads=1, max_episode_frames=400, stack_num=4)
    obs = np.zeros((E, 84, 84, 4), np.uint8)
    batch.reset(obs)
    ref, _ = ale.reset(seed=seed + 1)
    np.testing.assert_array_equal(obs, np.moveaxis(ref, 1, -1))
    actions, cuts = np.random.default_rng(0).integers(0, 6, (250, E)), 0
    for a in actions:
        batch.send(a)
        r = batch.recv(obs)
        ref, _, _, truncated, info = ale.step(a.astype(np.int32))
        np.testing.assert_array_equal(obs, np.moveaxis(ref, 1, -1))
        np.testing.assert_array_equal(r.cut, truncated)
        for e in np.flatnonzero(r.cut):
            np.testing.assert_array_equal(r.final_obs[e], np.moveaxis(info["final_obs"][e], 0, -1))
        cuts += int(r.cut.sum())
    batch.close()
    ale.close()
    assert cuts >= 2 * E  # every env restarted at least twice


def test_backend_choice_and_errors():
    assert env_batch.resolve_backend("auto", "PongNoFrameskip-v4") == "native"
    assert env_batch.resolve_backend("auto", "CartPole-v1") == "python"
    assert env_batch.resolve_backend("python", "ALE/Pong-v5") == "python"
    with pytest.raises(ValueError, match="--env_backend=native steps Atari games only.*CartPole-v1"):
        env_batch.resolve_backend("native", "CartPole-v1")
    with pytest.raises(ValueError, match="--env_backend=gpu"):
        env_batch.resolve_backend("gpu", "CartPole-v1")


def test_classic_control_through_the_python_backend():
    batch = env_batch.make_batch("auto", "CartPole-v1", 4, seed=1)
    obs = np.zeros((4, 4), np.float32)
    batch.reset(obs)
    ends = 0
    for t in range(300):
        batch.send(np.zeros(4, np.int64))  # always left: falls within ~10 steps
        r = batch.recv(obs)
        ends += int(r.episode_end.sum())
        assert np.array_equal(r.done, r.episode_end)
    batch.close()
    assert ends >= 4


class _FireEndsTheGame(gym.Env):
    """A game in miniature as FireReset sees it in training (GameStats and EpisodicLife below it):
    action 0 loses a life, which ends the episode but not the game (reset() goes on with it); FIRE
    (1) ends the game, its statistics in the step's info as GameStats gives them. Reward 1 a step."""
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)
    steps = None  # the game's steps so far; None: no game under way

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = self.steps or 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        info = {}
        if action == 1:
            info, self.steps = {"episode": {"r": float(self.steps), "l": self.steps}}, None
        return np.zeros(2, np.float32), 1.0, action in (0, 1), False, info


def test_a_game_that_ends_inside_the_reset_is_reported(monkeypatch):
    """A game can end inside reset()'s own steps (FireReset's FIRE and UP after a lost life), which
    then reports the game's statistics in its info: the batch reports them on the step that lost the
    life. Here the reset's FIRE ends the game in its 3rd step (FIRE and UP of the first reset, whose
    FIRE ended a game, then the agent's step)."""
    monkeypatch.setattr(env_batch.envs, "make_env", lambda *a, **kw: env_batch.envs.FireReset(_FireEndsTheGame()))
    batch = env_batch.PythonBatch("FireEndsTheGame", 1, seed=0)
    obs = np.zeros((1, 2), np.float32)
    batch.reset(obs)
    batch.send(np.zeros(1, np.int64))
    r = batch.recv(obs)
    assert r.done[0] and r.episode_end[0]
    assert (r.episode_return[0], r.episode_length[0]) == (3.0, 3)
    batch.send(np.full(1, 2, np.int64))  # UP: nothing ends, nothing is reported again
    assert not batch.recv(obs).episode_end[0]


@pytest.mark.parametrize("backend,groups", [("native", 2), ("native", 1), ("python", 1)])
def test_actor_unrolls_keep_each_env_on_its_own_row(backend, groups):
    """actor.fill_unroll with the envs in groups: every row is one env's own sequence (each
    frame stack continues the last unless an episode began), and an unroll starts where the
    previous one ended."""
    import types
    import tensorflow as tf
    from impala import actor
    from impala import agent as agent_lib
    from impala.timings import Timings
    E, T = 4, 12
    flags = types.SimpleNamespace(envs_per_actor=E, env_groups=groups, env_backend=backend, env_threads=1,
                                  level_name="PongNoFrameskip-v4", seed=3, width=42, height=42)
    agent, spec, env_spec = agent_lib.build_agent(flags.level_name, "SimpleConvNetAgent", T, (42, 42))
    step = tf.function(lambda o, f, s: agent(o, f, s))
    groups_made = actor.make_groups(flags, 0, agent, env_spec)
    assert len(groups_made) == groups
    buf = {f.name: np.zeros((E,) + f.shape, f.dtype) for f in spec.fields}
    timing = Timings(*actor.PHASES)
    last = None
    for _ in range(2):
        actor.fill_unroll(groups_made, buf, step, T, timing)
        obs, first = buf["observation"], buf["first"]
        if last is not None:
            np.testing.assert_array_equal(obs[:, 0], last)
        for t in range(T):
            for i in range(E):
                if not first[i, t + 1]:
                    np.testing.assert_array_equal(obs[i, t + 1][..., :3], obs[i, t][..., 1:])
        assert set(np.unique(buf["action"])) <= set(range(6))
        last = obs[:, T].copy()
    assert timing["env"] > 0 and timing["inference"] > 0
    for g in groups_made:
        g.batch.close()


def test_newest_frames_rebuild_the_stacks_also_where_games_restart():
    """Unrolls sent as newest frames (--obs_transfer=frames) give the learner exactly the stacks
    the actor saw: two copies of the same envs with the same actions, one buffer with stacks,
    one with frames, over unrolls of 7 steps and games cut at 100 steps (so new games start
    at every position of an unroll, and their black frames reach into the next unroll)."""
    import tensorflow as tf
    from impala import actor
    from impala import agent as agent_lib
    from impala import transport
    from impala.timings import Timings
    import nets
    E, T, level = 4, 7, "PongNoFrameskip-v4"
    agent, stacks_spec, env_spec = agent_lib.build_agent(level, "SimpleConvNetAgent", T, (42, 42))
    _, frames_spec, _ = agent_lib.build_agent(level, "SimpleConvNetAgent", T, (42, 42), newest_frames=True)
    assert "frames" in frames_spec.names and "observation" not in frames_spec.names

    def fixed_policy(o, f, s):  # the same actions in both copies: env i presses i % 6
        n = o.shape[0]
        return nets.AgentOutput(tf.constant(np.arange(n) % 6, tf.int32), tf.zeros([n, 6]), tf.zeros([n])), s

    def groups():
        batch = env_batch.make_batch("native", level, E, seed=11, frame_size=(42, 42), max_episode_frames=400)
        return [actor.EnvGroup(batch, slice(0, E), env_spec.obs_shape, env_spec.obs_dtype, ())]

    runs = []
    for spec in (stacks_spec, frames_spec):
        gs, buf, got = groups(), {f.name: np.zeros((E,) + f.shape, f.dtype) for f in spec.fields}, []
        for _ in range(16):
            actor.fill_unroll(gs, buf, fixed_policy, T, Timings(*actor.PHASES))
            got.append({k: v.copy() for k, v in buf.items()})
        gs[0].batch.close()
        runs.append(got)
    restarts = 0
    for full, sent in zip(*runs):
        np.testing.assert_array_equal(sent["first"], full["first"])
        rebuilt = transport.stack_frames(sent["frames"], sent["stack_reset"])
        np.testing.assert_array_equal(rebuilt, np.swapaxes(full["observation"], 0, 1))
        restarts += int(sent["stack_reset"].sum())
    assert restarts >= E  # every env began a new game at least once
