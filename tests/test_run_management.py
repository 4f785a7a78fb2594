"""Replay in a real training run, the test worker (evaluator), and multi_train.py."""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from impala import replay_files
from local_cluster import LocalCluster
from tests.test_experiment import CARTPOLE, _free_base_port, _no_leftovers, _run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ELITE = json.dumps([
    {"type": "queue", "capacity": 1, "sample_ratio": 0.5},
    {"type": "custom", "capacity": 64, "sample_ratio": 0.5, "sample_strategy": "elite_sampling",
     "dist_function": "kl_div", "lambda_batch_multiplier": 3, "elite_sampling_strategy": 2,
     "compress": True}])


@pytest.mark.parametrize("value,needle", [
    ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.7}]', "sum to 1"),
    ('[{"type": "fancy", "capacity": 1, "sample_ratio": 1}]', "fancy"),
    ('[{"type": "standard", "capacity": -5, "sample_ratio": 1}]', "capacity"),
    ('[{"type": "queue", "capacity": 1, "sample_ratio": 1', "not valid JSON"),
    ("[]", "at least one entry"),
])
def test_bad_replay_parameters_give_one_clear_error(value, needle, tmp_path):
    r = _run_experiment(CARTPOLE + ["--replay_parameters=" + value, "--logdir=%s" % (tmp_path / "run")])
    assert r.returncode == 2
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "--replay_parameters" in errors[0] and needle in errors[0], r.stderr
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow  # the default suite trains with replay in test_learner.py
def test_elite_replay_run_with_evaluator(tmp_path):
    """Half of each batch comes from elite replay: the learner takes only 4 of its 8
    unrolls from the actors, counts only those frames, and reports the replay; the
    test worker records greedy evaluation returns apart from training returns. With
    --compute_dtype=auto every process, the evaluator too, times both precisions and says
    which it keeps."""
    logdir = str(tmp_path / "run")
    flags = CARTPOLE + ["--total_environment_frames=24000", "--replay_parameters=" + ELITE,
                        "--test_every_s=2", "--test_num_episodes=2", "--checkpoint_every_s=5", "--compute_dtype=auto"]
    c = LocalCluster(2, _free_base_port(), flags, logdir, evaluator=True).start()
    try:
        assert c.wait(timeout=200) == 0, open(os.path.join(logdir, "logs", "learner.log")).read()
    finally:
        c.stop()
    _no_leftovers(c)
    assert c.evaluator_proc.returncode == 0
    summary = json.load(open(os.path.join(logdir, "summary.json")))
    replay = summary["replay"]
    updates = replay["0_queue"]["drawn"] // 4
    elite = replay["1_elite_sampling"]
    assert elite["drawn"] + elite["from_live"] == 4 * updates  # from_live: while it filled
    assert elite["size"] == 64 and 0 < elite["nbytes"]
    # Live frames only: after the buffer has filled, 4 live unrolls x 20 steps per update.
    assert summary["frames"] <= 24000 + 8 * 20
    assert updates * 8 * 20 > summary["frames"] * 1.5, "replayed unrolls must not count as new frames"
    final = summary["checkpoint"]  # the replay state saved with it, named after it
    assert os.path.exists(replay_files.path_for(os.path.dirname(final), int(final.rsplit("-", 1)[1]), 0))
    rows = list(csv.DictReader(open(os.path.join(logdir, "eval.csv"))))
    assert rows and all(int(r["episodes"]) == 2 for r in rows)
    assert all(float(r["mean_return"]) >= 8 for r in rows)  # a CartPole episode lasts >= 8 steps
    notes = {name: re.findall(r"compute dtype (float32|bfloat16) \(--compute_dtype=auto: (a gradient|an inference) "
                              r"step on (\d+) observations",
                              open(os.path.join(logdir, "logs", name + ".log")).read())
             for name in ("learner", "actor_0", "actor_1", "evaluator")}
    assert [(n[1], int(n[2])) for n in notes["learner"]] == [("a gradient", 8 * 20)], notes  # one minibatch
    assert all(len(notes[name]) == 1 and notes[name][0][1] == "an inference" for name in notes if name != "learner")


def _wait_for_frames(c, logdir, frames, timeout):
    metrics, deadline, got = os.path.join(logdir, "metrics.csv"), time.time() + timeout, 0
    while time.time() < deadline and got < frames:
        time.sleep(1)
        assert c.learner.poll() is None, open(os.path.join(logdir, "logs", "learner.log")).read()
        rows = open(metrics).read().splitlines()[1:] if os.path.exists(metrics) else []
        got = int(rows[-1].split(",")[1]) if rows else 0
    assert got >= frames, "training did not advance: %d frames" % got


def _wait_for_log(logdir, text, timeout):
    path, deadline = os.path.join(logdir, "logs", "learner.log"), time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and text in open(path).read():
            return
        time.sleep(0.5)
    raise AssertionError("no %r in the learner log after %d s" % (text, timeout))


