"""IMPALA under a real Slurm (Debian's slurmctld, slurmd and munged, started here by
tests/slurm_fixture.py and stopped after): `sbatch sandbox/slurm_impala.sbatch` trains CartPole with
1 learner and 2 actors, and `scancel` ends a run with a checkpoint and leaves no process behind (slow:
the fixture may apt-get the packages first). The launcher's reading of an allocation is tested without Slurm."""
import csv
import glob
import json
import os
import sys
import time

import psutil
import pytest

import slurm_fixture
from bench import cartpole_impala
from cluster import slurm
from cluster import slurm_watch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH = os.path.join(ROOT, "sandbox", "slurm_impala.sbatch")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_fixture.install_missing()
    if why:
        pytest.fail(why)
    s = slurm_fixture.Slurm(str(tmp_path_factory.mktemp("slurm")))
    try:
        yield s.start()
    finally:
        s.stop()


def _submit(cluster, out, *args, ntasks=3):
    env_args = ["--export=ALL,IMPALA_PYTHON=%s" % sys.executable]
    p = cluster.run("sbatch", "--parsable", "--ntasks=%d" % ntasks, "--chdir=" + ROOT, "--output=" + out,
                    *env_args, SBATCH, *args)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def _submit_endless(cluster, tmp_path, checkpoint_every_s):
    """A CartPole job with a frame budget it will not reach: (run folder, job output, job id)."""
    logdir, out = str(tmp_path / "run"), str(tmp_path / "job.out")
    job = _submit(cluster, out, "--logdir=" + logdir, *cartpole_impala.FLAGS, "--log_every_s=1",
                  "--total_environment_frames=100000000", "--checkpoint_every_s=%g" % checkpoint_every_s)
    return logdir, out, job


def _wait_done(cluster, job, timeout, out):
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = cluster.job_state(job)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(1)
    raise AssertionError("job %s still %s after %d s:\n%s" % (job, state, timeout, open(out).read()[-3000:]))


def _leftovers(logdir):
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and logdir in " ".join(p.info["cmdline"] or []):
                found.append("%d: %s" % (p.pid, " ".join(p.info["cmdline"])[:150]))
        except psutil.Error:
            pass
    return found


def _best_return(logdir):
    rows = list(csv.DictReader(open(os.path.join(logdir, "metrics.csv"))))
    return max(float(r["mean_return_20"]) for r in rows if r["mean_return_20"] != "nan")


README_SBATCH = "sbatch --ntasks=3 sandbox/slurm_impala.sbatch --flagfile=configs/cartpole.flags"


@pytest.mark.slow
def test_sbatch_trains_cartpole_to_475(cluster, tmp_path):
    """The README's Slurm command, with the test's run folder and job output added."""
    logdir, out = str(tmp_path / "run"), str(tmp_path / "job.out")
    words = README_SBATCH.split()
    assert words[:3] == ["sbatch", "--ntasks=3", "sandbox/slurm_impala.sbatch"]
    job = _submit(cluster, out, *words[3:], "--logdir=" + logdir, "--log_every_s=1")
    state = _wait_done(cluster, job, 400, out)
    text = open(out).read()
    assert state == "COMPLETED" and cluster.job_exit_code(job) == "0:0", text + open(
        os.path.join(logdir, "logs", "learner.log")).read()[-3000:]
    assert "1 learner(s) at %s:8001, 2 actor(s)" % cluster.node in text, text
    for name in ("learner.log", "actor_0.log", "actor_1.log"):
        assert os.path.getsize(os.path.join(logdir, "logs", name)) > 0, name
    plan = json.load(open(os.path.join(logdir, "slurm.json")))
    assert plan["job_id"] == job and plan["actors"].count(cluster.node) == 2
    summary = json.load(open(os.path.join(logdir, "summary.json")))
    print("Slurm job %s: best mean-20 return %.1f, %d frames in %.0f s of training"
          % (job, _best_return(logdir), summary["frames"], summary["elapsed_s"]))
    assert _best_return(logdir) >= 475
    assert _leftovers(logdir) == []


