"""A trained IMPALA policy as a TensorFlow SavedModel that needs none of this project's code
(--mode=export; sandbox/play_policy.py plays one with tensorflow, gymnasium and numpy alone).

What the SavedModel holds is everything between the env's observation and the env's action:
the agent's /255 of uint8 frames, the observation normaliser's statistics (--normalize_observations,
saved with the agent's variables), the policy head, the choice of the mode (argmax, a Gaussian's
mean) or a sample, and for continuous actions the clip to the action space's bounds that the env
batch applies (envs/batch.py). What it does not hold is what the env wrappers do -- for Atari the
grey/resize/frame skip/max-pool/no-ops of gymnasium's AtariPreprocessing and the 4-frame stack --
so a player applies those wrappers itself; policy.json names them (`env_wrappers`).

Signatures (also plain functions of the loaded object):

    feed-forward: policy(observation[B, ...], deterministic[]) -> {action[B, ...], value[B]}
    recurrent:    policy(observation, first[B], deterministic, lstm_hidden[B, H], lstm_cell[B, H])
                      -> {action, value, lstm_hidden, lstm_cell}
                  initial_state(batch_size[]) -> {lstm_hidden, lstm_cell}

`first` is True on an episode's first observation (the LSTM starts it from its initial state,
as in training). policy.onnx beside it is `policy` for ONNX runtimes (policy_export/onnx_file.py;
the returned state is called next_lstm_hidden, next_lstm_cell there); policy.json's `onnx` is null,
with the reason in `onnx_not_written`, where tf2onnx cannot convert the agent."""
import os
import time

import numpy as np
import tensorflow as tf

from envs import batch as env_batch
from impala import agent as agent_lib
from impala import learner as learner_lib
from policy_export import saved_policy
# shared with WALL-E's export (walle/export.py); tests and users reach them through this module too
from policy_export.saved_policy import POLICY_JSON, FORMAT, check_export_dir, describe, env_wrappers  # noqa: F401

STATE_NAMES = ("lstm_hidden", "lstm_cell")  # snt.LSTMState's fields, in its order


class ExportedPolicy(tf.Module):
    """The agent (its variables tracked, so saved) and the serving functions around it."""

    def __init__(self, agent, spec):
        super().__init__(name="exported_policy")
        self.agent = agent
        flat = tf.nest.flatten(agent.initial_state(1))
        self.recurrent = bool(flat)
        if self.recurrent and len(flat) != len(STATE_NAMES):
            raise ValueError("only LSTM agents (state: hidden, cell) can be exported; this one's state has %d "
                             "tensors" % len(flat))
        structure = agent.initial_state(1)
        # a plain function and numpy arrays: attributes the SavedModel does not track
        self._pack = lambda tensors: tf.nest.pack_sequence_as(structure, tensors)
        self._bounds = None if spec.discrete else (np.array(spec.action_low, np.float32),
                                                   np.array(spec.action_high, np.float32))
        obs = tf.TensorSpec((None,) + tuple(spec.obs_shape), tf.as_dtype(spec.obs_dtype), name="observation")
        det = tf.TensorSpec((), tf.bool, name="deterministic")
        if self.recurrent:
            states = [tf.TensorSpec((None,) + tuple(s.shape[1:]), s.dtype, name=n) for s, n in zip(flat, STATE_NAMES)]
            self.policy = tf.function(self._recurrent_step, input_signature=[
                obs, tf.TensorSpec((None,), tf.bool, name="first"), det] + states)
            self.initial_state = tf.function(self._initial_state,
                                             input_signature=[tf.TensorSpec((), tf.int32, name="batch_size")])
        else:
            self.policy = tf.function(self._step, input_signature=[obs, det])

    def _act(self, observation, first, deterministic, state):
        out, state = self.agent(observation, first, state)
        mode = self.agent.policy.mode(out.policy_logits)
        action = tf.where(deterministic, mode, tf.cast(out.action, mode.dtype))
        if self._bounds is not None:  # the env batch's clip: the Gaussian is unbounded
            action = tf.clip_by_value(action, *self._bounds)
        return {"action": action, "value": out.baseline}, state

    def _step(self, observation, deterministic):
        first = tf.zeros(tf.shape(observation)[:1], tf.bool)
        return self._act(observation, first, deterministic, ())[0]

    def _recurrent_step(self, observation, first, deterministic, lstm_hidden, lstm_cell):
        state = self._pack([lstm_hidden, lstm_cell])
        out, state = self._act(observation, first, deterministic, state)
        out.update(zip(STATE_NAMES, tf.nest.flatten(state)))
        return out

    def _initial_state(self, batch_size):
        return dict(zip(STATE_NAMES, tf.nest.flatten(self.agent.initial_state(batch_size))))


def save_policy(agent, spec, export_dir, info, onnx=True, log=print):
    """Writes the SavedModel, policy.onnx (if `onnx` and tf2onnx converts the agent) and policy.json
    into export_dir (replacing an earlier export there); returns (its size in bytes, policy.json's content)."""
    module = ExportedPolicy(agent, spec)
    states = tf.nest.flatten(agent.initial_state(1))
    info = dict(info, **saved_policy.signature_info(module, dict(zip(STATE_NAMES, states))))
    signatures = {"serving_default": module.policy}
    if module.recurrent:
        signatures["initial_state"] = module.initial_state
    return saved_policy.write_export(module, export_dir, info, signatures, onnx=onnx, log=log)


def export_run(flags, source, export_dir, log=print):
    """--mode=export: the newest readable checkpoint of `source` (a run folder or a checkpoint prefix),
    built as --mode=test builds it, as a SavedModel in export_dir. Returns policy.json's content."""
    check_export_dir(export_dir)  # before the work, not after it
    frame_size = agent_lib.frame_size_of(flags)
    agent, spec, prefix = learner_lib.restored_agent(flags, source)
    log("exporting %s (%s on %s) to %s" % (prefix, flags.agent_name, flags.level_name, export_dir))
    start = time.time()
    from impala import evaluator  # for the policy --mode=test plays
    info = describe(spec, flags.level_name, flags.agent_name, frame_size, {
        "checkpoint": os.path.abspath(prefix), "env_module": list(flags.env_module),
        "normalize_observations": bool(flags.normalize_observations),
        "test_mode_policy": evaluator.policy_kind(flags.eval_policy, flags.level_name),
        "test_mode_seed": flags.seed + evaluator.TEST_SEED_OFFSET, "test_mode_reset_seeds": "once",
        "test_mode_env_backend": env_batch.resolve_backend(flags.env_backend, flags.level_name)})
    size, info = save_policy(agent, spec, export_dir, info, onnx=flags.export_onnx, log=log)
    log("wrote %s (%.1f MB, %.1f s%s)" % (export_dir, size / 1e6, time.time() - start,
                                          ", with %s" % info["onnx"] if info["onnx"] else ""))
    return info
