"""Environments: one factory from a gymnasium id to a correctly wrapped env.

Two kinds of ids are supported:

* Atari (`PongNoFrameskip-v4`, `ALE/Pong-v5`, ...), through ale-py. The
  pipeline of Mnih et al. 2015 / Machado et al. 2018, as IMPALA used it:

    ALE env with frameskip=1 (v5: sticky actions, repeat_action_probability=0.25)
    -> AtariPreprocessing  1-30 no-ops on reset, each action repeated 4 frames,
                           max-pool of the last 2 frames, 84x84 grayscale
    -> GameStats           info["episode"] = {"r", "l"} when the game ends
    -> EpisodicLife        training only: a lost life ends the episode and
                           the game goes on at the next reset()
    -> FireReset           presses FIRE after reset in games that wait for it
                           (and so after each lost life in training); in
                           evaluation FireAfterLifeLoss presses it there
    -> FrameStack          the last 4 frames, uint8 HWC [84, 84, 4]

  Rewards are NOT clipped here: the loss clips them.
* Every other id gymnasium knows (classic control, MuJoCo, and the ids a user's module registers,
  see experiment.py's --env_module), or an entry point `pkg.module:ClassName`, made plainly
  (gymnasium's own wrappers from its registration, e.g. the time limit) plus GameStats. Its
  spaces pick the kind: a 1-D Box observation is a vector (cast to float32, for the MLP agents),
  a 3-D uint8 Box [H, W, C] an image (for the conv agents). Other observation spaces (Dict,
  Tuple, Discrete, Text, ...) and action spaces other than Discrete and 1-D Box are refused with
  UnknownEnvError when the env is made (experiment.py's checks make one through env_spec before
  anything starts).

For every kind, `info["episode"] = {"r": float, "l": int}` appears on the step
where a real episode ends (for Atari the whole game, all lives, even with
episodic life on); "l" counts agent steps. One rare corner: a game that ends
inside FireReset's own FIRE steps (only ALE's 108,000-frame limit can do that)
reports its stats in the info returned by reset().
"""
import difflib
import fnmatch
import functools
import importlib
from typing import NamedTuple

import ale_py
import cv2
import gymnasium as gym
import numpy as np

gym.register_envs(ale_py)

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
ATARI_PATTERNS = ("*NoFrameskip-v4", "ALE/*-v5")
NOOP_MAX = 30
FRAME_SKIP = 4
FRAME_SIZE = 84
FRAME_STACK = 4
V5_REPEAT_ACTION_PROBABILITY = 0.25


class UnknownEnvError(ValueError):
    """An env id that gymnasium does not know, or of a kind we do not support."""


class EnvSpec(NamedTuple):
    obs_shape: tuple
    obs_dtype: np.dtype
    num_actions: int | None  # Discrete action spaces
    action_dim: int | None  # continuous (1-D Box) action spaces
    discrete: bool
    is_atari: bool
    # A Box action space's bounds per dimension (None for Discrete): the env batch clips actions to
    # them and --action_bound_cost keeps the Gaussian's mean inside them.
    action_low: tuple | None = None
    action_high: tuple | None = None


# ---------------------------------------------------------------------------
# Which ids are supported (decided from the registry alone: no env is made).

# Ids gymnasium keeps only to say that they need mujoco-py, which it no longer supports.
STUB_ENTRY_POINTS = ("_raise_mujoco_py_error",)


def first_line(e):
    """An exception as one line for an error message: its type and the first line of its text."""
    return "%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[0][:200])


