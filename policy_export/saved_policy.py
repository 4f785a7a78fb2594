"""The export folder: a TensorFlow SavedModel, policy.json beside it (what a player needs to know:
the env, its wrappers, the spaces, the signature's inputs and outputs, how --mode=test plays) and
policy.onnx, the same policy for ONNX runtimes. sandbox/play_policy.py reads it."""
import json
import os
import shutil

import numpy as np
import tensorflow as tf

import envs
from policy_export import onnx_file

POLICY_JSON = "policy.json"
FORMAT = 1


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
    """policy.json's content but for the signature's part, which write_export adds."""
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


def folder_size(path):
    """Bytes in the files under path."""
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def signature_info(module, states):
    """policy.json's inputs and outputs of the serving signature (`module.policy`) and its state
    tensors' shapes (`states`: name -> a [1, ...] tensor, in the signature's order)."""
    return {"recurrent": bool(states),
            "state": [{"name": n, "shape": list(s.shape[1:]), "dtype": s.dtype.name} for n, s in states.items()],
            "inputs": [s.name for s in module.policy.input_signature],
            "outputs": ["action", "value"] + list(states)}


def _write_onnx(module, export_dir, onnx, log):
    """policy.json's ONNX part, after writing policy.onnx (onnx=True) or not; a conversion that
    fails is one logged line, and the export goes on without the file."""
    if not onnx:
        return {"onnx": None, "onnx_not_written": "--export_onnx is off"}
    outputs, failure = onnx_file.write_onnx(module.policy, os.path.join(export_dir, onnx_file.ONNX_FILE))
    if failure is None:
        return {"onnx": onnx_file.ONNX_FILE, "onnx_outputs": outputs}
    log(failure)
    return {"onnx": None, "onnx_not_written": failure}


def write_export(module, export_dir, info, signatures, onnx=True, log=print):
    """Writes the SavedModel of `module` (its `signatures`), policy.onnx (if `onnx`) and policy.json
    (`info` and the ONNX part) into export_dir, replacing an earlier export there; returns (the
    folder's size in bytes, policy.json's content)."""
    if check_export_dir(export_dir):
        shutil.rmtree(export_dir)  # an earlier export: its variables must not outlive it
    tf.saved_model.save(module, export_dir, signatures=signatures)
    info = dict(info, **_write_onnx(module, export_dir, onnx, log))
    with open(os.path.join(export_dir, POLICY_JSON), "w") as f:
        json.dump(info, f, indent=2)
    return folder_size(export_dir), info
