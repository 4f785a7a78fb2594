"""The actor's environments as one batch: E envs stepped together, two backends.

* `PythonBatch`: E gymnasium envs from envs.make_env, stepped one by one in Python.
  Every kind of env (Atari, classic control, MuJoCo).
* `NativeAtariBatch`: ale-py's C++ vector env (`ale_py.vector_env.AtariVectorEnv`):
  frame skip, max-pool, resize, grayscale, frame stack and no-op reset run in a
  C++ thread pool (`threads`), with the GIL released. Atari only.

Both give the actor the same thing for each step:

    batch.send(actions)            # native: returns at once, the C++ threads step
    result = batch.recv(obs_out)   # waits; writes the next observations into obs_out

with the semantics of the factory's Atari pipeline, so the learner cannot tell them apart:
`done` is the learner's episode boundary (in training a lost life is one, as
EpisodicLife makes it), `episode_end` / `episode_return` / `episode_length` belong
to the whole game (all lives), and `cut` marks episodes ended by the time limit
(108,000 frames), whose last observations are in `final_obs` for the actor's
timeout_value bootstrap. Observations are [E, H, W, 4] uint8 as the nets take them
(the native env gives one [H, W] frame per env and step; the stacks are kept here and
interleaved by OpenCV's merge, about 0.035 ms for 32 envs at 84x84).

Two differences of the native backend, both inside ALE's own reset: it presses FIRE
once, for one frame, before the no-ops (the factory's FireReset presses FIRE then UP after
them, each for a whole agent step), and after a lost life it presses nothing (the factory
presses FIRE and UP again), so in Breakout the agent launches the ball itself. Pong has no
lives and no ball to launch. A new game's stack differs too: C-1 black frames and the first
frame here, C copies of the first frame in the factory's FrameStack. The evaluator and
--mode=test step the same backend as the actors (impala.evaluator.EvalEnv), so they see
these semantics too.

`make_batch(..., render=True)` adds `batch.render()`: each env's screen in colour (RGB
[210, 160, 3] for Atari), for --mode=test's GIF.
"""
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from envs import factory as envs


class StepResult(NamedTuple):
    reward: np.ndarray  # [E] float32, unclipped
    done: np.ndarray  # [E] bool: the learner's episode boundary
    cut: np.ndarray  # [E] bool: ended by a time limit, not by the task
    final_obs: np.ndarray | None  # [E, ...] last observations of the `cut` rows (None when no row is cut)
    episode_end: np.ndarray  # [E] bool: a whole game (episode) ended on this step
    episode_return: np.ndarray  # [E] float32, valid where episode_end
    episode_length: np.ndarray  # [E] int32 agent steps, valid where episode_end


BACKENDS = ("auto", "native", "python")


def resolve_backend(backend, level_name):
    """'native' or 'python' for --env_backend=backend; raises ValueError naming the flag."""
    if backend not in BACKENDS:
        raise ValueError("--env_backend=%s: must be one of %s" % (backend, ", ".join(BACKENDS)))
    atari = envs.is_atari(level_name)
    if backend == "native" and not atari:
        raise ValueError("--env_backend=native steps Atari games only (ale-py's vector env); "
                         "--level_name=%s needs --env_backend=python (or auto)" % level_name)
    if backend == "auto":
        return "native" if atari else "python"
    return backend


def make_batch(backend, level_name, num_envs, seed, training=True, frame_size=envs.FRAME_SIZE, threads=1,
               max_episode_frames=None, render=False):
    """The batch of num_envs envs; env i is seeded with seed + i. max_episode_frames: Atari's
    time limit in emulator frames (None: ALE's 108,000). render: the batch also has render()."""
    if resolve_backend(backend, level_name) == "native":
        cls = RenderedNativeAtariBatch if render else NativeAtariBatch
        return cls(level_name, num_envs, seed, training, frame_size, threads, max_episode_frames)
    return PythonBatch(level_name, num_envs, seed, training, frame_size, max_episode_frames,
                       render_mode="rgb_array" if render else None)


def _empty_result(n):
    return (np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool),
            np.zeros(n, np.float32), np.zeros(n, np.int32))


