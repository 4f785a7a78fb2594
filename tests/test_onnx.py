"""--mode=export's policy.onnx: onnxruntime acts as the SavedModel acts (the same deterministic
actions and values on the same observations, the LSTM's state carried step to step), and a net
tf2onnx cannot convert is one line, the SavedModel written all the same."""
import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf

from impala import agent as agent_lib
from impala import export
from policy_export import onnx_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
STATES = ("lstm_hidden", "lstm_cell")


def _export(path, level_name, agent_name, log=print, **build):
    """A freshly built agent (random weights are a policy like any other) exported to path:
    (the SavedModel's serving function, an onnxruntime session or None, policy.json's content)."""
    agent, _, spec = agent_lib.build_agent(level_name, agent_name, 20, **build)
    if agent.obs_normaliser is not None:  # statistics the ONNX graph must hold too
        agent.obs_normaliser.mean.assign(np.linspace(-1, 1, spec.obs_shape[0]))
        agent.obs_normaliser.var.assign(np.linspace(0.25, 9, spec.obs_shape[0]))
    _, info = export.save_policy(agent, spec, str(path), export.describe(spec, level_name, agent_name, 84, {}),
                                 log=log)
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    onnx_path = path / onnx_file.ONNX_FILE
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]) if onnx_path.exists() else None
    return agent, serve, session, info


def _observations(info, batch, seed):
    rng = np.random.default_rng(seed)
    shape = [batch] + info["observation"]["shape"]
    if info["observation"]["dtype"] == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.normal(0, 3, shape).astype(np.float32)


def _onnx(session, **feeds):
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: np.asarray(v) for k, v in feeds.items()})))


def _same_action(info, ours, theirs):
    if info["action_space"]["type"] == "Discrete":
        np.testing.assert_array_equal(ours, theirs)  # an argmax: exact, or the nets differ
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("level_name,agent_name,build", [
    ("CartPole-v1", "MLPAgent", {}),
    ("Pendulum-v1", "MLPAgent", {"normalize_observations": True}),
    ("PongNoFrameskip-v4", "SimpleConvNetAgent", {}),
], ids=["cartpole-mlp", "pendulum-gaussian", "pong-conv"])
def test_onnxruntime_acts_as_the_saved_model(tmp_path, level_name, agent_name, build):
    _, serve, session, info = _export(tmp_path / "exported", level_name, agent_name, **build)
    assert info["onnx"] == "policy.onnx" and info["onnx_outputs"] == ["action", "value"], info
    assert [i.name for i in session.get_inputs()] == ["observation", "deterministic"]
    obs = _observations(info, 32, seed=0)
    saved = serve(observation=tf.constant(obs), deterministic=tf.constant(True))
    ours = _onnx(session, observation=obs, deterministic=True)
    _same_action(info, ours["action"], saved["action"].numpy())
    np.testing.assert_allclose(ours["value"], saved["value"].numpy(), rtol=1e-5, atol=1e-5)
    sampled = _onnx(session, observation=obs, deterministic=False)["action"]
    assert sampled.shape == ours["action"].shape and sampled.dtype == ours["action"].dtype
    if info["action_space"]["type"] == "Box":
        assert (np.abs(sampled) <= 2).all() and not np.allclose(sampled, ours["action"])
    else:
        assert ((0 <= sampled) & (sampled < info["action_space"]["n"])).all()


@pytest.mark.parametrize("level_name,agent_name", [("CartPole-v1", "MLPLSTMAgent"),
                                                   ("PongNoFrameskip-v4", "ResNetLSTMAgent")],
                         ids=["cartpole-lstm", "pong-resnet-lstm"])
