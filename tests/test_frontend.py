"""The cluster frontend (run_experiment_mm_raw.py) with real tmux, mpirun and OpenSSH.

Most tests run a small fake experiment script (written to the test's temp dir) that has
experiment.py's worker flags, prints where it runs, heartbeats, and exits cleanly on
SIGINT. That tests the frontend's machinery in seconds. One slow test runs the real
experiment.py (2 Horovod learners + 4 actors).

"Remote" hosts: the CSV names 127.0.0.2, which is not an address of any interface here,
so the frontend treats it as another machine and goes through SSH: a real sshd from
tests/sshd_fixture.py listens there, with its own host key and a login key, and gives
its logins their own tmux servers (TMUX_TMPDIR).

Every test uses its own tmux socket and session name and its own temp dir; finalizers
kill the tmux servers and any process whose command line names the test's run dir.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

import sshd_fixture
from tests.test_custom_envs import MODULE, user_module  # noqa: F401 (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRONTEND = os.path.join(ROOT, "run_experiment_mm_raw.py")
PY = sys.executable

FAKE_EXPERIMENT = r'''
"""Fake experiment.py for the frontend tests: same worker flags, no training."""
import os, signal, sys, time
from absl import app, flags
flags.DEFINE_string("logdir", None, "")
flags.DEFINE_enum("job_name", "learner", ["learner", "actor", "evaluator"], "")
flags.DEFINE_integer("task", 0, "")
flags.DEFINE_list("learner_hosts", [], "")
flags.DEFINE_list("actor_hosts", [], "")
flags.DEFINE_string("level_name", "Fake-v0", "")
flags.DEFINE_integer("batch_size", 32, "")
flags.DEFINE_float("fake_actor_exit_after_s", 0, "actors exit with --fake_actor_exit_code after this long")
flags.DEFINE_integer("fake_actor_exit_code", 3, "")
flags.DEFINE_float("fake_learner_exit_after_s", 0, "learners exit with --fake_learner_exit_code after this long")
flags.DEFINE_integer("fake_learner_exit_code", 0, "")
F = flags.FLAGS

def main(argv):
    got = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: got.append(signum))
    if F.job_name == "actor":
        me, learner = "actor %d" % F.task, F.learner_hosts[F.task % len(F.learner_hosts)]
        exit_after, code = F.fake_actor_exit_after_s, F.fake_actor_exit_code
    elif F.job_name == "evaluator":
        me, learner, exit_after, code = "evaluator", F.learner_hosts[0], 0, 0
    else:
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        me, learner = "learner %d" % rank, F.learner_hosts[rank]
        exit_after, code = F.fake_learner_exit_after_s, F.fake_learner_exit_code
    print("fake %s pid %d learner %s cvd=%s logdir=%s" % (me, os.getpid(), learner,
          os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), F.logdir), flush=True)
    if F.job_name == "learner":  # listen on the learner's port, as the real one does
        import socket
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", int(learner.rsplit(":", 1)[1])))
        server.listen()
    else:
        print("actor: connected to learner %s after 0.0 s" % learner, flush=True)
    t0, beat = time.time(), 0
    while not got:
        time.sleep(0.1)
        if time.time() - t0 > 0.5 * (beat + 1):
            beat += 1
            print("fake %s heartbeat %d" % (me, beat), flush=True)
        if exit_after and time.time() - t0 > exit_after:
            print("fake %s exits with status %d" % (me, code), flush=True)
            return code
    print("fake %s got signal %d: clean exit" % (me, got[0]), flush=True)
    return 0

if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
'''


# ---------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------

class Run:
    """One test's run: its own tmux socket/session, logdir, fake script; cleaned up after."""

    def __init__(self, tmp_path):
        tag = uuid.uuid4().hex[:8]
        self.dir = str(tmp_path)
        self.socket = f"impala_test_{tag}"
        self.session = f"t_{tag}"
        self.logdir = os.path.join(self.dir, "run")
        self.script = os.path.join(self.dir, "fake_experiment.py")
        with open(self.script, "w") as f:
            f.write(FAKE_EXPERIMENT)
        self.sshd = None

    def frontend_args(self, csv, *extra):
        return [PY, FRONTEND, f"--workers_csv_path={csv}", f"--tmux_socket={self.socket}",
                f"--tmux_sess={self.session}", f"--experiment_script={self.script}",
                f"--logdir={self.logdir}", "--stop_timeout_s=20", *extra]

    def frontend(self, csv, *extra, timeout=90):
        p = subprocess.run(self.frontend_args(csv, *extra), cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def write_csv(self, rows, name="workers.csv", key_column=False):
        header = "job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password"
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(header + (",ssh_key_file" if key_column else "") + "\n")
            f.write("\n".join(rows) + "\n")
        return path

    def local_tmux_sessions(self):
        p = subprocess.run(["tmux", "-L", self.socket, "ls", "-F", "#{session_name}"],
                           capture_output=True, text=True)
        return p.stdout.split() if p.returncode == 0 else []

    def remote_tmux_sessions(self):
        p = self.sshd.tmux("-L", self.socket, "ls", "-F", "#{session_name}")
        return p.stdout.split() if p.returncode == 0 else []

    def windows(self, remote=False):
        args = ("-L", self.socket, "list-windows", "-t", self.session, "-F", "#{window_name}")
        p = self.sshd.tmux(*args) if remote else subprocess.run(["tmux", *args], capture_output=True, text=True)
        return p.stdout.split() if p.returncode == 0 else []

    def processes(self):
        """Live processes whose command line names this run's logdir (the frontend's own excepted)."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                    continue
                cmd = " ".join(p.info["cmdline"] or [])
                if self.logdir in cmd and FRONTEND not in cmd:
                    found.append(f"{p.pid}: {cmd[:150]}")
            except psutil.Error:
                pass
        return found

    def sshd_descendants(self):
        """Live processes started through the test's sshd (they carry its TMUX_TMPDIR)."""
        found = []
        for p in psutil.process_iter(["pid", "name", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and \
                        p.environ().get("TMUX_TMPDIR") == self.sshd.tmux_tmpdir and p.info["name"] != "sshd":
                    found.append(f"{p.pid}: {' '.join(p.cmdline())[:150]}")
            except psutil.Error:
                pass
        return found

    def log(self, name):
        path = os.path.join(self.logdir, "logs", name)
        return open(path).read() if os.path.exists(path) else ""

    def cleanup(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        socket_file = os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", self.socket)
        if os.path.exists(socket_file):  # tmux leaves its socket file behind when the server exits
            os.unlink(socket_file)
        if self.sshd is not None:
            self.sshd.tmux("-L", self.socket, "kill-server")
        kill_naming(self.logdir)


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    yield r
    r.cleanup()


@pytest.fixture
def sshd(tmp_path):
    reason = sshd_fixture.available()
    if reason:
        pytest.skip(reason)
    server = sshd_fixture.Sshd(os.path.join(str(tmp_path), "sshd"))
    try:
        yield server.start()
    finally:
        server.stop()


def free_ports(n):
    return [sshd_fixture.free_port() for _ in range(n)]


def kill_naming(path):
    """Kills this machine's processes whose command line names `path` (a run's folder): what a
    failed test left running, such as mpirun and its ssh to a host."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if path in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                p.kill()
        except psutil.Error:
            pass


def wait_for(predicate, timeout, what, show=None):
    """Polls predicate until it holds; on timeout the error names `what` and adds show()'s text
    (the logs that say why)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + ("\n" + show() if show else ""))


def assert_nothing_left(run):
    assert run.local_tmux_sessions() == []
    assert run.processes() == []
    if run.sshd is not None:
        assert run.remote_tmux_sessions() == []
        assert run.sshd_descendants() == []  # e.g. no orted, no tmux server left by SSH logins


# ---------------------------------------------------------------------------
# local hosts
# ---------------------------------------------------------------------------

def test_dry_run_prints_plan_and_commands_and_starts_nothing(run):
    p = free_ports(5)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"learner,127.0.0.1,{p[1]},,,,"] +
                        [f"actor,127.0.0.1,{port},,,," for port in p[2:]])
    rc, out, err = run.frontend(csv, "--dry_run", "--batch_size=4")
    assert rc == 0, err
    # the assignment: actor i -> learner i % 2
    assert re.search(rf"learner 0 = Horovod rank 0\s+127.0.0.1:{p[0]}.*\n\s+actor 0 .*\n\s+actor 2 ", out)
    assert re.search(rf"learner 1 = Horovod rank 1\s+127.0.0.1:{p[1]}.*\n\s+actor 1 ", out)
    # every command, with the training flag passed through
    for i in range(3):
        assert f"--job_name=actor --task={i} --logdir={run.logdir} --batch_size=4" in out
    assert re.search(r"mpirun --allow-run-as-root --oversubscribe .* -np 2 ", out)
    assert "nothing was started" in out
    assert run.local_tmux_sessions() == []
    assert not os.path.exists(run.logdir)


def test_local_start_status_stop(run):
    """2 learners (different CUDA_VISIBLE_DEVICES: MPMD) + 3 actors on this machine."""
    p = free_ports(5)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},0,,,", f"learner,localhost,{p[1]},1,,,",
                         f"actor,127.0.0.1,{p[2]},,,,", f"actor,127.0.0.1,{p[3]},,,,", f"actor,127.0.0.1,{p[4]},-1,,,"])
    rc, out, err = run.frontend(csv, "--batch_size=4")
    assert rc == 0, out + err
    assert sorted(run.windows()) == ["actor_0", "actor_1", "actor_2", "learners"]
    wait_for(lambda: all("heartbeat 2" in run.log(f"actor_{i}.log") for i in range(3)) and
             all("heartbeat 2" in run.log(f"learner_{r}.log") for r in range(2)), 30, "worker heartbeats")
    # rank r serves learner row r with that row's CUDA_VISIBLE_DEVICES; actor i feeds learner i % 2
    assert f"fake learner 0 pid" in run.log("learner_0.log")
    assert f"learner 127.0.0.1:{p[0]} cvd=0" in run.log("learner_0.log")
    assert f"learner localhost:{p[1]} cvd=1" in run.log("learner_1.log")
    assert f"learner 127.0.0.1:{p[0]} cvd={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} " \
        in run.log("actor_0.log")  # empty in the CSV: inherited
    assert f"learner localhost:{p[1]} " in run.log("actor_1.log")
    assert f"learner 127.0.0.1:{p[0]} cvd=-1 " in run.log("actor_2.log")
    assert "fake learner 1 heartbeat" in run.log("learners.log")  # mpirun's own log has all ranks
    plan = open(os.path.join(run.logdir, "cluster.json")).read()
    assert '"learner": 1' in plan and "mpirun" in plan

    rc, out, err = run.frontend(csv, "--action=status")
    assert rc == 0, out + err
    assert "learner processes found: 2/2" in out
    assert all(re.search(rf"actor {i}\s+alive \(pid \d+\)", out) for i in range(3)), out
    assert "3/3 actors alive" in out

    rc, out, err = run.frontend(csv, "--action=stop")
    assert rc == 0, out + err
    assert "sent SIGINT to 5 worker(s)" in out
    assert "all workers exited" in out
    assert_nothing_left(run)
    for name in ["actor_0.log", "actor_1.log", "actor_2.log", "learner_0.log", "learner_1.log"]:
        assert "clean exit" in run.log(name), name  # SIGINT reached every worker: a clean exit

    rc, out, err = run.frontend(csv, "--action=status")
    assert rc == 1 and "NOT RUNNING" in out


