"""The original project's manual launch (its sandbox/example_dtf.md): each worker started by hand
with --learner_host/--actor_hosts/--task, and two learners as one MPMD mpirun job (`... : ...`),
each rank naming only its own server and actors. Real processes, real mpirun, real CartPole;
the host-flag checks of both forms without processes."""
import os
import re
import subprocess
import sys

import pytest

from impala import placement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
CARTPOLE = ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=8", "--unroll_length=20",
            "--envs_per_actor=4", "--queue_capacity=16", "--log_every_s=1", "--total_environment_frames=6000"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")


def _ports(n):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _hosts(ports):
    return ",".join("localhost:%d" % p for p in ports)


def _start(cmd, log):
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=ENV, cwd=ROOT,
                            start_new_session=True)


def _wait_all(procs, logs, timeout=240):
    """Every worker's exit code; kills what is still running on the way out."""
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    assert codes == [0] * len(procs), "\n\n".join("%s (exit %s):\n%s" % (log, p.returncode, open(log).read()[-3000:])
                                                 for p, log in zip(procs, logs))


def _experiment(*args):
    return [PY, os.path.join(ROOT, "experiment.py")] + list(args)


def test_one_learner_two_actors_without_mpirun(tmp_path):
    """Example 1 of the original: `--learner_host=localhost:8001 --actor_hosts=localhost:9000,localhost:9001`,
    the learner and each actor started by hand; every worker exits 0 at the frame budget."""
    learner, a0, a1 = _ports(3)
    common = ["--learner_host=localhost:%d" % learner, "--actor_hosts=" + _hosts([a0, a1])] + CARTPOLE
    logs = [str(tmp_path / n) for n in ("learner.log", "actor0.log", "actor1.log")]
    procs = [_start(_experiment(*common, "--job_name=learner", "--task=0", "--logdir=%s" % (tmp_path / "run")), logs[0])]
    procs += [_start(_experiment(*common, "--job_name=actor", "--task=%d" % i), logs[1 + i]) for i in range(2)]
    _wait_all(procs, logs)
    out = open(logs[0]).read()
    assert re.search(r"after \d+ frames", out), out
    for i in (0, 1):
        assert "learner localhost:%d" % learner in open(logs[1 + i]).read()


@pytest.mark.slow  # the default suite launches one learner by hand
def test_two_learners_as_one_mpmd_mpirun(tmp_path):
    """Example 2 of the original: one mpirun, `-np 1 ... --learner_host=A --actor_hosts=<A's actors> : -np 1
    ... --learner_host=B --actor_hosts=<B's actor>`, with its MCA options; rank 0 carries two actors and
    rank 1 one. Every worker exits 0 and the two ranks end with the same weights (Horovod's allreduce)."""
    l0, l1, a1, a2, a3 = _ports(5)
    rank_flags = [["--learner_host=localhost:%d" % l0, "--actor_hosts=" + _hosts([a1, a3])],
                  ["--learner_host=localhost:%d" % l1, "--actor_hosts=" + _hosts([a2])]]
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-H", "localhost,localhost", "-bind-to", "none",
              "-map-by", "slot", "-x", "LD_LIBRARY_PATH", "-x", "PATH", "-mca", "pml", "ob1", "-mca", "btl", "^tcp"]
    ranks = []
    for r, own in enumerate(rank_flags):
        ranks += ([":"] if r else []) + ["-np", "1"] + _experiment(
            *own, *CARTPOLE, "--job_name=learner", "--task=0", "--logdir=%s" % (tmp_path / "run"))
    logs = [str(tmp_path / n) for n in ("learners.log", "actor_l0_0.log", "actor_l0_1.log", "actor_l1_0.log")]
    procs = [_start(mpirun + ranks, logs[0])]
    actors = [(rank_flags[0], 0), (rank_flags[0], 1), (rank_flags[1], 0)]
    procs += [_start(_experiment(*own, *CARTPOLE, "--job_name=actor", "--task=%d" % t), log)
              for (own, t), log in zip(actors, logs[1:])]
    _wait_all(procs, logs)
    out = open(logs[0]).read()
    assert "rank 0 serves localhost:%d (2 actor(s)), rank 1 serves localhost:%d (1 actor(s))" % (l0, l1) in out, out
    sums = dict(re.findall(r"\[learner (\d)\] final weights sha256 ([0-9a-f]{64})", out))
    assert set(sums) == {"0", "1"} and sums["0"] == sums["1"], out


