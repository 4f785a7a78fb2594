"""An example of bringing your own environment: a module that registers a gymnasium env, trained with

    .venv/bin/python local_cluster.py --num_actors=1 -- --flagfile=configs/reach_target.flags

(that is --env_module=sandbox.custom_env --level_name=ReachTarget-v0 --agent_name=MLPAgent and fast
learning settings; the mean return passes 0.5 within about 30K frames, seconds on 2 cores).

`--env_module` makes every process that makes envs (learner, actors, evaluator, --mode=test) import
this module before it looks up `--level_name`, so the id registered below is known everywhere. Any
module works the same way if it is importable on every host (installed, or its folder on
PYTHONPATH); `sandbox.custom_env` is, from the repository root.

ReachTarget-v0: a walker and a target on a SIZE x SIZE grid, both placed at random. Each step the
agent moves the walker one cell (up, down, left, right; the walls stop it) and pays STEP_COST;
reaching the target pays 1 and ends the episode; after MAX_STEPS the episode is cut. A good policy
walks straight to the target (a return of about 0.85); a random one mostly runs out of time (about -1.0).
Observations: a 1-D float32 Box (the walker's position and the offset to the target, scaled to
[-1, 1]), so the MLP agents take it; actions: Discrete(4).
"""
import gymnasium as gym
import numpy as np

SIZE = 7
MAX_STEPS = 30
STEP_COST = 0.05
MOVES = np.array([[0, -1], [0, 1], [-1, 0], [1, 0]])  # up, down, left, right


class ReachTarget(gym.Env):
    """Walk to the target on a small grid (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, size=SIZE):
        self.size = size
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(len(MOVES))
        self._walker = self._target = None

    def _observation(self):
        scale = self.size - 1
        return np.concatenate([self._walker / scale * 2 - 1, (self._target - self._walker) / scale]).astype(np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size * self.size, size=2, replace=False)  # never on the target
        self._walker, self._target = np.divmod(cells[0], self.size), np.divmod(cells[1], self.size)
        self._walker, self._target = np.array(self._walker), np.array(self._target)
        return self._observation(), {}

    def step(self, action):
        self._walker = np.clip(self._walker + MOVES[int(action)], 0, self.size - 1)
        reached = bool((self._walker == self._target).all())
        return self._observation(), 1.0 if reached else -STEP_COST, reached, False, {}


# The time limit is gymnasium's own wrapper (truncation), which the learner bootstraps from.
gym.register(id="ReachTarget-v0", entry_point=ReachTarget, max_episode_steps=MAX_STEPS)