def test_an_evaluator_row_starts_the_test_worker(run):
    """job=evaluator: the test worker in its own window, reading learner 0; shown by the plan and
    status, stopped with the rest. A second evaluator row is refused with its line."""
    p = free_ports(4)
    rows = [f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,", f"evaluator,127.0.0.1,{p[2]},,,,"]
    bad = run.write_csv(rows + [f"evaluator,127.0.0.1,{p[3]},,,,"], name="two.csv")
    rc, out, err = run.frontend(bad, "--dry_run")
    assert rc == 2 and "two.csv:5: a second evaluator row (the first is on line 4)" in err, err
    csv = run.write_csv(rows)
    rc, out, err = run.frontend(csv, "--dry_run")
    assert rc == 0 and "evaluator (plays learner 0's policy)" in out and "--job_name=evaluator --logdir=" in out, out
    rc, out, err = run.frontend(csv)
    assert rc == 0 and "started 1 actor(s) and the evaluator on this machine" in out, out + err
    assert sorted(run.windows()) == ["actor_0", "evaluator_0", "learners"]
    wait_for(lambda: "fake evaluator heartbeat 2" in run.log("evaluator_0.log"), 30, "the evaluator's heartbeats")
    assert f"learner 127.0.0.1:{p[0]} " in run.log("evaluator_0.log")
    rc, out, err = run.frontend(csv, "--action=status")
    assert rc == 0 and re.search(r"evaluator\s+alive \(pid \d+\)", out), out + err
    rc, out, err = run.frontend(csv, "--action=stop")
    assert rc == 0 and "sent SIGINT to 3 worker(s)" in out, out + err
    assert_nothing_left(run)
    assert "clean exit" in run.log("evaluator_0.log")


def test_refuses_to_start_over_a_running_session_or_on_a_busy_port(run):
    p = free_ports(2)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,"])
    subprocess.run(["tmux", "-L", run.socket, "new-session", "-d", "-s", run.session, "sleep 60"], check=True)
    rc, out, err = run.frontend(csv)
    assert rc == 2 and f"tmux session {run.session} already exists" in err, err
    assert len(run.windows()) == 1  # the other session was left alone
    subprocess.run(["tmux", "-L", run.socket, "kill-server"], capture_output=True)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", p[0]))
        busy.listen()
        rc, out, err = run.frontend(csv)
    assert rc == 2 and f"learner port 127.0.0.1:{p[0]} is not free" in err, err
    assert run.local_tmux_sessions() == []


@pytest.mark.parametrize("flag,needle", [
    ("--no_such_flag=1", "Unknown command line flag 'no_such_flag'"),
    ("--batch_size=many", "batch_size"),
    ("--job_name=actor", "--job_name is set by the frontend"),
    ("batch_size=4", "must be written --name=value"),
])
def test_bad_training_flags_start_nothing(run, flag, needle):
    p = free_ports(2)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,"])
    rc, out, err = run.frontend(csv, flag)
    assert rc == 2 and needle in err, err
    assert run.local_tmux_sessions() == []
    assert not os.path.exists(run.logdir)


def test_frontend_number_flags_take_ascii_digits_only(run):
    """absl's int() read --max_restarts=٣ as 3 (its float() --ssh_timeout_s=１５ as 15.0)."""
    p = free_ports(2)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,"])
    rc, out, err = run.frontend(csv, "--max_restarts=٣", "--dry_run")
    assert rc == 2 and err.startswith("error: flag --max_restarts=٣: '٣' is not an integer; write ASCII digits"), err
    assert run.local_tmux_sessions() == [] and not os.path.exists(run.logdir)


@pytest.mark.slow  # waits out several actor restarts, about 12 s
def test_watch_restarts_a_dead_actor_up_to_max_restarts(run):
    p = free_ports(3)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,",
                         f"actor,127.0.0.1,{p[2]},,,,"])
    # every actor exits (status 3) 1.5 s after it starts
    rc, out, err = run.frontend(csv, "--fake_actor_exit_after_s=1.5")
    assert rc == 0, out + err
    rc, out, err = run.frontend(csv, "--action=watch", "--max_restarts=2", "--watch_interval_s=0.5",
                                "--watch_timeout_s=9")
    assert rc == 0, out + err
    for i in range(2):
        assert re.search(rf"actor {i} on this machine was dead \(exit status 3\); restarted it \(1/2\)", out), out
        assert re.search(rf"actor {i} on this machine was dead .*restarted it \(2/2\)", out), out
        assert re.search(rf"actor {i} on this machine is dead \(exit status 3\); not restarting it \(restarted 2", out), out
        assert run.log(f"actor_{i}.log").count("starting actor") == 3
    rc, out, err = run.frontend(csv, "--action=stop")
    assert rc == 0, out + err
    assert_nothing_left(run)


