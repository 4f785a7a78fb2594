"""Environments: `factory` turns a gymnasium id into a wrapped env; `batch` steps an actor's envs as one
batch (ale-py's native vector env or the factory's Python envs). The factory's API is re-exported here,
so `envs.make_env(...)` is the one way callers make an env."""
from envs.factory import (FRAME_SKIP, FRAME_STACK, NOOP_MAX, FRAME_SIZE, EnvSpec, FrameStack,  # noqa: F401
                          UnknownEnvError, env_spec, import_env_modules, is_atari, make_env, merge_frames,
                          needs_fire, width_height)
