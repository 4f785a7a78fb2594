"""ppo_main.py --mode=export: a WALL-E run's policy in the folder IMPALA's export writes, which
sandbox/play_policy.py plays as WALL-E's --mode=test plays it, and onnxruntime runs as the
SavedModel does (the observation normaliser and the action bounds folded in)."""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf

import envs
from walle import checkpoint as checkpoint_lib
from walle import config
from walle import export
from walle import samplers
from walle.agent import PPO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYER = os.path.join(ROOT, "sandbox", "play_policy.py")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
EPISODES = 3

pytestmark = pytest.mark.slow  # its fixture trains, tests and exports a WALL-E run: about 30 s


def _run(*args, cwd=ROOT):
    r = subprocess.run([sys.executable] + list(args), capture_output=True, text=True, timeout=120, env=ENV, cwd=cwd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two iterations of PPO on Pendulum (a normaliser that has seen 600 observations), tested
    and exported as a user would."""
    run = tmp_path_factory.mktemp("walle") / "run"
    main = os.path.join(ROOT, "ppo_main.py")
    _run(main, "Pendulum-v1", "-it", "2", "-b", "300", "--seed", "4", "--quiet", "--logdir", str(run))
    _run(main, "--mode=test", "--load_model_url=%s" % run, "--eval_episodes=%d" % EPISODES)
    exported = _run(main, "--mode=export", "--load_model_url=%s" % run)
    return run, exported.stdout


def test_the_player_replays_walle_test_modes_episodes(run, tmp_path):
    """--deterministic with policy.json's seed (--seed + 10000, episode i reset with seed + i as
    WALL-E's --mode=test resets them) plays --mode=test's episodes. The returns agree to 1e-4, not
    bit for bit: --mode=test runs the policy as numpy matmuls (walle/samplers.py), the SavedModel
    as TensorFlow's, whose float32 sums round the last bits apart."""
    run, out = run
    assert re.search(r"^exporting .*ckpt-2 \(WALL-E PPO on Pendulum-v1\) to .*exported$", out, re.M), out
    assert re.search(r"^wrote .*exported \(\d+\.\d MB, [\d.]+ s, with policy.onnx\)$", out, re.M), out
    info = json.load(open(run / "exported" / "policy.json"))
    assert info["test_mode_seed"] == 4 + 10000 and info["test_mode_reset_seeds"] == "per_episode"
    assert info["action_space"]["low"] == [-2.0] and info["inputs"] == ["observation", "deterministic"]
    _run(PLAYER, str(run / "exported"), "--episodes=%d" % EPISODES, "--deterministic", "--json=played.json",
         cwd=tmp_path)
    played = json.load(open(tmp_path / "played.json"))
    tested = json.load(open(run / "test_results.json"))
    assert played["lengths"] == [200] * EPISODES and len(set(tested["returns"])) == EPISODES
    np.testing.assert_allclose(played["returns"], tested["returns"], rtol=0, atol=1e-4)


def _restored_agent(run):
    args = argparse.Namespace(**config.load_flags(str(run)))
    agent = PPO(3, 1, args)
    checkpoint_lib.Checkpointer(agent, str(run)).restore(str(run), full=False)
    return agent


def _onnx(path, obs):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {"observation": obs, "deterministic": np.array(True)})))


def test_the_saved_model_and_onnx_act_as_walles_samplers(run, tmp_path):
    """The run's agent, its output layer scaled up so that the mean passes the bounds for some
    observations, exported as --mode=export exports it, on observations well outside the
    normaliser's range (its clip matters too): the samplers' mean, normalised, clipped."""
    run, _ = run
    agent = _restored_agent(run)
    out = [v for v in agent.policy.trainable_variables if "policy_%d/w" % len(agent.policy.widths) in v.name]
    out[0].assign(out[0] * 10.0)
    export.save_policy(agent, envs.env_spec("Pendulum-v1"), str(tmp_path / "exported"), {}, log=pytest.fail)
    params = agent.params()
    assert not np.allclose(params["obs_mean"], 0) and not np.allclose(params["obs_std"], 1)
    obs = np.random.default_rng(0).normal(0, 40, (64, 3)).astype(np.float32)
    x = samplers.normalise_obs(obs, params["obs_mean"], params["obs_std"], params["obs_clip"])
    mean = samplers.policy_mean(params["layers"], x, params["activation"])
    assert (np.abs(x) == params["obs_clip"]).any() and (np.abs(mean) > 2).any() and (np.abs(mean) < 2).any()
    serve = tf.saved_model.load(str(tmp_path / "exported")).signatures["serving_default"]
    saved = {k: v.numpy() for k, v in serve(observation=tf.constant(obs), deterministic=tf.constant(True)).items()}
    for out in (saved, _onnx(tmp_path / "exported" / "policy.onnx", obs)):
        np.testing.assert_allclose(out["action"], np.clip(mean, -2, 2), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["value"], agent.value(x).numpy(), rtol=1e-5, atol=1e-5)
    sampled = serve(observation=tf.constant(obs), deterministic=tf.constant(False))["action"].numpy()
    assert (np.abs(sampled) <= 2).all() and not np.allclose(sampled, saved["action"])


def test_an_export_dir_holding_other_files_is_refused_in_one_line(run, tmp_path):
    run, _ = run
    (tmp_path / "notes.txt").write_text("keep")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "ppo_main.py"), "--mode=export",
                        "--load_model_url=%s" % run, "--export_dir=%s" % tmp_path],
                       capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --export_dir=%s holds files that are not an exported policy; give an empty or new folder"
        % tmp_path], r.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep"