def test_follow_does_not_restart_finished_actors(run):
    """Actors that exit 0 (their learner closed its queue) are done, not dead."""
    p = free_ports(3)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,",
                         f"actor,127.0.0.1,{p[2]},,,,"])
    rc, out, err = run.frontend(csv, "--follow", "--watch_interval_s=0.5", "--fake_actor_exit_after_s=1",
                                "--fake_actor_exit_code=0", "--fake_learner_exit_after_s=5")
    assert rc == 0, out + err
    assert "the learners exited (mpirun status 0)" in out, out
    assert "restarted it" not in out, out
    for i in range(2):
        assert f"actor {i} on this machine finished (exit status 0); not restarting it" in out, out
        assert run.log(f"actor_{i}.log").count("starting actor") == 1
    assert_nothing_left(run)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_follow_prints_the_learner_log_and_ctrl_c_or_sigterm_stops_everything(run, sig):
    p = free_ports(3)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,",
                         f"actor,127.0.0.1,{p[2]},,,,"])
    proc = subprocess.Popen(run.frontend_args(csv, "--follow", "--watch_interval_s=1"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.time() + 40
        while time.time() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "fake learner 0 heartbeat 3" in line:
                break
        assert "fake learner 0 heartbeat 3" in "".join(lines), "".join(lines)
        proc.send_signal(sig)
        t0 = time.time()
        rest, _ = proc.communicate(timeout=40)
        print(f"the run stopped {time.time() - t0:.1f} s after {signal.Signals(sig).name}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines) + rest
    assert "stopping the run" in rest and "stopped: no process of this run" in rest, rest
    assert_nothing_left(run)
    assert "clean exit" in run.log("learner_0.log")


def test_follow_restarts_a_failed_learner_job_with_every_actor_until_the_limit(run):
    p = free_ports(3)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,",
                         f"actor,127.0.0.1,{p[2]},,,,"])
    rc, out, err = run.frontend(csv, "--follow", "--watch_interval_s=0.5", "--learner_restarts=1",
                                "--fake_learner_exit_after_s=2", "--fake_learner_exit_code=1")
    assert rc == 1, out + err
    assert "the learners' mpirun exited with status 1 (restart 1/1): restarting the learners on this machine" in out
    assert "from the start (no checkpoint was written yet)" in out  # the fake writes none
    assert "not restarting the learners (restarted 1 time(s) already, --learner_restarts=1)" in out, out
    assert run.log("learner_0.log").count("fake learner 0 pid") == 2
    for i in range(2):  # each actor restarted with the learner list of the new job
        assert run.log(f"actor_{i}.log").count("fake actor %d pid" % i) == 2
    restarts = json.load(open(os.path.join(run.logdir, "learner_restarts.json")))["restarts"]
    assert [r["learners"] for r in restarts] == [[0]] and restarts[0]["resumed"] == ""
    assert "stopped: no process of this run" in out
    assert_nothing_left(run)


def test_follow_ends_when_the_learners_exit(run):
    p = free_ports(2)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"actor,127.0.0.1,{p[1]},,,,"])
    rc, out, err = run.frontend(csv, "--follow", "--watch_interval_s=0.5", "--fake_learner_exit_after_s=2")
    assert rc == 0, out + err
    assert "fake learner 0 exits with status 0" in out  # the learner's log, followed here
    assert "the learners exited (mpirun status 0)" in out
    assert "stopped: no process of this run" in out
    assert_nothing_left(run)