def import_env_modules(names):
    """Imports each module of --env_module, whose import registers its envs with gymnasium.
    Raises ImportError with one line naming the module and the import's own error."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # any error of the user's module, not only ImportError
            raise ImportError("importing %s failed (%s); the module must be importable in every process "
                              "that makes envs (installed, or its folder on PYTHONPATH)" % (name, first_line(e)))


def _resolve(env_id):
    """gymnasium's EnvSpec of an id, or None when it names no env. Besides registered ids two forms
    name an env through its module: gymnasium's own `module:EnvId-v0` (importing the module
    registers EnvId-v0) and an entry point `pkg.module:ClassName`, which gymnasium.make does not
    take by itself: it is registered here under that whole id the first time it is seen."""
    spec = gym.registry.get(env_id)
    if spec is not None or ":" not in env_id:
        return spec
    module_name, name = env_id.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise UnknownEnvError("environment id %r: importing module %r failed (%s); it must be importable "
                              "(installed, or its folder on PYTHONPATH)" % (env_id, module_name, first_line(e)))
    spec = gym.registry.get(name)
    if spec is None and callable(getattr(module, name, None)):
        gym.register(id=env_id, entry_point=env_id)
        spec = gym.registry.get(env_id)
    return spec


def _kind_of(env_id):
    """'atari', 'gym' (any other env gymnasium can make), or None for an unknown/refused id."""
    spec = _resolve(env_id)
    entry = getattr(spec, "entry_point", None)
    if entry is None or getattr(entry, "__name__", None) in STUB_ENTRY_POINTS:
        return None
    if entry == ATARI_ENTRY_POINT:
        ok = any(fnmatch.fnmatchcase(env_id, p) for p in ATARI_PATTERNS)
        return "atari" if ok else None
    return "gym"


def _kind(env_id):
    """'atari' or 'gym'; raises UnknownEnvError naming the id otherwise."""
    if not isinstance(env_id, str):
        raise UnknownEnvError(f"env id must be a string, got {env_id!r}")
    kind = _kind_of(env_id)
    if kind is not None:
        return kind
    entry = getattr(gym.registry.get(env_id), "entry_point", None)
    if entry == ATARI_ENTRY_POINT:
        reason = "is an Atari id of another family (v0, or v4 with its own frame skip)"
    elif env_id in gym.registry:
        reason = "is a gymnasium id that needs mujoco-py, which gymnasium no longer supports (use its -v5 id)"
    elif ":" in env_id:
        reason = "names neither an id its module registers nor a class or function of that module"
    else:
        reason = "is not a registered gymnasium id"
    supported = [i for i in gym.registry if _kind_of(i) is not None]
    close = difflib.get_close_matches(env_id, supported, n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownEnvError(
        f"unknown environment id {env_id!r}: it {reason}. Supported are Atari "
        f"ids '<Game>NoFrameskip-v4' or 'ALE/<Game>-v5' (e.g. PongNoFrameskip-v4, "
        f"ALE/Breakout-v5), any other id gymnasium knows (e.g. CartPole-v1, HalfCheetah-v5, or one "
        f"your module registers: --env_module=PKG.MODULE) and entry points 'pkg.module:ClassName'.{hint}")


def atari_ids(pattern="*NoFrameskip-v4"):
    """The registered Atari ids of one family of ATARI_PATTERNS that make_env takes, sorted."""
    return sorted(i for i in gym.registry if fnmatch.fnmatchcase(i, pattern) and _kind_of(i) == "atari")


def is_atari(env_id: str) -> bool:
    """True for a supported Atari id; raises UnknownEnvError for an unsupported id."""
    return _kind(env_id) == "atari"


# ---------------------------------------------------------------------------
# Wrappers.


class GameStats(gym.Wrapper):
    """Adds info["episode"] = {"r": return, "l": length} on the step an episode ends.

    In the Atari stack it sits below EpisodicLife, so it sees the end of the
    game, not each lost life.
    """

    def __init__(self, env):
        super().__init__(env)
        self._return = 0.0
        self._length = 0

    def reset(self, **kwargs):
        self._return = 0.0
        self._length = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        if terminated or truncated:
            info = dict(info, episode={"r": self._return, "l": self._length})
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated=True), but not the game.

    reset() after a lost life leaves the emulator alone: it hands back the last
    observation and play goes on with the lives left. Only when the game is
    really over (or a seed is given) does reset() reset the game.
    """

    def __init__(self, env):
        super().__init__(env)
        self._lives = 0
        self._game_over = True
        self._last_obs = None

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        self._last_obs = obs
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self._game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
            self._game_over = False
        else:
            obs, info = self._last_obs, {}
        self._lives = self.env.unwrapped.ale.lives()
        return obs, dict(info, lives=self._lives)


