"""--mode=export for WALL-E's PPO: a run's policy as a TensorFlow SavedModel (and policy.onnx) in
the folder IMPALA's --mode=export writes (policy_export/), which sandbox/play_policy.py plays.

The SavedModel acts as the samplers act (walle/samplers.py): the observation normalised with the
run's statistics and clipped to +-obs_clip, the Gaussian's mean (deterministic) or a sample of
it, clipped to the action space's bounds. Its serving signature:

    policy(observation[B, obs_dim] float32, deterministic[] bool) -> {action[B, act_dim], value[B]}

`value` is the value net's estimate, on the scale PPO trained it (rewards * (1 - gamma), or the
--norm_reward scale)."""
import os
import time

import numpy as np
import tensorflow as tf

from policy_export import saved_policy
from walle import checkpoint as checkpoint_lib
from walle import training
from walle.agent import PPO
from walle.config import run_folder

AGENT_NAME = "WALL-E PPO"


class ExportedPPO(tf.Module):
    """The policy and value nets (their variables tracked, so saved), the normaliser's statistics
    as the checkpoint left them, and the serving function."""

    def __init__(self, agent, spec):
        super().__init__(name="exported_ppo")
        self.policy_net, self.value_net = agent.policy, agent.value
        params = agent.params()
        self.obs_mean = tf.Variable(params["obs_mean"], trainable=False, name="obs_mean")
        self.obs_std = tf.Variable(params["obs_std"], trainable=False, name="obs_std")
        self._clip = float(params["obs_clip"])
        self._bounds = (np.array(spec.action_low, np.float32), np.array(spec.action_high, np.float32))
        self.policy = tf.function(self._step, input_signature=[
            tf.TensorSpec((None, spec.obs_shape[0]), tf.float32, name="observation"),
            tf.TensorSpec((), tf.bool, name="deterministic")])

    def _step(self, observation, deterministic):
        x = tf.clip_by_value((observation - self.obs_mean) / self.obs_std, -self._clip, self._clip)
        mean, logvar = self.policy_net(x)
        sample = mean + tf.exp(0.5 * logvar) * tf.random.normal(tf.shape(mean))
        action = tf.clip_by_value(tf.where(deterministic, mean, sample), *self._bounds)
        return {"action": action, "value": self.value_net(x)}


def save_policy(agent, spec, export_dir, info, onnx=True, log=print):
    """Writes the SavedModel, policy.onnx (if `onnx` and tf2onnx converts it) and policy.json (`info`
    and the signature's part) into export_dir; returns (its size in bytes, policy.json's content)."""
    module = ExportedPPO(agent, spec)
    info = dict(info, **saved_policy.signature_info(module, {}))
    return saved_policy.write_export(module, export_dir, info, {"serving_default": module.policy}, onnx=onnx,
                                     log=log)


def _info(args, spec, prefix):
    """policy.json's content but for the signature's part."""
    return saved_policy.describe(spec, args.env_name, AGENT_NAME, None, {  # no frame size: vector observations
        "checkpoint": os.path.abspath(prefix), "env_module": [], "normalize_observations": True,
        "obs_clip": float(args.obs_clip), "test_mode_policy": "greedy",
        # --mode=test (training.write_eval) resets episode i with test_mode_seed + i
        "test_mode_seed": args.seed + training.EVAL_SEED_OFFSET, "test_mode_reset_seeds": "per_episode"})


def export_run(args, spec, log=print):
    """--mode=export: the checkpoint --load_model_url names (or its run's newest) as a SavedModel in
    --export_dir (default <run>/exported); returns policy.json's content."""
    export_dir = args.export_dir or os.path.join(run_folder(args.load_model_url), "exported")
    saved_policy.check_export_dir(export_dir)  # before the work, not after it
    agent = PPO(spec.obs_shape[0], spec.action_dim, args)
    prefix, _ = checkpoint_lib.Checkpointer(agent, run_folder(args.load_model_url)).restore(
        args.load_model_url, full=False)
    log("exporting %s (%s on %s) to %s" % (prefix, AGENT_NAME, args.env_name, export_dir))
    start = time.time()
    size, info = save_policy(agent, spec, export_dir, _info(args, spec, prefix), onnx=args.export_onnx, log=log)
    log("wrote %s (%.1f MB, %.1f s%s)" % (export_dir, size / 1e6, time.time() - start,
                                          ", with %s" % info["onnx"] if info["onnx"] else ""))
    return info