@pytest.mark.slow  # the default suite has the buffer's round trip in test_learner.py
def test_checkpoint_replay_resumes_after_ctrl_c_with_the_same_buffer(tmp_path):
    """A replay run with --checkpoint_replay stopped with SIGINT writes the buffer's unrolls
    with its final checkpoint; the resume (train_w_load, the flag restored from the run's
    options) starts from exactly those contents: the same count and digest."""
    logdir, base = str(tmp_path / "run"), _free_base_port()
    replay = json.dumps([{"type": "queue", "capacity": 1, "sample_ratio": 0.5},
                         {"type": "standard", "capacity": 64, "sample_ratio": 0.5, "compress": True}])
    c = LocalCluster(2, base, CARTPOLE + ["--total_environment_frames=10000000", "--replay_parameters=" + replay,
                                          "--checkpoint_replay", "--checkpoint_every_s=3"], logdir).start()
    try:
        _wait_for_frames(c, logdir, 8000, 150)
        _wait_for_log(logdir, "replay contents of ckpt-", 60)  # a periodic one, before the one at the stop
        os.killpg(c.learner.pid, signal.SIGINT)
        assert c.wait(timeout=60) == 0
    finally:
        c.stop()
    _no_leftovers(c)
    first = open(os.path.join(logdir, "logs", "learner.log")).read()
    saved = re.findall(r"replay contents of ckpt-\d+ checkpointed: (\d+) unrolls.*digest (\w+)", first)
    assert len(saved) >= 2, first  # the periodic ones and the one at the stop
    frames = json.load(open(os.path.join(logdir, "summary.json")))["frames"]
    c2 = LocalCluster(2, base, ["--mode=train_w_load", "--load_model_url=" + logdir,
                                "--total_environment_frames=%d" % (frames + 2000)], logdir).start()
    try:
        assert c2.wait(timeout=150) == 0, open(os.path.join(logdir, "logs", "learner.log")).read()
    finally:
        c2.stop()
    _no_leftovers(c2)
    second = open(os.path.join(logdir, "logs", "learner.log")).read()
    restored = re.search(r"replay state of ckpt-\d+ restored: (\d+) unrolls stored, digest (\w+)", second)
    assert restored and restored.groups() == saved[-1], (saved[-1], second)
    assert int(saved[-1][0]) >= 64  # a full buffer (plus the carried live unrolls) came back


def _write(path, obj):
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ([], "non-empty list"),
    ({"common": {}, "runs": [{"name": "a"}], "extra": 1}, "extra"),
    ([{"name": "a"}, {"name": "a"}], "unique"),
    ([{"logdir": "/tmp/x"}], "logdir"),
    ([{"batch_size": 0}], "batch_size"),
    ([{"agent_name": "Nope"}], "Nope"),
])
def test_multi_train_bad_experiments_start_nothing(content, needle, tmp_path):
    path = _write(tmp_path / "exps.json", content)
    out = tmp_path / "out"
    cli = ["--level_name=CartPole-v1"] + ([] if needle == "Nope" else ["--agent_name=MLPAgent"])
    r = subprocess.run([sys.executable, os.path.join(ROOT, "multi_train.py"), "--experiments=" + path,
                        "--out=%s" % out, "--"] + cli, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("value", ["¹²", "٣٤", "８０"])
def test_launcher_counts_take_ascii_digits_only(monkeypatch, capsys, tmp_path, value):
    """argparse's type=int read '٣٤' and '８０' as 34 and 80 actors."""
    import local_cluster
    import multi_train

    def started(*args, **kwargs):
        raise AssertionError("a cluster was started")
    monkeypatch.setattr(local_cluster, "LocalCluster", started)
    monkeypatch.setattr(sys, "argv", ["local_cluster.py", "--num_actors=" + value, "--logdir=%s" % tmp_path])
    for main in (local_cluster.main, lambda: multi_train.main(["--experiments=%s" % (tmp_path / "none.json"),
                                                               "--num_actors=" + value])):
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "error: argument --num_actors: %r is not an integer; write ASCII digits 0-9" % value in err, err


@pytest.mark.slow  # the default suite checks the experiments file
def test_multi_train_runs_in_sequence_with_precedence(tmp_path):
    """Two runs; the command line beats the run's overrides, which beat "common"."""
    exps = {"common": {"level_name": "CartPole-v1", "agent_name": "MLPAgent", "batch_size": 8,
                       "unroll_length": 20, "envs_per_actor": 4, "queue_capacity": 16,
                       "total_environment_frames": 4000, "seed": 5},
            "runs": [{"name": "plain"}, {"name": "seed7", "seed": 7, "total_environment_frames": 999}]}
    path = _write(tmp_path / "exps.json", exps)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "multi_train.py"), "--experiments=" + path,
                        "--out=%s" % out, "--base_port=%d" % _free_base_port(), "--",
                        "--total_environment_frames=3000", "--log_every_s=1"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "multi_train.csv")))
    assert [row["name"] for row in rows] == ["plain", "seed7"]
    assert all(row["exit_code"] == "0" for row in rows)
    for row, seed in zip(rows, (5, 7)):
        opts = json.load(open(os.path.join(row["logdir"], "options.json")))
        assert opts["seed"] == seed
        assert opts["total_environment_frames"] == 3000
        assert 3000 <= int(row["frames"]) < 3000 + 8 * 20 * 2
