"""WALL-E's PPO checkpoints: a restored agent updates exactly as the one it was saved from, Ctrl-C
writes a checkpoint that --mode=train_w_load continues (the same run folder, progress.csv going on),
--mode=test scores a checkpoint, and a resume that would change the nets is refused."""
import copy
import csv
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from walle import agent as agent_lib
from walle import checkpoint
from walle import samplers
from tests.test_ppo import ACT_DIM, ENV, OBS_DIM, ZOO, agent_args, read_progress, start_main, wait_for_iterations

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flat(params):
    return [np.asarray(x) for layer in params["layers"] for x in layer] + [
        np.asarray(params[k]) for k in ("logvar", "obs_mean", "obs_std")]


# The zoo's joint loss takes about 17 s: it runs with the slow tests.
@pytest.mark.parametrize("overrides", [
    pytest.param({}, id="walle_kl"),
    pytest.param(dict(ZOO, clip_epochs=3), id="zoo_joint", marks=pytest.mark.slow)])
def test_a_restored_agent_updates_exactly_as_the_one_it_was_saved_from(tmp_path, overrides):
    """Nets, Adam moments and steps, normalisers, beta/lr multiplier, the value fit's previous batch
    and the minibatch RNG all come back: the next update is the same to the last bit."""
    saved = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args(seed=3, **overrides))
    s = samplers.LocalSampler(ENV, seed=0)
    try:
        for _ in range(3):
            params = saved.params()
            saved.update(s.collect(params, 400), params)
        checkpoint.Checkpointer(saved, str(tmp_path)).save(checkpoint.Progress(3, 1200, 9.5, [-1.0]))
        restored = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args(seed=99, **overrides))  # other init and RNG
        prefix, progress = checkpoint.Checkpointer(restored, str(tmp_path)).restore(str(tmp_path))
        assert prefix.endswith("ckpt-3") and progress == checkpoint.Progress(3, 1200, 9.5, [-1.0])
        params = saved.params()
        rollouts = s.collect(params, 400)
    finally:
        s.close()
    for x, y in zip(_flat(params), _flat(restored.params())):
        np.testing.assert_array_equal(x, y)
    stats_saved = saved.update(copy.deepcopy(rollouts), params)
    stats_restored = restored.update(copy.deepcopy(rollouts), restored.params())
    assert stats_saved == stats_restored
    for x, y in zip(_flat(saved.params()), _flat(restored.params())):
        np.testing.assert_array_equal(x, y)


def test_checkpoints_keep_the_newest_three_with_their_state(tmp_path):
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args())
    saver = checkpoint.Checkpointer(agent, str(tmp_path))
    for i in range(1, 6):
        saver.save(checkpoint.Progress(iteration=i))
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert [n for n in names if n.startswith("state-")] == ["state-3.pkl", "state-4.pkl", "state-5.pkl"]
    assert sorted(n for n in names if n.endswith(".index")) == ["ckpt-3.index", "ckpt-4.index", "ckpt-5.index"]
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint there"):
        saver.restore(str(tmp_path / "checkpoints" / "ckpt-1"))


def _run(args, timeout=120):
    return subprocess.run([sys.executable, os.path.join(ROOT, "ppo_parallel_main.py")] + args, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # the default suite restores an agent exactly
def test_ctrl_c_checkpoints_and_train_w_load_continues_the_run(tmp_path):
    logdir = str(tmp_path / "run")
    proc = start_main(["-n", "2", "--norm_reward"], logdir)
    try:
        wait_for_iterations(proc, logdir, 3)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    done = len(read_progress(logdir))
    assert f"checkpoint {logdir}/checkpoints/ckpt-{done} (iteration {done}, {200 * done} steps)" in err
    assert "--mode=train_w_load --load_model_url=" + logdir in err

    # the flags come from the run (-b 200, -n 2, --norm_reward); -it from the command line wins
    resumed = _run(["--mode=train_w_load", "--load_model_url=" + logdir, "-it", str(done + 2)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {logdir}/checkpoints/ckpt-{done}: iteration {done}, {200 * done} steps" in resumed.stdout
    rows = read_progress(logdir)
    assert [int(r["iteration"]) for r in rows] == list(range(1, done + 3))
    assert [int(r["steps"]) for r in rows] == [200 * i for i in range(1, done + 3)]
    times = [float(r["time"]) for r in rows]
    assert times == sorted(times)  # elapsed time goes on from the checkpoint's
    assert [int(r["version"]) for r in rows] == list(range(done + 2))
    flags = json.load(open(os.path.join(logdir, "flags.json")))
    assert flags["norm_reward"] and flags["num_samplers"] == 2 and flags["iterations"] == done + 2

    again = _run(["--mode=train_w_load", "--load_model_url=" + logdir])  # already at --iterations
    assert again.returncode == 0 and len(read_progress(logdir)) == done + 2

    tested = _run(["--mode=test", "--load_model_url=%s/checkpoints/ckpt-%d" % (logdir, done), "--eval_episodes=2"])
    assert tested.returncode == 0, tested.stderr[-3000:]
    result = json.load(open(os.path.join(logdir, "test_results.json")))
    assert result["episodes"] == 2 and result["steps"] == 200 * done and result["checkpoint"].endswith("-%d" % done)
    assert "WARNING" not in tested.stderr


@pytest.mark.slow  # the default suite restores an agent exactly
def test_a_killed_run_resumes_from_its_last_checkpoint_and_redoes_the_rows_after_it(tmp_path):
    logdir = str(tmp_path / "run")
    first = _run([ENV, "-it", "4", "-b", "200", "-n", "1", "--logdir", logdir, "--checkpoint_every_s=0.001"])
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt_dir = os.path.join(logdir, "checkpoints")
    assert sorted(n for n in os.listdir(ckpt_dir) if n.startswith("state-")) == [
        "state-2.pkl", "state-3.pkl", "state-4.pkl"]  # one per iteration, the newest three kept
    # as if it had been killed after iteration 2's checkpoint, with the rows of 3 and 4 written
    two = os.path.join(ckpt_dir, "ckpt-2")
    resumed = _run(["--mode=train_w_load", "--load_model_url=" + two])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from %s: iteration 2, 400 steps" % two in resumed.stdout
    with open(os.path.join(logdir, "progress.csv"), newline="") as f:
        assert [int(r["iteration"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    assert "checkpoint %s/ckpt-4 (iteration 4, 800 steps)" % ckpt_dir in resumed.stdout


@pytest.mark.parametrize("argv, message", [
    (["--mode=train_w_load"], "--mode=train_w_load needs --load_model_url"),
    (["--mode=test", "--load_model_url=/nonexistent/run"], "cannot read the run's flags /nonexistent/run/flags.json"),
    ([], "the env_name argument is required"),
])
def test_resume_flags_get_one_clear_error(argv, message):
    r = _run(argv)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.slow  # two WALL-E runs, about 12 s
def test_a_resume_that_would_change_the_nets_is_refused(tmp_path):
    logdir = str(tmp_path / "run")
    assert _run([ENV, "-it", "1", "-b", "200", "-n", "1", "--logdir", logdir]).returncode == 0
    r = _run(["--mode=train_w_load", "--load_model_url=" + logdir, "--hid_mult", "3"])
    assert r.returncode == 2 and "--hid_mult 10 (saved) vs 3" in r.stderr, r.stderr
    r = _run(["--mode=train_w_load", "--load_model_url=" + logdir + "/checkpoints/ckpt-7"])
    assert r.returncode == 2 and "no checkpoint there" in r.stderr, r.stderr