class FireReset(gym.Wrapper):
    """After reset, presses FIRE then UP, for games that stand still until FIRE."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        finished_game = {}
        for action in (1, 2):  # FIRE, UP (as OpenAI baselines does)
            obs, _, terminated, truncated, step_info = self.env.step(action)
            if "episode" in step_info:
                finished_game["episode"] = step_info["episode"]
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, dict(info, **finished_game)


class FireAfterLifeLoss(gym.Wrapper):
    """Evaluation's FIRE after a lost life, which training gets from EpisodicLife's reset and FireReset:
    on the step that loses a life (not the last) it presses FIRE then UP, so a game that waits for
    FIRE after each life (Breakout) goes on as in training, and a policy that seldom presses FIRE
    cannot stand still until the frame limit. Their rewards count in the step's."""

    def __init__(self, env):
        super().__init__(env)
        self._lives = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lost_life = 0 < self.env.unwrapped.ale.lives() < self._lives
        for fire in (1, 2):  # FIRE, UP (as FireReset)
            if not lost_life or terminated or truncated:
                break
            obs, more, terminated, truncated, info = self.env.step(fire)  # info: the game's stats if it ended
            reward += more
        self._lives = self.env.unwrapped.ale.lives()
        return obs, reward, terminated, truncated, info


def needs_fire(env):
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


class FrameStack(gym.Wrapper):
    """Stacks the last `k` [H, W] uint8 frames into one [H, W, k] observation."""

    def __init__(self, env, k):
        super().__init__(env)
        height, width = env.observation_space.shape
        self._frames = np.zeros((height, width, k), dtype=np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, self._frames.shape, np.uint8)

    def reset(self, **kwargs):
        frame, info = self.env.reset(**kwargs)
        self._frames[...] = frame[:, :, None]  # the first frame fills the stack
        return self._frames.copy(), info

    def step(self, action):
        frame, reward, terminated, truncated, info = self.env.step(action)
        self._frames[:, :, :-1] = self._frames[:, :, 1:]
        self._frames[:, :, -1] = frame
        return self._frames.copy(), reward, terminated, truncated, info


def merge_frames(frames, out):
    """out[..., H, W, C] = the C [..., H, W] uint8 `frames` side by side in the last axis, all
    leading axes in one OpenCV merge (each frame seen as one [N * H, W] image): 15x as fast as
    numpy's channel-by-channel strided copy (16 stacks of 84x84x4: 17 us against 256 us;
    bench/results/<machine>/actor_costs.md)."""
    W, C = out.shape[-2:]
    planes = [f.reshape(-1, W) for f in frames]
    if not out.flags.c_contiguous:  # OpenCV writes only into contiguous arrays
        out[...] = cv2.merge(planes).reshape(out.shape)
        return
    flat = out.reshape(-1, W, C)  # a view of out
    merged = cv2.merge(planes, dst=flat)
    if merged.ctypes.data != flat.ctypes.data:  # out is not uint8: OpenCV made a new array
        out[...] = merged.reshape(out.shape)


# ---------------------------------------------------------------------------
# The factory.


def _make_atari(env_id, training, render_mode=None, frame_size=FRAME_SIZE, max_episode_frames=None):
    kwargs = {"frameskip": 1, "render_mode": render_mode}  # AtariPreprocessing does the frame skip
    if max_episode_frames is not None:
        kwargs["max_num_frames_per_episode"] = max_episode_frames
    if env_id.startswith("ALE/"):
        kwargs["repeat_action_probability"] = V5_REPEAT_ACTION_PROBABILITY
    env = gym.make(env_id, **kwargs)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=frame_size,
        terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    env = GameStats(env)
    if training:
        env = EpisodicLife(env)
    if needs_fire(env):
        env = FireReset(env) if training else FireReset(FireAfterLifeLoss(env))
    return FrameStack(env, FRAME_STACK)


class Float32Observation(gym.ObservationWrapper):
    """Casts vector observations (MuJoCo's are float64) to float32."""

    def __init__(self, env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)

    def observation(self, observation):
        return np.asarray(observation, dtype=np.float32)


class ZeroBasedActions(gym.ActionWrapper):
    """Discrete(n, start=s) as Discrete(n): the agents' actions are 0..n-1."""

    def __init__(self, env):
        super().__init__(env)
        self._start = int(env.action_space.start)
        self.action_space = gym.spaces.Discrete(int(env.action_space.n))

    def action(self, action):
        return self._start + int(action)


def _is_vector(space):
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 1


