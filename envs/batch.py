"""The actor's environments as one batch: E envs stepped together, two backends.

* `PythonBatch`: E gymnasium envs from envs.make_env, stepped one by one in Python.
  Every env the factory makes (Atari, classic control, MuJoCo, users' envs).
* `NativeAtariBatch`: ale-py's C++ vector env (`ale_py.vector_env.AtariVectorEnv`):
  frame skip, max-pool, resize, grayscale, frame stack and no-op reset run in a
  C++ thread pool (`threads`), with the GIL released. Atari only.

Both give the actor the same thing for each step:

    batch.send(actions)            # native: returns at once, the C++ threads step
    result = batch.recv(obs_out)   # waits; writes the next observations into obs_out

with the semantics of the factory's Atari pipeline, so the learner cannot tell them apart:
`done` is the learner's episode boundary (in training a lost life is one, as
EpisodicLife makes it), `new_episode` where the recurrent state restarts (a new game, not a
lost life), `episode_end` / `episode_return` / `episode_length` belong
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

Envs that crash: in the Python backend an exception in an env's step or reset ends that env's
episode (the step is a termination with reward 0 and no episode statistics), is counted in
`crashes` and logged once per env, and the env is made anew with a new seed; the actor goes on.
MAX_CRASHES_IN_A_ROW crashes with no successful step between raise EnvCrashLoop.
"""
import sys
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
    crashes: np.ndarray  # [E] int32: exceptions of each env since the last result (Python backend)
    # [E] bool: the next observation starts a new episode (game over, time limit, an env made anew
    # after a crash). The recurrent state restarts here, in training and evaluation alike; unlike
    # `done`, not at a lost life, which ends only the learner's discounting.
    new_episode: np.ndarray


MAX_CRASHES_IN_A_ROW = 100


class EnvCrashLoop(RuntimeError):
    """An env batch's envs crashed MAX_CRASHES_IN_A_ROW times with no successful step between."""


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
               max_episode_frames=None, render=False, log=None):
    """The batch of num_envs envs; env i is seeded with seed + i. max_episode_frames: Atari's
    time limit in emulator frames (None: ALE's 108,000). render: the batch also has render().
    log: where the Python backend says that an env crashed (default: stderr)."""
    if resolve_backend(backend, level_name) == "native":
        cls = RenderedNativeAtariBatch if render else NativeAtariBatch
        return cls(level_name, num_envs, seed, training, frame_size, threads, max_episode_frames)
    return PythonBatch(level_name, num_envs, seed, training, frame_size, max_episode_frames,
                       render_mode="rgb_array" if render else None, log=log)


def _empty_result(n):
    return (np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool),
            np.zeros(n, np.float32), np.zeros(n, np.int32))