@pytest.mark.slow
def test_scancel_ends_the_run_with_a_checkpoint_and_leaves_nothing(cluster, tmp_path):
    logdir, out, job = _submit_endless(cluster, tmp_path, checkpoint_every_s=100000)
    metrics = os.path.join(logdir, "metrics.csv")
    deadline = time.time() + 180
    while not (os.path.exists(metrics) and len(open(metrics).readlines()) >= 3):
        assert time.time() < deadline and cluster.job_state(job) in ("PENDING", "CONFIGURING", "RUNNING"), \
            open(out).read() if os.path.exists(out) else "no job output"
        time.sleep(1)
    assert not glob.glob(os.path.join(logdir, "checkpoints", "ckpt-*.index"))  # none before the stop
    assert cluster.run("scancel", job).returncode == 0
    state = _wait_done(cluster, job, slurm_fixture.KILL_WAIT_S + 60, out)
    assert state == "CANCELLED", state
    learner_log = open(os.path.join(logdir, "logs", "learner.log")).read()
    assert glob.glob(os.path.join(logdir, "checkpoints", "ckpt-*.index")), learner_log[-3000:]
    summary = json.load(open(os.path.join(logdir, "summary.json")))
    assert summary["checkpoint"] and summary["frames"] > 0
    deadline = time.time() + 30
    while _leftovers(logdir) and time.time() < deadline:
        time.sleep(1)
    assert _leftovers(logdir) == []


def _worker_pids(logdir, job):
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and "experiment.py" in " ".join(p.info["cmdline"][:2])
            and "--job_name=" + job in p.info["cmdline"] and "--logdir=" + logdir in p.info["cmdline"]]


def _wait_for(what, check, timeout, out):
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "no %s within %d s:\n%s" % (what, timeout, open(out).read()[-3000:])
        time.sleep(0.5)


@pytest.mark.slow
def test_a_killed_actor_and_a_killed_learner_are_started_again_and_the_run_goes_on(cluster, tmp_path):
    """The learners resume from their newest checkpoint: the frame counter goes on from it."""
    logdir, out, job = _submit_endless(cluster, tmp_path, checkpoint_every_s=3)
    try:
        logs = os.path.join(logdir, "logs")
        text = lambda: open(out).read() if os.path.exists(out) else ""
        _wait_for("second actor", lambda: len(_worker_pids(logdir, "actor")) == 2, 120, out)
        os.kill(_worker_pids(logdir, "actor")[0], 9)
        _wait_for("actor restart", lambda: "restarting it on %s (restart 1/3)" % cluster.node in text(), 30, out)
        _wait_for("a checkpoint", lambda: slurm_watch.checkpoint_dir(logdir), 60, out)
        os.kill(_worker_pids(logdir, "learner")[0], 9)
        t0 = time.time()
        _wait_for("learner restart", lambda: "the learners exited with status -9: restarting them (restart 1/3)" in
                  text(), 30, out)
        learner_log = os.path.join(logs, "learner.log")
        _wait_for("resumed learner", lambda: "resumed from" in open(learner_log).read(), 120, out)
        rows = lambda: len(open(os.path.join(logdir, "metrics.csv")).readlines())
        before = rows()
        _wait_for("training again", lambda: rows() >= before + 3, 120, out)
        print("the learners trained again %.1f s after rank 0 was killed" % (time.time() - t0))
        print("".join(line for line in open(out) if line.startswith("[slurm")))
        restarts = json.load(open(os.path.join(logdir, slurm_watch.RESTARTS_FILE)))["restarts"]
        assert [r["worker"] for r in restarts[:2]] in (["actor 0", "learners"], ["actor 1", "learners"]), restarts
        assert restarts[1]["resumed"] == os.path.join(logdir, "checkpoints")
        frames = [int(r["frames"]) for r in csv.DictReader(open(os.path.join(logdir, "metrics.csv")))]
        assert frames[-1] > frames[before - 2] > 0  # the counter went on from the checkpoint, not from 0
    finally:  # also when a check failed: a job left running would outlive the test's Slurm
        assert cluster.run("scancel", job).returncode == 0
        _wait_done(cluster, job, slurm_fixture.KILL_WAIT_S + 60, out)
    deadline = time.time() + 30
    while _leftovers(logdir) and time.time() < deadline:
        time.sleep(1)
    assert _leftovers(logdir) == []


def test_a_failed_actor_moves_to_the_next_node_that_is_up():
    nodes, learners = ["n1", "n2", "n3", "n4"], ["n1"]
    assert slurm_watch.next_node("n2", nodes, learners, nodes, {"n2"}) == "n3"
    assert slurm_watch.next_node("n4", nodes, learners, nodes, {"n4"}) == "n2"  # wraps, past the learner node
    assert slurm_watch.next_node("n2", nodes, learners, ["n1", "n2"], {"n2"}) == "n1"  # only the learners' left
    assert slurm_watch.next_node("n1", ["n1"], learners, ["n1"], {"n1"}) == "n1"  # nowhere else: tried again
    sinfo = type("Done", (), {"returncode": 0, "stdout": "n1 idle\nn2 down*\nn3 drain\nn4 mix\n", "stderr": ""})
    assert slurm_watch.nodes_up(nodes, run=lambda *a, **k: sinfo) == ["n1", "n4"]
    failed = type("Done", (), {"returncode": 1, "stdout": "", "stderr": "sinfo: error"})
    assert slurm_watch.nodes_up(nodes, run=lambda *a, **k: failed) == nodes


