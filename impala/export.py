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
as in training)."""
import json
import os
import shutil
import time

import numpy as np
import tensorflow as tf

import envs
from envs import batch as env_batch
from impala import agent as agent_lib
from impala import learner as learner_lib

POLICY_JSON = "policy.json"
STATE_NAMES = ("lstm_hidden", "lstm_cell")  # snt.LSTMState's fields, in its order
FORMAT = 1


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


def env_wrappers(level_name, frame_size):
    """What a player must do to the env gymnasium.make gives, in order, so that the policy sees what
    --mode=test's Python backend gives the agent (envs/factory.py)."""
    if not envs.is_atari(level_name):
        return [{"wrapper": "gymnasium.make", "kwargs": {}},
                {"wrapper": "cast observations to float32", "kwargs": {}}]
    width, height = envs.width_height(frame_size)
    make = {"frameskip": 1}
    if level_name.startswith("ALE/"):
        make["repeat_action_probability"] = envs.factory.V5_REPEAT_ACTION_PROBABILITY
    return [{"wrapper": "gymnasium.make", "kwargs": make},
            {"wrapper": "gymnasium.wrappers.AtariPreprocessing",
             "kwargs": {"noop_max": envs.NOOP_MAX, "frame_skip": envs.FRAME_SKIP,
                        "screen_size": width if width == height else [width, height],
                        "terminal_on_life_loss": False, "grayscale_obs": True, "scale_obs": False}},
            {"wrapper": "fire after reset and after a lost life (FIRE then UP) in games whose action 1 is FIRE",
             "kwargs": {}},
            {"wrapper": "gymnasium.wrappers.FrameStackObservation",
             "kwargs": {"stack_size": envs.FRAME_STACK, "padding_type": "reset"}},
            {"wrapper": "move the stack's axis last: [stack, H, W] -> [H, W, stack] uint8", "kwargs": {}}]


def describe(spec, level_name, agent_name, frame_size, extra):
    """policy.json's content but for the state's part, which save_policy adds from the agent."""
    if spec.discrete:
        action = {"type": "Discrete", "n": spec.num_actions, "dtype": "int32"}
    else:
        action = {"type": "Box", "shape": [spec.action_dim], "low": list(spec.action_low),
                  "high": list(spec.action_high), "dtype": "float32"}
    info = {"format": FORMAT, "env_id": level_name, "agent_name": agent_name,
            "observation": {"shape": list(spec.obs_shape), "dtype": np.dtype(spec.obs_dtype).name},
            "action_space": action, "env_wrappers": env_wrappers(level_name, frame_size)}
    info.update(extra)
    return info


def check_export_dir(export_dir):
    """Whether export_dir holds an earlier export (to replace); raises FileExistsError naming it when it
    holds other files, which an export must not delete."""
    if not (os.path.isdir(export_dir) and os.listdir(export_dir)):
        return False
    if not os.path.exists(os.path.join(export_dir, "saved_model.pb")):
        raise FileExistsError("--export_dir=%s holds files that are not an exported policy; give an empty "
                              "or new folder" % export_dir)
    return True


def save_policy(agent, spec, export_dir, info):
    """Writes the SavedModel and policy.json into export_dir (replacing an earlier export there);
    returns (its size in bytes, policy.json's content)."""
    module = ExportedPolicy(agent, spec)
    states = list(STATE_NAMES) if module.recurrent else []
    info = dict(info, recurrent=module.recurrent, state=[
        {"name": n, "shape": list(s.shape[1:]), "dtype": s.dtype.name}
        for n, s in zip(states, tf.nest.flatten(agent.initial_state(1)))],
        inputs=["observation"] + (["first"] if states else []) + ["deterministic"] + states,
        outputs=["action", "value"] + states)
    signatures = {"serving_default": module.policy}
    if module.recurrent:
        signatures["initial_state"] = module.initial_state
    if check_export_dir(export_dir):
        shutil.rmtree(export_dir)  # an earlier export: its variables must not outlive it
    tf.saved_model.save(module, export_dir, signatures=signatures)
    with open(os.path.join(export_dir, POLICY_JSON), "w") as f:
        json.dump(info, f, indent=2)
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(export_dir) for n in names), info


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
        "test_mode_seed": flags.seed + evaluator.TEST_SEED_OFFSET,
        "test_mode_env_backend": env_batch.resolve_backend(flags.env_backend, flags.level_name)})
    size, info = save_policy(agent, spec, export_dir, info)
    log("wrote %s (%.1f MB, %.1f s)" % (export_dir, size / 1e6, time.time() - start))
    return info