# ---------------------------------------------------------------------------
# remote hosts over SSH
# ---------------------------------------------------------------------------

def _ssh_csv(run, sshd, ports):
    return run.write_csv([f"learner,127.0.0.1,{ports[0]},,,,,",
                          f"actor,{sshd.address},{ports[1]},,{sshd.port},root,,{sshd.client_key}",
                          f"actor,{sshd.address},{ports[2]},,{sshd.port},root,,{sshd.client_key}"],
                         key_column=True)


def test_ssh_actors_start_status_stop(run, sshd):
    run.sshd = sshd
    p = free_ports(3)
    csv = _ssh_csv(run, sshd, p)
    known = f"--ssh_known_hosts={sshd.known_hosts}"
    rc, out, err = run.frontend(csv, known)
    assert rc == 0, out + err
    assert f"started 2 actor(s) on root@{sshd.address} port {sshd.port}" in out
    # the actors live in a tmux session of the "remote" host's own tmux server, not the local one
    assert sorted(run.windows(remote=True)) == ["actor_0", "actor_1"]
    assert run.windows() == ["learners"]
    # the SSH connection is closed (the frontend exited), the workers run on
    wait_for(lambda: all("heartbeat 2" in run.log(f"actor_{i}.log") for i in range(2)), 30, "actor heartbeats")
    assert f"learner 127.0.0.1:{p[0]}" in run.log("actor_1.log")

    rc, out, err = run.frontend(csv, known, "--action=status")
    assert rc == 0, out + err
    assert re.search(rf"actor 1\s+alive \(pid \d+\)\s+{sshd.address}:{p[2]} -> learner 0\s+on root@{sshd.address}", out)

    rc, out, err = run.frontend(csv, known, "--action=stop")
    assert rc == 0, out + err
    assert f"root@{sshd.address} port {sshd.port}: sent SIGINT to 2 worker(s)" in out, out
    assert_nothing_left(run)
    assert "clean exit" in run.log("actor_0.log") and "clean exit" in run.log("actor_1.log")