class PythonBatch:
    """E envs of envs.make_env, stepped one after the other in this thread."""

    def __init__(self, level_name, num_envs, seed, training=True, frame_size=envs.FRAME_SIZE,
                 max_episode_frames=None, render_mode=None):
        self.num_envs = num_envs
        self.envs = [envs.make_env(level_name, seed=seed + i, training=training, frame_size=frame_size,
                                   max_episode_frames=max_episode_frames, render_mode=render_mode)
                     for i in range(num_envs)]
        self._seed = seed
        self._actions = None

    def reset(self, obs_out):
        for i, env in enumerate(self.envs):
            obs_out[i] = env.reset(seed=self._seed + i)[0]

    def send(self, actions):
        self._actions = actions

    def recv(self, obs_out):
        reward, done, cut, ended, ret, length = _empty_result(self.num_envs)
        final_obs = None
        for i, env in enumerate(self.envs):
            o, r, terminated, truncated, info = env.step(int(self._actions[i]))
            if truncated and not terminated:
                if final_obs is None:
                    final_obs = np.zeros((self.num_envs,) + o.shape, o.dtype)
                final_obs[i], cut[i] = o, True
            if terminated or truncated:
                o, _ = env.reset()
            ep = info.get("episode")
            if ep is not None:
                ended[i], ret[i], length[i] = True, float(np.asarray(ep["r"])), int(np.asarray(ep["l"]))
            obs_out[i] = o
            reward[i], done[i] = r, terminated or truncated
        return StepResult(reward, done, cut, final_obs, ended, ret, length)

    def render(self):
        """Each env's screen (gymnasium's env.render(); needs make_batch(..., render=True))."""
        return [env.render() for env in self.envs]

    def close(self):
        for env in self.envs:
            env.close()


ALE_SCREEN = (160, 210)  # (width, height) of every Atari game's screen


