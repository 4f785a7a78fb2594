"""envs/factory.py: shapes and dtypes per kind, the Atari pipeline, episodic life, game stats, ids."""
import numpy as np
import pytest

import envs


@pytest.mark.parametrize("env_id,num_actions,sticky", [
    ("PongNoFrameskip-v4", 6, 0.0),
    ("ALE/Breakout-v5", 4, 0.25),
])
def test_atari_observations_and_frame_skip(env_id, num_actions, sticky):
    env = envs.make_env(env_id, seed=0)
    try:
        assert env.observation_space.shape == (84, 84, 4)
        assert env.observation_space.dtype == np.uint8
        obs, _ = env.reset()
        assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
        ale = env.unwrapped.ale
        assert env.unwrapped._frameskip == 1  # the 4-frame skip is ours
        assert ale.getFloat("repeat_action_probability") == pytest.approx(sticky)
        for _ in range(5):
            frame_before = ale.getEpisodeFrameNumber()
            new_obs, reward, terminated, truncated, _ = env.step(0)
            assert ale.getEpisodeFrameNumber() - frame_before == 4
            assert new_obs.shape == (84, 84, 4) and new_obs.dtype == np.uint8
            assert isinstance(float(reward), float)
            assert not (terminated or truncated)
            # Frames shift left by one; the newest frame is last (HWC stack).
            np.testing.assert_array_equal(new_obs[:, :, :3], obs[:, :, 1:])
            obs = new_obs
    finally:
        env.close()
    spec = envs.env_spec(env_id)
    assert spec == envs.EnvSpec((84, 84, 4), np.dtype(np.uint8), num_actions, None, True, True)
    assert envs.is_atari(env_id)


def test_classic_control_observations():
    env = envs.make_env("CartPole-v1", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (4,) and obs.dtype == np.float32
    obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (4,) and obs.dtype == np.float32
    env.close()
    assert envs.env_spec("CartPole-v1") == envs.EnvSpec(
        (4,), np.dtype(np.float32), 2, None, True, False)
    assert not envs.is_atari("CartPole-v1")


def test_mujoco_observations_are_float32():
    env = envs.make_env("HalfCheetah-v5", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (17,) and obs.dtype == np.float32
    assert env.observation_space.dtype == np.float32
    obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (17,) and obs.dtype == np.float32
    env.close()
    assert envs.env_spec("HalfCheetah-v5") == envs.EnvSpec(
        (17,), np.dtype(np.float32), None, 6, False, False, (-1.0,) * 6, (1.0,) * 6)
    # The bounds the env batch clips to and --action_bound_cost holds the Gaussian's mean inside.
    assert envs.env_spec("Pendulum-v1")[-2:] == ((-2.0,), (2.0,))


def test_vector_episode_stats_on_the_last_step_only():
    env = envs.make_env("CartPole-v1", seed=1)
    env.reset()
    total, steps = 0.0, 0
    for _ in range(600):  # CartPole-v1 truncates at 500
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += reward
        steps += 1
        if terminated or truncated:
            assert info["episode"] == {"r": total, "l": steps}
            break
        assert "episode" not in info
    else:
        pytest.fail("CartPole episode did not end in 600 steps")


def test_breakout_episodic_life_reports_the_whole_game():
    # make_env(seed=...) resets once; every reset() presses FIRE and UP (FireReset),
    # which are agent steps of the game too.
    env = envs.make_env("ALE/Breakout-v5", seed=0, training=True)
    ale = env.unwrapped.ale
    env.reset()
    resets, steps, total, life_losses = 2, 0, 0.0, 0
    for _ in range(5000):
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        total += reward
        if "episode" in info:
            break
        if terminated:  # a life lost, the game goes on
            life_losses += 1
            lives = ale.lives()
            assert lives > 0 and not truncated
            env.reset()
            resets += 1
            assert ale.lives() == lives  # no emulator reset: same game
    else:
        pytest.fail("a random Breakout game did not end in 5000 steps")
    assert terminated and ale.lives() == 0
    assert life_losses == 4  # 5 lives: 4 episodic ends, then the game's end
    assert info["episode"] == {"r": total, "l": steps + 2 * resets}
    env.close()


def test_breakout_evaluation_plays_all_lives_in_one_episode():
    env = envs.make_env("ALE/Breakout-v5", seed=0, training=False)
    ale = env.unwrapped.ale
    lives_seen = {ale.lives()}
    for _ in range(5000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        lives_seen.add(ale.lives())
        if terminated or truncated:
            break
        assert "episode" not in info
    assert ale.lives() == 0 and "episode" in info
    assert lives_seen == {5, 4, 3, 2, 1, 0}
    env.close()


def test_same_seed_same_observations():
    def rollout():
        env = envs.make_env("PongNoFrameskip-v4", seed=3)
        obs, _ = env.reset()
        for action in [2, 3, 0, 2, 2, 3, 1, 0] * 3:
            obs, *_ = env.step(action)
        env.close()
        return obs
    np.testing.assert_array_equal(rollout(), rollout())


@pytest.mark.parametrize("bad_id", ["Pongg-v4", "NoSuchGame", "Pong-v4", "HalfCheetah-v3"])
def test_unknown_id_raises_a_clear_error(bad_id):
    for call in (envs.make_env, envs.env_spec, envs.is_atari):
        with pytest.raises(envs.UnknownEnvError) as err:
            call(bad_id)
        message = str(err.value)
        assert repr(bad_id) in message
        assert "NoFrameskip-v4" in message and "CartPole-v1" in message
    assert issubclass(envs.UnknownEnvError, ValueError)


def test_a_known_id_with_spaces_the_agents_cannot_take_is_refused_by_its_space():
    """FrozenLake's observations are Discrete(16): a known id, refused once made, naming the space."""
    assert not envs.is_atari("FrozenLake-v1")
    for call in (envs.make_env, envs.env_spec):
        with pytest.raises(envs.UnknownEnvError, match=r"'FrozenLake-v1' has observation space Discrete\(16\); "
                                                        r"supported are a 1-D Box"):
            call("FrozenLake-v1")


def test_unknown_id_suggests_close_ids():
    with pytest.raises(envs.UnknownEnvError, match="Did you mean: .*CartPole-v1"):
        envs.make_env("CartPol-v1")


def test_merge_frames_interleaves_into_contiguous_and_strided_outputs():
    frames = np.random.default_rng(0).integers(0, 256, (4, 84, 84), np.uint8)
    expected = np.moveaxis(frames, 0, -1)
    out = np.zeros((2, 84, 84, 4), np.uint8)
    envs.merge_frames(list(frames), out[1])  # a contiguous row: OpenCV writes in place
    assert np.array_equal(out[1], expected) and not out[0].any()
    strided = np.zeros((84, 84, 8), np.uint8)[..., ::2]  # OpenCV cannot write here: copied
    envs.merge_frames(list(frames), strided)
    assert np.array_equal(strided, expected)
    batch = np.stack([frames, frames[::-1]], axis=1)  # [4, 2, 84, 84]: leading axes merge as one image
    both = np.zeros((2, 84, 84, 8), np.uint8)[..., 1::2]
    envs.merge_frames(list(batch), both)
    assert np.array_equal(both, np.moveaxis(batch, 0, -1))
    envs.merge_frames(list(batch), out)
    assert np.array_equal(out, np.moveaxis(batch, 0, -1))