def test_the_learners_are_restarted_on_failures_a_restart_can_mend(tmp_path):
    assert slurm_watch.why_not_restart(-9, False, 0, 3) == ""
    assert slurm_watch.why_not_restart(1, False, 2, 3) == ""
    assert "--learner_restarts=3" in slurm_watch.why_not_restart(1, False, 3, 3)
    assert "bad input" in slurm_watch.why_not_restart(2, False, 0, 3)
    assert "stopped being finite" in slurm_watch.why_not_restart(7, False, 0, 3)
    assert slurm_watch.why_not_restart(0, False, 0, 3) == "finished"
    assert slurm_watch.why_not_restart(-15, True, 0, 3) == "stopping"
    assert slurm_watch.checkpoint_dir(str(tmp_path)) == ""
    os.makedirs(tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert slurm_watch.checkpoint_dir(str(tmp_path)) == str(tmp_path / "checkpoints")


def test_the_allocation_picks_learner_and_actor_nodes(monkeypatch):
    alloc = slurm.Allocation("7", ["n1", "n2", "n3"], 6, 0)
    lay = slurm.plan_layout(alloc, 1, 0, 8001)
    assert lay.learners == [("n1", 8001)] and [n for n, _ in lay.actors] == ["n2", "n3", "n2", "n3", "n2"]
    gpus = slurm.plan_layout(slurm.Allocation("7", ["n1", "n2", "n3"], 8, 2), 4, 0, 9000)
    assert gpus.learners == [("n1", 9000), ("n1", 9001), ("n2", 9002), ("n2", 9003)]
    assert {n for n, _ in gpus.actors} == {"n3"} and len(gpus.actors) == 4
    one = slurm.plan_layout(slurm.Allocation("7", ["n1"], 3, 0), 1, 0, 8001)
    assert [n for n, _ in one.actors] == ["n1", "n1"]
    with pytest.raises(slurm.SlurmError, match="leaves no actor; ask for more \\(sbatch --ntasks=3"):
        slurm.plan_layout(slurm.Allocation("7", ["n1"], 2, 0), 2, 0, 8001)
    with pytest.raises(slurm.SlurmError, match="needs 2 nodes; the allocation has 1"):
        slurm.plan_layout(slurm.Allocation("7", ["n1"], 9, 2), 4, 0, 8001)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm.main(["--level_name=CartPole-v1"]) == 2
    argv = slurm.learners_argv("py", gpus, "/r", ["--x=1"])
    assert argv[0] == "mpirun" and argv[argv.index("-H") + 1] == "n1:2,n2:2" and argv[-1] == "--x=1"


@pytest.mark.parametrize("env,name", [({"SLURM_NTASKS": "¹²"}, "SLURM_NTASKS"), ({"SLURM_NTASKS": "٣٤"}, "SLURM_NTASKS"),
                                      ({"SLURM_GPUS_ON_NODE": "８"}, "SLURM_GPUS_ON_NODE"),
                                      ({"SLURM_GPUS_PER_NODE": "gpu:٢"}, "SLURM_GPUS_PER_NODE")])
def test_slurm_counts_of_other_scripts_digits_are_one_line_naming_the_variable(monkeypatch, capsys, env, name):
    """int() read '٣٤' as 34 and failed on '¹²' with a traceback; isdigit() passed both."""
    expanded = type("Done", (), {"returncode": 0, "stdout": "n1 n2\n", "stderr": ""})
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: expanded)  # scontrol show hostnames
    for var in ("SLURM_NTASKS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert slurm.main(["--level_name=CartPole-v1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurm.py: error: %s=%r: " % (name, env[name])) and err.count("\n") == 1, err
    assert "ASCII digits 0-9" in err and "sets it" in err, err
    monkeypatch.setenv(name, env[name].replace(env[name].split(":")[-1], "2"))
    assert slurm.read_allocation()[2:] == ((2, 0) if name == "SLURM_NTASKS" else (2, 2))


def test_slurm_launcher_flags_take_ascii_digits_only(capsys):
    with pytest.raises(SystemExit) as e:
        slurm.parse_args(["--num_learners=٢"])
    assert e.value.code == 2
    assert "argument --num_learners: '٢' is not an integer; write ASCII digits 0-9" in capsys.readouterr().err