def _is_image(space):
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def _make_plain(env_id, render_mode=None):
    """Any non-Atari env as its registration makes it, plus the episode statistics; vector
    observations as float32 (MuJoCo's are float64). Raises UnknownEnvError for spaces the agents
    cannot take."""
    # render_mode only when asked for: a user's env need not take the argument
    env = gym.make(_resolve(env_id), **({} if render_mode is None else {"render_mode": render_mode}))
    try:
        _check_spaces(env_id, env.observation_space, env.action_space)
    except UnknownEnvError:
        env.close()
        raise
    if _is_vector(env.observation_space):
        env = Float32Observation(env)
    if isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.start != 0:
        env = ZeroBasedActions(env)
    return GameStats(env)


def make_env(env_id: str, seed: int | None = None, training: bool = True,
             render_mode: str | None = None, frame_size=FRAME_SIZE, max_episode_frames=None) -> gym.Env:
    """Returns the wrapped env for `env_id`.

    training: Atari only: a lost life ends the episode (the game goes on).
      Use training=False for evaluation, where the actors step these envs (a policy trained
      through envs.batch's native backend is evaluated through it: impala.evaluator.EvalEnv).
    seed: when given, the env is reset once with it and its action space is
      seeded, so later plain reset() calls follow a reproducible sequence.
    render_mode: gymnasium's, e.g. "rgb_array" (env.render() returns the frame).
    frame_size: Atari only: frames are resized to this (an int, or (width, height));
      84 as in DQN and IMPALA, 42 as RLlib's and PARL's fast Pong settings use.
    max_episode_frames: Atari only: the time limit in emulator frames (ALE's default, 108,000,
      when None); the episode is then truncated.
    """
    if _kind(env_id) == "atari":
        env = _make_atari(env_id, training, render_mode, _gym_frame_size(frame_size), max_episode_frames)
    else:
        env = _make_plain(env_id, render_mode)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def width_height(frame_size=FRAME_SIZE):
    """(width, height) in pixels of a frame size given as an int (square) or (width, height)."""
    if isinstance(frame_size, (tuple, list)):
        width, height = (int(v) for v in frame_size)
        return width, height
    return int(frame_size), int(frame_size)


def _gym_frame_size(frame_size):
    """An int for square frames (gymnasium's own form), else a (width, height) tuple."""
    width, height = width_height(frame_size)
    return width if width == height else (width, height)


@functools.lru_cache(maxsize=None)
def _env_spec(env_id, frame_size):
    _kind(env_id)  # an unknown id says so, before anything is made
    try:
        env = make_env(env_id, training=False, frame_size=frame_size)
    except UnknownEnvError:
        raise
    except Exception as e:  # the user's env may raise anything: one line, nothing started
        raise UnknownEnvError("making environment %r failed (%s)" % (env_id, first_line(e))) from None
    return _spec_of(env, env_id)


def env_spec(env_id: str, frame_size=FRAME_SIZE) -> EnvSpec:
    """Observation and action facts of `env_id` (one env is made once, then cached)."""
    return _env_spec(env_id, _gym_frame_size(frame_size))


def _space_text(space):
    text = " ".join(str(space).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _check_spaces(env_id, obs_space, act_space):
    """Raises UnknownEnvError for spaces the agents cannot take, naming the space and what would do."""
    if not (_is_vector(obs_space) or _is_image(obs_space)):
        raise UnknownEnvError(
            f"environment {env_id!r} has observation space {_space_text(obs_space)}; supported are a 1-D Box "
            f"(vectors, for MLPAgent and MLPLSTMAgent) and a 3-D uint8 Box [height, width, channels] (images, "
            f"for the conv agents): flatten or one-hot it with an observation wrapper in the env's module")
    if not (isinstance(act_space, gym.spaces.Discrete) or _is_vector(act_space)):
        raise UnknownEnvError(
            f"environment {env_id!r} has action space {_space_text(act_space)}; supported are Discrete "
            f"and 1-D Box action spaces")


def _spec_of(env, env_id):
    try:
        obs_space, act_space = env.observation_space, env.action_space
        discrete = isinstance(act_space, gym.spaces.Discrete)
        return EnvSpec(
            obs_shape=tuple(obs_space.shape),
            obs_dtype=np.dtype(obs_space.dtype),
            num_actions=int(act_space.n) if discrete else None,
            action_dim=None if discrete else int(act_space.shape[0]),
            discrete=discrete,
            is_atari=is_atari(env_id),
            action_low=None if discrete else tuple(float(x) for x in act_space.low),
            action_high=None if discrete else tuple(float(x) for x in act_space.high))
    finally:
        env.close()