def test_ssh_remote_learner_via_mpirun(run, sshd):
    """Learner 1 on the "remote" host: mpirun starts it with ssh and the CSV's ssh columns."""
    run.sshd = sshd
    p = free_ports(4)
    key = sshd.client_key
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,,", f"learner,{sshd.address},{p[1]},,{sshd.port},root,,{key}",
                         f"actor,127.0.0.1,{p[2]},,,,,", f"actor,{sshd.address},{p[3]},,{sshd.port},root,,{key}"],
                        key_column=True)
    known = f"--ssh_known_hosts={sshd.known_hosts}"
    rc, out, err = run.frontend(csv, known)
    assert rc == 0, out + err
    assert f"-H 127.0.0.1:1,{sshd.address}:1" in out and f"-p {sshd.port} -l root" in out
    wait_for(lambda: "heartbeat 2" in run.log("learner_1.log") and "heartbeat 2" in run.log("actor_1.log"),
             30, "heartbeats of the remote learner and actor")
    assert f"fake learner 1 pid" in run.log("learner_1.log")
    assert f"learner {sshd.address}:{p[1]}" in run.log("learner_1.log")
    assert f"learner {sshd.address}:{p[1]}" in run.log("actor_1.log")
    assert any("orted" in line for line in run.sshd_descendants())  # rank 1 really came through sshd

    rc, out, err = run.frontend(csv, known, "--action=status")
    assert rc == 0, out + err
    assert "learner processes found: 2/2" in out and "2/2 actors alive" in out

    rc, out, err = run.frontend(csv, known, "--action=stop")
    assert rc == 0, out + err
    assert_nothing_left(run)
    assert "clean exit" in run.log("learner_1.log") and "clean exit" in run.log("actor_1.log")


