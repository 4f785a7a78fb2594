"""--mode=export and sandbox/play_policy.py: a run's policy as a SavedModel that plays without this
project, acting as the agent acts (the mode or a sample, the continuous bounds' clip, the LSTM's
state) and, played deterministically, replaying --mode=test's episodes exactly."""
import ast
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from impala import agent as agent_lib
from impala import export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYER = os.path.join(ROOT, "sandbox", "play_policy.py")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


def _run_folder(path, level_name, agent_name, seed=3, **build):
    """A run folder as the learner leaves one: options.json and a checkpoint of a freshly built agent
    (its random weights are a policy like any other)."""
    agent, _, spec = agent_lib.build_agent(level_name, agent_name, 20, **build)
    tf.train.CheckpointManager(tf.train.Checkpoint(agent=agent), str(path / "checkpoints"), 1).save()
    with open(path / "options.json", "w") as f:
        json.dump({"level_name": level_name, "agent_name": agent_name, "seed": seed}, f)
    return agent, spec


# Runs the player with every module of this checkout unimportable (the editable install would find
# them from anywhere): a finder ahead of all others refuses them.
BLOCKED_RUN = """import os, runpy, sys
blocked = set(sys.argv[1].split(","))
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError("the player imported %s, a module of the project" % name)
sys.meta_path.insert(0, Refuse())
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _project_modules():
    names = {n for n in os.listdir(ROOT) if os.path.exists(os.path.join(ROOT, n, "__init__.py"))}
    return sorted(names | {n[:-3] for n in os.listdir(ROOT) if n.endswith(".py")} | {"sandbox", "bench"})


def _experiment(*args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py")] + list(args), capture_output=True,
                       text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow  # trains, exports and plays, about 16 s
def test_a_cartpole_export_replays_test_modes_episodes_without_the_project(tmp_path):
    """Export, then play deterministically from a folder outside the checkout, every module of the
    project unimportable: the episodes --mode=test plays (greedy outside Atari, its env seeded with
    --seed + 12345), return for return and length for length."""
    run = tmp_path / "run"
    _run_folder(run, "CartPole-v1", "MLPAgent")
    out = _experiment("--mode=export", "--load_model_url=%s" % run)
    assert re.search(r"^exporting .*ckpt-1 \(MLPAgent on CartPole-v1\) to .*exported$", out, re.M), out
    assert re.search(r"^wrote .*exported \(\d+\.\d MB, ", out, re.M), out
    info = json.load(open(run / "exported" / "policy.json"))
    assert info["action_space"] == {"type": "Discrete", "n": 2, "dtype": "int32"} and not info["recurrent"]
    assert info["observation"] == {"shape": [4], "dtype": "float32"} and info["test_mode_seed"] == 3 + 12345
    tested = _experiment("--mode=test", "--load_model_url=%s" % run, "--test_num_episodes=6")
    expected = re.findall(r"episode \d+/6: return ([\d.]+), length (\d+)", tested)
    away = tmp_path / "away"
    away.mkdir()
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-I", "-c", BLOCKED_RUN, ",".join(_project_modules()), PLAYER,
                        str(run / "exported"), "--episodes=6", "--deterministic", "--json=played.json"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=away)
    assert r.returncode == 0, r.stderr[-3000:]
    played = re.findall(r"episode \d+/6: return ([\d.]+), length (\d+)", r.stdout)
    assert len(expected) == 6 and played == expected, (tested, r.stdout)
    result = json.load(open(away / "played.json"))
    assert result["mean_return"] == json.load(open(run / "test_results.json"))["mean_return"]
    assert len(set(result["lengths"])) > 1  # the seeds matter: not one episode six times


def test_the_player_imports_only_tensorflow_gymnasium_numpy_and_the_standard_library():
    """ale_py for Atari and imageio for --video_dir are imported only where they are used."""
    tree = ast.parse(open(PLAYER).read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    third_party = names - set(sys.stdlib_module_names)
    assert third_party == {"tensorflow", "gymnasium", "numpy", "ale_py", "imageio"}, third_party


def _export(agent, spec, path, level_name, agent_name):
    export.save_policy(agent, spec, str(path), export.describe(spec, level_name, agent_name, 84, {}))
    return tf.saved_model.load(str(path)), json.load(open(path / "policy.json"))


def test_a_pendulum_export_acts_with_the_agents_mean_clipped_to_the_bounds(tmp_path):
    """Continuous actions: deterministic is the Gaussian's mean (after the observation normaliser,
    whose statistics the SavedModel holds), clipped to the Box as the env batch clips it; a sample
    lies within the bounds too."""
    tf.random.set_seed(3)  # weights whose scaled means fall on both sides of the bounds (unseeded: not always)
    agent, _, spec = agent_lib.build_agent("Pendulum-v1", "MLPAgent", 20, normalize_observations=True)
    agent.obs_normaliser.mean.assign([0.5, -0.5, 1.0])
    agent.obs_normaliser.var.assign([0.25, 4.0, 9.0])
    for v in agent.trainable_variables:
        if "policy_logits" in v.name:
            v.assign(v * 30.0)  # means well beyond [-2, 2] for some observations
    model, info = _export(agent, spec, tmp_path / "exported", "Pendulum-v1", "MLPAgent")
    assert info["action_space"]["type"] == "Box" and info["action_space"]["low"] == [-2.0]
    obs = np.random.default_rng(0).uniform(-8, 8, (64, 3)).astype(np.float32)
    out, _ = agent(tf.constant(obs), tf.zeros([64], tf.bool), ())
    mean = agent.policy.mode(out.policy_logits).numpy()
    assert (np.abs(mean) > 2).any() and (np.abs(mean) < 2).any()
    serve = model.signatures["serving_default"]
    det = serve(observation=tf.constant(obs), deterministic=tf.constant(True))
    # the SavedModel's graph (grappler's fused kernels) and eager ops round the last bits apart
    np.testing.assert_allclose(det["action"].numpy(), np.clip(mean, -2, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(det["value"].numpy(), out.baseline.numpy(), rtol=1e-5, atol=1e-5)
    sampled = model.policy(tf.constant(obs), tf.constant(False))["action"].numpy()
    assert sampled.shape == (64, 1) and (np.abs(sampled) <= 2).all() and not np.allclose(sampled, det["action"])


def test_a_recurrent_export_takes_and_returns_the_lstm_state(tmp_path):
    """MLPLSTMAgent: initial_state(batch_size), the state carried from step to step as the agent
    carries it, and `first` starting an episode from the initial state whatever state comes in."""
    agent, _, spec = agent_lib.build_agent("CartPole-v1", "MLPLSTMAgent", 20)
    model, info = _export(agent, spec, tmp_path / "exported", "CartPole-v1", "MLPLSTMAgent")
    assert info["recurrent"] and info["state"] == [{"name": "lstm_hidden", "shape": [256], "dtype": "float32"},
                                                   {"name": "lstm_cell", "shape": [256], "dtype": "float32"}]
    init = model.signatures["initial_state"](batch_size=tf.constant(3))
    assert {k: v.shape for k, v in init.items()} == {"lstm_hidden": (3, 256), "lstm_cell": (3, 256)}
    serve, state, ours = model.signatures["serving_default"], init, agent.initial_state(3)
    obs = np.random.default_rng(1).normal(size=(4, 3, 4)).astype(np.float32)
    for t in range(4):
        first = tf.constant([t == 0, False, t == 2])
        out = serve(observation=tf.constant(obs[t]), first=first, deterministic=tf.constant(True), **state)
        state = {k: out[k] for k in ("lstm_hidden", "lstm_cell")}
        theirs, ours = agent(tf.constant(obs[t]), first, ours)
        np.testing.assert_allclose(state["lstm_hidden"], ours.hidden, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state["lstm_cell"], ours.cell, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["action"], agent.policy.mode(theirs.policy_logits))
    fresh = serve(observation=tf.constant(obs[0]), first=tf.constant([True] * 3), deterministic=tf.constant(True),
                  **init)
    carried = serve(observation=tf.constant(obs[0]), first=tf.constant([True] * 3), deterministic=tf.constant(True),
                    **state)
    np.testing.assert_array_equal(fresh["lstm_cell"], carried["lstm_cell"])
    assert np.abs(state["lstm_cell"]).sum() > 0


def test_the_players_atari_wrappers_give_the_runs_python_backend_observations():
    """policy.json's env_wrappers as the player applies them (gymnasium's own wrappers) give, action
    for action, the observations, rewards and game ends of envs.make_env's evaluation env (the run's
    Python backend), FIRE after a lost life included."""
    import importlib.util

    import envs
    from envs import factory
    spec_ = importlib.util.spec_from_file_location("play_policy", PLAYER)
    player = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(player)
    spec = envs.env_spec("BreakoutNoFrameskip-v4", (42, 42))
    info = export.describe(spec, "BreakoutNoFrameskip-v4", "SimpleConvNetAgent", (42, 42), {})
    ours, theirs = player.make_env(info), factory.make_env("BreakoutNoFrameskip-v4", training=False, frame_size=42)
    try:
        a, b = ours.reset(seed=7)[0], theirs.reset(seed=7)[0]
        lives_lost = 0
        for action in np.random.default_rng(0).integers(0, 4, 400):
            np.testing.assert_array_equal(a, b)
            a, ra, ta, ua, _ = ours.step(int(action))
            lives = theirs.unwrapped.ale.lives()
            b, rb, tb, ub, _ = theirs.step(int(action))
            lives_lost += theirs.unwrapped.ale.lives() < lives
            assert (ra, ta, ua) == (rb, tb, ub)
            if ta or ua:
                a, b = ours.reset()[0], theirs.reset()[0]
        assert a.shape == (42, 42, 4) and a.dtype == np.uint8 and lives_lost > 0
    finally:
        ours.close()
        theirs.close()


def test_an_export_dir_holding_other_files_is_refused_in_one_line(tmp_path):
    """An export replaces an earlier export at --export_dir, and never deletes anything else."""
    (tmp_path / "run").mkdir()
    json.dump({"level_name": "CartPole-v1", "agent_name": "MLPAgent"}, open(tmp_path / "run" / "options.json", "w"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=export",
                        "--load_model_url=%s" % (tmp_path / "run"), "--export_dir=%s" % (tmp_path / "mine")],
                       capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "experiment.py: error: --export_dir=%s holds files that are not an exported policy; give an empty or new "
        "folder" % (tmp_path / "mine")], r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
