"""A memory task, to check that a recurrent setup really carries its state: a cue shown once must be
recalled after a delay. Trained with

    .venv/bin/python local_cluster.py --num_actors=1 -- --flagfile=configs/memory.flags

(--env_module=sandbox.memory_env --level_name=sandbox/CueMemory-v0 --agent_name=MLPLSTMAgent). An
LSTM agent that carries its state from step to step, and from one unroll to the next, scores about
1.0; a feed-forward agent (MLPAgent), or an LSTM whose state is lost on the way, cannot beat chance,
1/K. Measured: docs/results.md#time-to-a-score; tests/test_memory_task.py trains both.

sandbox/CueMemory-v0: every episode lasts delay + 2 steps.

- step 0: the cue, one of K classes drawn at random, shown as a one-hot with the "cue" bit on;
- steps 1 .. delay: blank, the cue gone;
- step delay + 1: the "decide" bit on; the action taken there (Discrete(K)) pays 1 if it names the
  cue, else 0, and the episode ends (a termination).

Actions before the decision change nothing. Observations: a 1-D float32 Box of K + 3 values, the
cue's one-hot, the cue bit, the decide bit and the elapsed fraction of the episode (t / (delay + 1),
so a policy may time itself). Nothing after step 0 depends on the cue, so only a memory of step 0
can do better than chance. Other delays and cue counts: gymnasium.make("sandbox/CueMemory-v0",
delay=20, num_cues=4) in Python; the recipe uses the defaults.
"""
import gymnasium as gym
import numpy as np

ENV_ID = "sandbox/CueMemory-v0"
DELAY = 10
NUM_CUES = 2


class CueMemory(gym.Env):
    """Recall at the last step the cue shown at the first (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, delay=DELAY, num_cues=NUM_CUES):
        if int(delay) < 0 or int(num_cues) < 2:
            raise ValueError("CueMemory: delay=%r must be >= 0 and num_cues=%r >= 2" % (delay, num_cues))
        self.delay, self.num_cues = int(delay), int(num_cues)
        self.episode_length = self.delay + 2
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.num_cues + 3,), np.float32)
        self.action_space = gym.spaces.Discrete(self.num_cues)
        self._cue, self._t = None, 0

    def _observation(self):
        obs = np.zeros(self.num_cues + 3, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
            obs[self.num_cues] = 1.0
        obs[self.num_cues + 1] = float(self._t == self.episode_length - 1)
        obs[self.num_cues + 2] = self._t / (self.episode_length - 1)
        return obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self._cue, self._t = int(self.np_random.integers(self.num_cues)), 0
        return self._observation(), {}

    def step(self, action):
        if self._cue is None:
            raise RuntimeError("CueMemory: step() needs reset() first, and again after the episode ends")
        if self._t == self.episode_length - 1:
            reward = float(int(action) == self._cue)
            self._cue = None  # a step past the end raises rather than play on
            # The final observation is the decision's own, cue-free like it; no action follows it.
            return self._observation(), reward, True, False, {}
        self._t += 1
        return self._observation(), 0.0, False, False, {}


gym.register(id=ENV_ID, entry_point=CueMemory)