def _stderr(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _action_converter(space):
    """What env.step takes for one row of the policy's actions: an int for a Discrete space;
    for a Box the action clipped to its bounds (the policy's Gaussian is unbounded, and the
    unroll keeps the unclipped action, whose probability the learner reads)."""
    if isinstance(space, gym.spaces.Box):
        low, high, dtype = space.low, space.high, space.dtype
        return lambda a: np.clip(a, low, high).astype(dtype)
    return int


class PythonBatch:
    """E envs of envs.make_env, stepped one after the other in this thread. An env whose step or
    reset raises is made anew (see the module docstring)."""

    def __init__(self, level_name, num_envs, seed, training=True, frame_size=envs.FRAME_SIZE,
                 max_episode_frames=None, render_mode=None, log=None):
        self.num_envs = num_envs
        self._make_kwargs = dict(training=training, frame_size=frame_size, max_episode_frames=max_episode_frames,
                                 render_mode=render_mode)
        self._level_name = level_name
        self.envs = [envs.make_env(level_name, seed=seed + i, **self._make_kwargs) for i in range(num_envs)]
        self._seed = seed
        self._actions = None
        self._as_action = _action_converter(self.envs[0].action_space)
        self._log = log or _stderr
        self._crashes = np.zeros(num_envs, np.int32)  # since the last result
        self.total_crashes = 0
        self._remade = np.zeros(num_envs, np.int64)  # how often each env was made anew: its seeds
        self._in_a_row = 0
        self._reported = set()  # envs whose first crash was logged
        self._reset_episode = [None] * num_envs  # a game's statistics that a reset() reported (recv)

    def reset(self, obs_out):
        for i, env in enumerate(self.envs):
            try:
                obs_out[i] = env.reset(seed=self._seed + i)[0]
            except Exception as e:  # the user's env may raise anything
                self._crashed(i, "reset", e)
                obs_out[i] = self._remake(i)

    def send(self, actions):
        self._actions = actions

    def recv(self, obs_out):
        reward, done, cut, ended, ret, length = _empty_result(self.num_envs)
        new = np.zeros(self.num_envs, bool)
        final_obs = None
        for i, env in enumerate(self.envs):
            try:
                o, r, terminated, truncated, info = env.step(self._as_action(self._actions[i]))
            except Exception as e:  # the episode ends here, without statistics: a partial one
                self._crashed(i, "step", e)
                obs_out[i], done[i], new[i] = self._remake(i), True, True
                continue
            self._in_a_row = 0
            if truncated and not terminated:
                if final_obs is None:
                    final_obs = np.zeros((self.num_envs,) + o.shape, o.dtype)
                final_obs[i], cut[i] = o, True
            if terminated or truncated:
                # a whole game ended (GameStats' info), or one ended inside the reset's own steps
                o, ended_in_reset = self._reset_after_episode(i)
                new[i] = "episode" in info or ended_in_reset
            # A game can end inside the reset's own steps (FireReset's FIRE and UP after a lost life);
            # the reset reports it, here, or on the next step when this one ended a game itself.
            ep = info.get("episode")
            if ep is None:
                ep, self._reset_episode[i] = self._reset_episode[i], None
            if ep is not None:
                ended[i], ret[i], length[i] = True, float(np.asarray(ep["r"])), int(np.asarray(ep["l"]))
            obs_out[i] = o
            reward[i], done[i] = r, terminated or truncated
        crashes, self._crashes = self._crashes, np.zeros(self.num_envs, np.int32)
        return StepResult(reward, done, cut, final_obs, ended, ret, length, crashes, new)

    def _reset_after_episode(self, i):
        try:
            o, info = self.envs[i].reset()
            if "episode" in info:
                self._reset_episode[i] = info["episode"]
            return o, "episode" in info
        except Exception as e:
            self._crashed(i, "reset", e)
            return self._remake(i), True

    def _crashed(self, i, where, e):
        """Counts one exception of env i, says so the first time, and gives up after
        MAX_CRASHES_IN_A_ROW of them with no successful step between."""
        self._crashes[i] += 1
        self.total_crashes += 1
        self._in_a_row += 1
        if i not in self._reported:
            self._reported.add(i)
            self._log("env %d (%s) crashed in %s: %s; it is made anew with a new seed and the episode counts "
                      "as ended (this env's further crashes are counted, not logged)"
                      % (i, self._level_name, where, envs.first_line(e)))
        if self._in_a_row >= MAX_CRASHES_IN_A_ROW:
            raise EnvCrashLoop("%d env crashes in a row with no successful step between (%s; the last in %s: %s); "
                               "giving up: fix the env" % (self._in_a_row, self._level_name, where, envs.first_line(e)))

    def _remake(self, i):
        """Env i closed and made anew with a seed of its own; returns its first observation. The
        new env may crash too: that counts as another crash, and the next seed is tried."""
        while True:
            try:
                self.envs[i].close()
            except Exception:  # a crashed env may not close cleanly; it is dropped anyway
                pass
            self._remade[i] += 1
            seed = int(np.random.SeedSequence([self._seed, i, int(self._remade[i])]).generate_state(1)[0])
            try:
                self.envs[i] = envs.make_env(self._level_name, seed=None, **self._make_kwargs)
                return self.envs[i].reset(seed=seed)[0]
            except Exception as e:
                self._crashed(i, "make/reset", e)

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
        actions = np.asarray(actions, np.int32)
        bad = (actions < 0) | (actions >= self.num_actions)
        if bad.any():  # ale-py's vector env would never answer them: its recv() waits for ever
            raise ValueError("actions %s for envs %s are outside 0..%d of %s"
                             % (actions[bad][:4].tolist(), np.flatnonzero(bad)[:4].tolist(), self.num_actions - 1,
                                getattr(getattr(self.env, "spec", None), "id", "the env")))
        self.env.send(actions)

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
        return StepResult(reward, done, cut, final_obs, ended, ret, length, np.zeros(self.num_envs, np.int32),
                          game_over)

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