def test_ssh_unknown_host_key_is_rejected_unless_opted_out(run, sshd):
    run.sshd = sshd
    csv = _ssh_csv(run, sshd, free_ports(3))
    empty = os.path.join(run.dir, "empty_known_hosts")
    open(empty, "w").close()
    rc, out, err = run.frontend(csv, f"--ssh_known_hosts={empty}")
    assert rc == 2, out + err
    assert f"root@{sshd.address} port {sshd.port}: its SSH host key (ssh-ed25519 SHA256:" in err, err
    assert f"is not in {empty}" in err and "--ssh_insecure_ignore_host_keys" in err
    assert f"ssh-keyscan -p {sshd.port} {sshd.address}" in err
    assert_nothing_left(run)

    rc, out, err = run.frontend(csv, f"--ssh_known_hosts={empty}", "--ssh_insecure_ignore_host_keys", "--dry_run")
    assert rc == 0, out + err
    assert "WARNING: --ssh_insecure_ignore_host_keys: SSH host keys are NOT checked" in err
    assert os.path.getsize(empty) == 0  # the unchecked key was not saved either


def test_ssh_changed_host_key_is_rejected(run, sshd):
    run.sshd = sshd
    csv = _ssh_csv(run, sshd, free_ports(3))
    wrong = os.path.join(run.dir, "wrong_known_hosts")
    with open(sshd.client_key + ".pub") as f:  # some other ed25519 key, filed under this host
        key_type, key_b64 = f.read().split()[:2]
    with open(wrong, "w") as f:
        f.write(f"[{sshd.address}]:{sshd.port} {key_type} {key_b64}\n")
    rc, out, err = run.frontend(csv, f"--ssh_known_hosts={wrong}", "--dry_run")
    assert rc == 2 and "differs from the one in" in err, err
    assert_nothing_left(run)