def test_onnxruntime_carries_the_lstm_state_as_the_saved_model(tmp_path, level_name, agent_name):
    """The state each step returns (next_lstm_hidden, next_lstm_cell in the ONNX graph: ONNX names a
    value once) fed back in, `first` restarting some episodes on the way."""
    _, serve, session, info = _export(tmp_path / "exported", level_name, agent_name)
    assert info["onnx_outputs"] == ["action", "next_lstm_cell", "next_lstm_hidden", "value"], info
    batch, steps = 3, 4
    saved = ours = {k: np.zeros([batch, 256], np.float32) for k in STATES}
    observations = _observations(info, steps * batch, seed=1).reshape([steps, batch] + info["observation"]["shape"])
    for t, obs in enumerate(observations):
        first = np.array([t == 0, False, t == 2])
        out = serve(observation=tf.constant(obs), first=tf.constant(first), deterministic=tf.constant(True),
                    **{k: tf.constant(v) for k, v in saved.items()})
        mine = _onnx(session, observation=obs, first=first, deterministic=True, **ours)
        saved = {k: out[k].numpy() for k in STATES}
        ours = {k: mine["next_" + k] for k in STATES}
        for k in STATES:
            np.testing.assert_allclose(ours[k], saved[k], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(mine["value"], out["value"].numpy(), rtol=1e-4, atol=1e-5)
        _same_action(info, mine["action"], out["action"].numpy())
    assert np.abs(ours["lstm_cell"]).sum() > 0


def test_a_net_tf2onnx_cannot_convert_is_one_line_and_the_saved_model_stays(tmp_path, monkeypatch, capfd):
    """A Gaussian whose mean goes through lgamma, an op tf2onnx has no conversion for."""
    from nets import distributions
    mode = distributions.DiagGaussian.mode
    monkeypatch.setattr(distributions.DiagGaussian, "mode", lambda self, params: tf.math.lgamma(mode(self, params)))
    lines = []
    _, serve, session, info = _export(tmp_path / "exported", "Pendulum-v1", "MLPAgent", log=lines.append)
    line = "policy.onnx not written: tf2onnx cannot convert op Lgamma (tf2onnx has no conversion for it at opset 17)"
    assert lines == [line] and session is None
    assert info["onnx"] is None and info["onnx_not_written"] == line
    assert json.load(open(tmp_path / "exported" / "policy.json"))["onnx_not_written"] == line
    out = serve(observation=tf.zeros([2, 3]), deterministic=tf.constant(True))
    assert out["action"].shape == (2, 1)
    captured = capfd.readouterr()
    assert "tf2onnx" not in captured.out + captured.err and "Traceback" not in captured.err, captured


def test_a_converter_that_raises_is_one_line_too(tmp_path, monkeypatch):
    import tf2onnx

    def refuse(*args, **kwargs):
        raise ValueError("graph input 'observation' not exist\nmore detail")
    monkeypatch.setattr(tf2onnx.convert, "from_function", refuse)
    lines = []
    _, _, session, info = _export(tmp_path / "exported", "CartPole-v1", "MLPAgent", log=lines.append)
    assert lines == ["policy.onnx not written: tf2onnx cannot convert the policy (ValueError: graph input "
                     "'observation' not exist)"] and session is None


@pytest.mark.slow  # experiment.py exports in two subprocesses: about 12 s
def test_experiment_exports_the_onnx_file_and_prints_its_own_lines_only(tmp_path):
    """tf2onnx and grappler log at length; the user sees the export's two lines. --noexport_onnx
    writes the SavedModel alone."""
    agent, _, spec = agent_lib.build_agent("CartPole-v1", "MLPLSTMAgent", 20)
    run = tmp_path / "run"
    tf.train.CheckpointManager(tf.train.Checkpoint(agent=agent), str(run / "checkpoints"), 1).save()
    json.dump({"level_name": "CartPole-v1", "agent_name": "MLPLSTMAgent", "lstm_input_norm": True},
              open(run / "options.json", "w"))
    for flag, written in (("--export_onnx", True), ("--noexport_onnx", False)):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=export", flag,
                            "--load_model_url=%s" % run], capture_output=True, text=True, timeout=120, env=ENV,
                           cwd=ROOT)
        assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
        lines = r.stdout.splitlines()
        assert len(lines) == 2 and lines[0].startswith("exporting ") and lines[1].startswith("wrote "), r.stdout
        assert lines[1].endswith(", with policy.onnx)") == written, r.stdout
        assert (run / "exported" / "policy.onnx").exists() == written