def test_two_ranks_on_one_server_are_refused(tmp_path):
    port = _ports(1)[0]
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "none"] + _experiment(
        "--learner_host=localhost:%d" % port, *CARTPOLE, "--job_name=learner", "--logdir=%s" % (tmp_path / "run"))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode != 0
    assert "learner ranks 0 and 1 both serve localhost:%d" % port in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--job_name=actor", "--learner_host=localhost:9", "--learner_hosts=localhost:7,localhost:8"],
     "--learner_host=localhost:9 is not a learner of this job"),
    (["--job_name=actor", "--task=0", "--learner_host=localhost:8", "--learner_hosts=localhost:7,localhost:8"],
     "actor --task=0 feeds learner 0 of --learner_hosts (localhost:7), not --learner_host=localhost:8"),
    (["--job_name=actor", "--task=2", "--learner_host=localhost:8", "--actor_hosts=localhost:1,localhost:2"],
     "--task=2 but --actor_hosts lists only 2 actor(s) (in the MPMD form, this learner's own actors)"),
    (["--learner_host=localhost"], "--learner_host"),
])
def test_disagreeing_host_flags_give_one_clear_error(args, needle):
    r = subprocess.run(_experiment(*args, "--level_name=CartPole-v1", "--agent_name=MLPAgent"),
                       capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode != 0 and needle in r.stderr, r.stderr[-2000:]


def _hosts_of(learner_host=None, learner_hosts=None, actors=()):
    return placement.Hosts(learner_host, learner_hosts or ["127.0.0.1:8001"], learner_hosts is not None, list(actors))


def test_both_forms_assign_the_same_actors():
    spmd = _hosts_of(learner_hosts=["h:1", "h:2"], actors=["a:1", "a:2", "a:3"])
    assert [placement.learner_address(spmd, r, 2) for r in (0, 1)] == ["h:1", "h:2"]
    assert [placement.learner_actor_ids(spmd, r, 2) for r in (0, 1)] == [[0, 2], [1]]
    assert [placement.actor_learner(spmd, t) for t in range(3)] == ["h:1", "h:2", "h:1"]
    mpmd = _hosts_of(learner_host="h:2", actors=["a:2"])
    assert placement.learner_address(mpmd, 1, 2) == "h:2" and placement.learner_actor_ids(mpmd, 1, 2) == [0]
    assert placement.actor_learner(mpmd, 0) == "h:2"
    both = _hosts_of(learner_host="h:2", learner_hosts=["h:1", "h:2"], actors=["a:1", "a:2"])
    assert placement.learner_address(both, 1, 2) == "h:2" and placement.actor_learner(both, 1) == "h:2"
    with pytest.raises(placement.PlacementError, match="rank 0: --learner_host=h:2 but --learner_hosts gives"):
        placement.learner_address(both, 0, 2)
    with pytest.raises(placement.PlacementError, match="lists 2 learner\\(s\\) but 3 Horovod rank"):
        placement.learner_address(spmd, 0, 3)


def test_mpmd_actors_of_different_learners_get_different_seeds():
    a = placement.actor_seed_index(_hosts_of(learner_host="localhost:8001", actors=["x:1"]), 0)
    b = placement.actor_seed_index(_hosts_of(learner_host="localhost:8002", actors=["x:1"]), 0)
    assert a != b
    assert placement.actor_seed_index(_hosts_of(learner_hosts=["h:1"], actors=["x:1", "x:2"]), 1) == 1