def test_ssh_login_failure_is_one_clear_error(run, sshd):
    run.sshd = sshd
    p = free_ports(3)
    other_key = os.path.join(run.dir, "not_authorized")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other_key], check=True)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,,",
                         f"actor,{sshd.address},{p[1]},,{sshd.port},root,,{other_key}"], key_column=True)
    rc, out, err = run.frontend(csv, f"--ssh_known_hosts={sshd.known_hosts}")
    assert rc == 2, out + err
    assert f"workers.csv:3: root@{sshd.address} port {sshd.port}: SSH login failed" in err, err
    assert_nothing_left(run)


# ---------------------------------------------------------------------------
# the real experiment.py: 2 Horovod learners + 4 actors from a CSV
# ---------------------------------------------------------------------------

@pytest.mark.slow  # the default suite has test_ssh_* (SSH actors, an mpirun learner)
def test_end_to_end_two_learners_four_actors(run, user_module):
    """About 25 s on 2 cores. The env is a user's, registered by a
    module outside the repository (--env_module, found through the PYTHONPATH the frontend hands
    to every worker)."""
    p = free_ports(6)
    csv = run.write_csv([f"learner,127.0.0.1,{p[0]},,,,", f"learner,127.0.0.1,{p[1]},,,,"] +
                        [f"actor,127.0.0.1,{port},,,," for port in p[2:]])
    args = [f"--workers_csv_path={csv}", f"--tmux_socket={run.socket}", f"--tmux_sess={run.session}",
            f"--logdir={run.logdir}", "--stop_timeout_s=60",
            "--env_module=" + MODULE, "--level_name=UserCorridor-v0", "--agent_name=MLPAgent", "--batch_size=4",
            "--unroll_length=20", "--envs_per_actor=2", "--log_every_s=1", "--total_environment_frames=100000000"]
    p_start = subprocess.run([PY, FRONTEND, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p_start.returncode == 0, p_start.stdout + p_start.stderr

    def frames():  # "[learner 0] frames 6.40K/100.00M ..." -> 6400.0
        scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}
        return [float(x) * scale[u] for x, u in
                re.findall(r"\[learner 0\] frames ([\d.]+)([KMG]?)/", run.log("learners.log"))]
    def progress():
        if "learners (mpirun) exited" in run.log("learners.log"):  # fail now, not at the timeout
            raise AssertionError("the learners exited:\n" + run.log("learners.log")[-3000:])
        return len([f for f in frames() if f > 0]) >= 2
    wait_for(progress, 240, "two progress lines of learner 0")
    assert frames()[-1] > frames()[0] >= 0  # training advances
    assert "[learner 1" in run.log("learners.log")
    assert "UserCorridor-v0" in run.log("actor_3.log")

    status = subprocess.run([PY, FRONTEND, *args[:4], "--action=status"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "learner processes found: 2/2" in status.stdout and "4/4 actors alive" in status.stdout

    stop = subprocess.run([PY, FRONTEND, *args[:4], "--action=stop", "--stop_timeout_s=60"], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "sent SIGINT to 6 worker(s)" in stop.stdout
    assert_nothing_left(run)
    # SIGINT reached the learners (rank 0 checkpointed) and the actors (clean exits)
    assert re.search(r"\[learner 0\] stopped by signal 2 after \d+ frames .*checkpoint \S+ckpt-\d+",
                     run.log("learner_0.log")), run.log("learner_0.log")[-2000:]
    assert "[learner 1] stopped by signal 2" in run.log("learner_1.log")
    for i in range(4):
        assert f"actor {i} exited with status 0" in run.log(f"actor_{i}.log"), run.log(f"actor_{i}.log")[-2000:]
