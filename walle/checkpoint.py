"""WALL-E's run checkpoints: everything a resumed PPO run needs to go on as if it had not stopped.

<logdir>/checkpoints/ holds, for iteration N:
  ckpt-N.index / .data-*   TensorFlow: the policy and value nets and their Adam optimizers
                           (moments and step counts)
  state-N.pkl              numpy: the observation normaliser, the reward normaliser (--norm_reward),
                           beta and the learning-rate multiplier (--loss kl), the previous batch the
                           value fit replays, the minibatch RNG, the policy version, and the run's
                           progress (iteration, env steps, elapsed seconds, the last 10 returns)
and <logdir>/flags.json the run's flags (walle/config.py), which --mode=train_w_load starts from.

The state file is written first and the TensorFlow checkpoint last, each to a temporary name
renamed into place, so a checkpoint that TensorFlow lists always has its state file. The newest
KEEP are kept. What a resume does not bring back: the samplers' envs (their episodes start again,
with seeds moved on by the iteration so the games are new ones) and the console's rates.
"""
import dataclasses
import os
import pickle
import re

import tensorflow as tf

from walle.config import CHECKPOINT_DIR as DIRNAME, run_folder

KEEP = 3


class CheckpointError(RuntimeError):
    """No readable checkpoint where --load_model_url points."""


@dataclasses.dataclass
class Progress:
    """Where a run stands: counted over the whole run, across resumes."""
    iteration: int = 0  # iterations done
    steps: int = 0  # env steps collected in them
    elapsed_s: float = 0.0  # training seconds before this process
    recent: list = dataclasses.field(default_factory=list)  # the last 10 episode returns


class Checkpointer:
    """Saves and restores one agent (walle.agent.PPO) with the run's Progress."""

    def __init__(self, agent, logdir):
        self.agent, self.dir = agent, os.path.join(logdir, DIRNAME)
        objects = dict(policy=agent.policy, value=agent.value)
        objects.update({name: getattr(agent, name) for name in ("policy_opt", "value_opt", "joint_opt")
                        if hasattr(agent, name)})
        self.tf_checkpoint = tf.train.Checkpoint(**objects)
        self.manager = tf.train.CheckpointManager(self.tf_checkpoint, self.dir, max_to_keep=KEEP,
                                                  checkpoint_name="ckpt")

    def save(self, progress):
        """Writes iteration progress.iteration's checkpoint; returns its prefix."""
        os.makedirs(self.dir, exist_ok=True)
        state = dict(agent=self.agent.state(), progress=dataclasses.asdict(progress))
        path = os.path.join(self.dir, "state-%d.pkl" % progress.iteration)
        with open(path + ".tmp", "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(path + ".tmp", path)
        prefix = self.manager.save(checkpoint_number=progress.iteration)
        kept = {_number(p) for p in self.manager.checkpoints}
        for name in os.listdir(self.dir):
            m = re.fullmatch(r"state-(\d+)\.pkl", name)
            if m and int(m.group(1)) not in kept:
                os.remove(os.path.join(self.dir, name))
        return prefix

    def restore(self, url, full=True):
        """Loads the checkpoint --load_model_url names (a prefix), or the newest of a run folder;
        returns (its prefix, its Progress). full=False: the nets only are needed (--mode=test)."""
        prefix = url if not os.path.isdir(url) else tf.train.latest_checkpoint(os.path.join(run_folder(url), DIRNAME))
        if not prefix or not os.path.exists(prefix + ".index"):
            raise CheckpointError(f"--load_model_url={url}: no checkpoint there (expected <run>/{DIRNAME}/ckpt-N)")
        state_path = os.path.join(os.path.dirname(prefix), "state-%d.pkl" % _number(prefix))
        try:
            with open(state_path, "rb") as f:
                state = pickle.load(f)
            status = self.tf_checkpoint.read(prefix)
            status.assert_existing_objects_matched() if full else status.expect_partial()
        except (OSError, pickle.UnpicklingError, EOFError, tf.errors.OpError, AssertionError, ValueError) as e:
            raise CheckpointError(f"{prefix}: cannot restore it ({type(e).__name__}: {str(e)[:300]})")
        self.agent.set_state(state["agent"])
        return prefix, Progress(**state["progress"])


def _number(prefix):
    return int(prefix.rsplit("-", 1)[1])