def ale_vector_env(level_name, num_envs, threads, frame_size=envs.FRAME_SIZE, max_episode_frames=None,
                   stack_num=envs.FRAME_STACK, grayscale=True):
    """ale-py's AtariVectorEnv for a gymnasium Atari id, with the factory's preprocessing and
    same-step autoreset. Lives are followed by NativeAtariBatch: a lost life must not reset."""
    from ale_py.vector_env import AtariVectorEnv
    spec = gym.spec(level_name)
    width, height = envs.width_height(frame_size)
    sticky = envs.V5_REPEAT_ACTION_PROBABILITY if level_name.startswith("ALE/") else 0.0
    return AtariVectorEnv(
        spec.kwargs["game"], num_envs, num_threads=threads, frameskip=envs.FRAME_SKIP, stack_num=stack_num,
        img_height=height, img_width=width, grayscale=grayscale, maxpool=True, noop_max=envs.NOOP_MAX,
        repeat_action_probability=sticky, reward_clipping=False, use_fire_reset=True,
        episodic_life=False, life_loss_info=False,
        max_num_frames_per_episode=max_episode_frames or spec.kwargs.get("max_num_frames_per_episode", 108_000),
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


class NativeAtariBatch:
    """ale-py's AtariVectorEnv with the factory's Atari semantics (see the module docstring)."""

    def __init__(self, level_name, num_envs, seed, training=True, frame_size=envs.FRAME_SIZE, threads=1,
                 max_episode_frames=None):
        self.num_envs, self.training, self._seed = num_envs, training, seed
        self.env = ale_vector_env(level_name, num_envs, threads, frame_size, max_episode_frames, stack_num=1)
        self._lives = np.zeros(num_envs, np.int32)
        self._return = np.zeros(num_envs, np.float64)
        self._length = np.zeros(num_envs, np.int32)
        self._frames = None  # [C, E, H, W]: each env's last C frames in a ring of C slots
        self._oldest = 0  # the slot of the oldest frame, the same in every env

    @property
    def num_actions(self):
        return int(self.env.single_action_space.n)

    def _ale_seed(self):
        # ALE seeds an env only with a seed > 0 (0 would leave it random): shift by one.
        return self._seed + 1

    def reset(self, obs_out):
        obs, info = self.env.reset(seed=self._ale_seed())
        self._lives[:] = info["lives"]
        self._return[:], self._length[:] = 0.0, 0
        self._frames = np.zeros((envs.FRAME_STACK, self.num_envs) + obs.shape[2:], np.uint8)
        self._push(obs[:, 0], np.ones(self.num_envs, bool))
        self._stacks(obs_out)

    def send(self, actions):
        self.env.send(np.asarray(actions, np.int32))

    def recv(self, obs_out):
        obs, reward, terminated, truncated, info = self.env.recv()
        reward = reward.astype(np.float32)
        game_over = terminated | truncated  # the env has already reset these (same-step autoreset)
        self._return += reward
        self._length += 1
        ended = game_over.copy()
        ret, length = self._return.astype(np.float32), self._length.copy()
        self._return[game_over], self._length[game_over] = 0.0, 0
        lives = info["lives"]
        done = game_over.copy()
        if self.training:  # EpisodicLife: a lost life (not the last one, not at game over) ends an episode
            done |= (lives > 0) & (lives < self._lives) & ~game_over
        self._lives[:] = lives
        cut = truncated & ~terminated
        final_obs = None
        if cut.any():  # the cut games' last observations: their stacks with the final frame pushed
            final_obs = np.zeros(obs_out.shape, obs_out.dtype)
            C, last = self._frames.shape[0], info["final_obs"][:, 0]
            for e in np.flatnonzero(cut):
                envs.merge_frames([self._frames[(self._oldest + k) % C, e] for k in range(1, C)] + [last[e]],
                                  final_obs[e])
        self._push(obs[:, 0], game_over)
        self._stacks(obs_out)
        return StepResult(reward, done, cut, final_obs, ended, ret, length)

    def _push(self, frame, new_game):
        """The frame stack, kept here rather than by ale-py (stack_num=1): each env's newest frame
        takes its oldest one's slot, and a new game's stack restarts as C-1 black frames and its
        first frame, as ale-py's own stacking does. ale-py steps as fast either way (0.98-1.01x), but
        the ring, slot-major, lets one OpenCV merge interleave all envs' stacks (_stacks): 17 us
        for 16 envs against 256 us for numpy's channel-by-channel copy (actor_costs.md)."""
        self._frames[:, new_game] = 0
        self._frames[self._oldest] = frame
        self._oldest = (self._oldest + 1) % self._frames.shape[0]

    def _stacks(self, out):
        """out[E, H, W, C]: each env's frames from the oldest to the newest, interleaved, all
        envs in one merge (slot s of the ring is one [E * H, W] image)."""
        C = self._frames.shape[0]
        envs.merge_frames([self._frames[(self._oldest + k) % C] for k in range(C)], out)

    def close(self):
        self.env.close()


class RenderedNativeAtariBatch(NativeAtariBatch):
    """NativeAtariBatch that also shows each env's screen in colour (render()). ale-py's vector env
    gives no screens, so a twin vector env, RGB at the full 210x160, gets the same seeds and the
    same actions: ALE is deterministic given its seed (no-ops and sticky actions included), so
    the twin plays the very same games. Its frames are max-pooled over the last two, as the
    agent's are. Twice the emulation: for --mode=test's GIF, not for training."""

    def __init__(self, level_name, num_envs, seed, training=True, frame_size=envs.FRAME_SIZE, threads=1,
                 max_episode_frames=None):
        super().__init__(level_name, num_envs, seed, training, frame_size, threads, max_episode_frames)
        self._twin = ale_vector_env(level_name, num_envs, threads, ALE_SCREEN, max_episode_frames,
                                    stack_num=1, grayscale=False)
        self._screens = None  # [E, 210, 160, 3] uint8, the twin's newest frames

    def reset(self, obs_out):
        super().reset(obs_out)
        self._screens = self._twin.reset(seed=self._ale_seed())[0][:, 0]

    def send(self, actions):
        super().send(actions)
        self._twin.send(np.asarray(actions, np.int32))

    def recv(self, obs_out):
        self._screens = self._twin.recv()[0][:, 0]
        return super().recv(obs_out)

    def render(self):
        """Each env's screen now, RGB [210, 160, 3] uint8 (copies: ale-py may reuse its buffers)."""
        return [s.copy() for s in self._screens]

    def close(self):
        super().close()
        self._twin.close()
