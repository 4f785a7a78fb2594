"""The frontend on several real hosts: network namespaces with their own PID namespace,
/tmp, hostname and sshd (tests/netns_fixture.py), joined by a bridge.

Learners on two hosts (mpirun over SSH from this machine), actors on three. The run
folder and the repository are on the shared file system (/var/tmp here, as an NFS home
would be); each host's /tmp, processes and tmux servers are its own. Needs root.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

import netns_fixture
from test_frontend import FAKE_EXPERIMENT, kill_naming, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRONTEND = os.path.join(ROOT, "run_experiment_mm_raw.py")
PY = sys.executable
LEARNER_PORTS = (8001, 8002)


class Cluster:
    """One test's rig and run: hosts, CSV, frontend command line; torn down after."""

    def __init__(self, n_hosts):
        self.tag = uuid.uuid4().hex[:8]
        self.dir = f"/var/tmp/impala_test_mh_{self.tag}"  # shared by all hosts (not /tmp)
        self.rig = netns_fixture.Hosts(n_hosts, os.path.join(self.dir, "rig"))
        self.socket, self.session = f"impala_test_{self.tag}", f"t_{self.tag}"
        self.logdir = os.path.join(self.dir, "run")
        self.script = os.path.join(self.dir, "fake_experiment.py")
        with open(self.script, "w") as f:
            f.write(FAKE_EXPERIMENT)

    def write_csv(self, learners, actors):
        """learners/actors: host indices (0-based) of each row."""
        key = self.rig.client_key
        rows = ["job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password,ssh_key_file"]
        rows += [f"learner,{self.rig.hosts[h].ip},{LEARNER_PORTS[r]},,22,root,,{key}" for r, h in enumerate(learners)]
        rows += [f"actor,{self.rig.hosts[h].ip},{9001 + i},,22,root,,{key}" for i, h in enumerate(actors)]
        self.csv = os.path.join(self.dir, "workers.csv")
        with open(self.csv, "w") as f:
            f.write("\n".join(rows) + "\n")

    def args(self, *extra, fake=True):
        return [PY, FRONTEND, f"--workers_csv_path={self.csv}", f"--tmux_socket={self.socket}",
                f"--tmux_sess={self.session}", f"--logdir={self.logdir}", "--stop_timeout_s=30",
                f"--ssh_known_hosts={self.rig.known_hosts}",
                f"--mpi_args=-mca oob_tcp_if_include {self.rig.subnet} -mca btl_tcp_if_include {self.rig.subnet}",
                *([f"--experiment_script={self.script}"] if fake else []), *extra]

    def frontend(self, *extra, fake=True, timeout=120):
        p = subprocess.run(self.args(*extra, fake=fake), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def log(self, name):
        path = os.path.join(self.logdir, "logs", name)
        return open(path).read() if os.path.exists(path) else ""

    def tails(self, *names, chars=4000):
        """The ends of the named logs, for a failure's message."""
        return "\n".join(f"--- {name} (last {chars} characters)\n{self.log(name)[-chars:]}" for name in names)

    def worker_pid(self, host, needle):
        """pid (in host's PID namespace) of the python worker whose command line has needle."""
        for line in host.ssh("ps -e -o pid=,args=", check=True).stdout.splitlines():
            pid, args = line.split(None, 1)
            if needle in args and "python" in args.split()[0]:
                return int(pid)
        raise AssertionError(f"no worker with {needle!r} on {host.name}")

    def local_tmux_sessions(self):
        p = subprocess.run(["tmux", "-L", self.socket, "ls"], capture_output=True, text=True)
        return p.stdout.split() if p.returncode == 0 else []

    def assert_nothing_left(self):
        assert self.local_tmux_sessions() == []
        for h in self.rig.hosts:
            assert h.processes() == [], h.name  # no worker, orted or tmux server left on any host
            assert h.ssh(f"tmux -L {self.socket} ls").returncode != 0, h.name

    def cleanup(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        kill_naming(self.dir)  # mpirun and its ssh, left waiting on a host the rig is about to remove
        sock = os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", self.socket)
        if os.path.exists(sock):
            os.unlink(sock)
        try:
            self.rig.stop()  # kills every process on the hosts with their PID namespaces
        finally:
            left = self.rig.leftovers()
            shutil.rmtree(self.dir, ignore_errors=True)
            assert left == [], f"the rig left {left}"


def _cluster(n):
    reason = netns_fixture.available()
    if reason:
        pytest.skip(reason)
    c = Cluster(n)
    try:
        c.rig.start()
    except BaseException:
        c.cleanup()
        raise
    return c


@pytest.fixture
def cluster3():
    c = _cluster(3)
    yield c
    c.cleanup()


# ---------------------------------------------------------------------------
# the rig itself
# ---------------------------------------------------------------------------

def test_rig_hosts_are_apart_and_bridged_with_and_without_docker_forward_drop(cluster3):
    """Own PID namespace, /tmp and hostname per host; bridged TCP between hosts works even
    when FORWARD's policy is DROP with br_netfilter loaded (what installing docker.io does)."""
    h1, h2, h3 = cluster3.rig.hosts
    assert h1.ssh("hostname", check=True).stdout.strip() == "h1"
    h1.ssh("touch /tmp/only_on_h1 && (sleep 30 >/dev/null 2>&1 &)", check=True)
    assert h1.ssh("test -e /tmp/only_on_h1").returncode == 0
    assert h2.ssh("test -e /tmp/only_on_h1").returncode != 0 and not os.path.exists("/tmp/only_on_h1")
    assert any(p.startswith("sleep 30") for p in h1.processes()) and h2.processes() == []
    assert cluster3.rig.tcp_ok(h1, h2.ip, 22) and cluster3.rig.tcp_ok(h3, h1.ip, 22)

    if shutil.which("modprobe"):  # may be built in, or loaded already (it is when Docker ran)
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
    nf = "/proc/sys/net/bridge/bridge-nf-call-iptables"
    if not os.path.exists(nf):
        pytest.skip("br_netfilter is not available on this kernel")
    old_nf = open(nf).read().strip()
    old_policy = re.search(r"-P FORWARD (\w+)", netns_fixture.sh("iptables", "-w", "-S", "FORWARD").stdout).group(1)
    try:
        with open(nf, "w") as f:
            f.write("1")
        netns_fixture.sh("iptables", "-w", "-P", "FORWARD", "DROP")
        assert cluster3.rig.tcp_ok(h1, h2.ip, 22), "the rig's ACCEPT rules did not let bridged traffic through"
        for chain, rule in cluster3.rig.forward_rules:  # without them, the same path is dropped
            netns_fixture.sh("iptables", "-w", "-D", chain, *rule)
        cluster3.rig.forward_rules = []
        assert not cluster3.rig.tcp_ok(h1, h2.ip, 22, timeout=2)
        cluster3.rig.allow_forwarding()
        assert cluster3.rig.tcp_ok(h2, h3.ip, 22)
    finally:
        netns_fixture.sh("iptables", "-w", "-P", "FORWARD", old_policy)
        with open(nf, "w") as f:
            f.write(old_nf)


# ---------------------------------------------------------------------------
# the frontend on three hosts (fake workers: seconds)
# ---------------------------------------------------------------------------

@pytest.mark.slow  # the default suite builds the namespace hosts (test_rig_*)
def test_three_hosts_start_status_kill_restart_cut_a_host_kill_a_remote_rank_stop(cluster3):
    c = cluster3
    h1, h2, h3 = c.rig.hosts
    c.write_csv(learners=[0, 1], actors=[0, 1, 2, 2])  # actor i feeds learner i % 2
    rc, out, err = c.frontend()
    assert rc == 0, out + err
    assert f"-H {h1.ip}:1,{h2.ip}:1" in out
    assert re.search(r"reachability: 4 actor-host -> learner pair\(s\) connect", out), out
    wait_for(lambda: all("heartbeat 2" in c.log(f"actor_{i}.log") for i in range(4)) and
             all("heartbeat 2" in c.log(f"learner_{r}.log") for r in range(2)), 30, "heartbeats")
    # each worker runs on its own host, in that host's process table
    assert any("--job_name=learner" in p for p in h2.processes())
    assert any("--task=3" in p for p in h3.processes()) and not any("--task=3" in p for p in h1.processes())

    rc, out, err = c.frontend("--action=status")
    assert rc == 0, out + err
    assert "learner processes found: 2/2" in out and "4/4 actors alive" in out, out

    # kill -9 an actor on h3: watch restarts it
    h3.ssh(f"kill -9 {c.worker_pid(h3, '--task=2')}", check=True)
    t0 = time.time()
    rc, out, err = c.frontend("--action=watch", "--max_restarts=1", "--watch_interval_s=0.5", "--watch_timeout_s=3")
    assert rc == 0, out + err
    assert f"actor 2 on root@{h3.ip} port 22 was dead (exit status 137); restarted it (1/1)" in out, out
    wait_for(lambda: c.log("actor_2.log").count("fake actor 2 pid") == 2, 20, "actor 2 to run again")
    print(f"actor 2 restarted and running again {time.time() - t0:.1f} s after the watch started")

    _cut_the_actor_host_and_bring_it_back(c)

    # kill -9 the remote learner rank on h2: mpirun ends the job, which stays ended with restarts
    # off (test_a_killed_rank_* below restarts it); stop leaves nothing anywhere
    h2.ssh(f"kill -9 {c.worker_pid(h2, '--job_name=learner')}", check=True)
    rc, out, err = c.frontend("--action=watch", "--watch_interval_s=0.5", "--watch_timeout_s=30",
                              "--learner_restarts=0")
    assert "the learners exited (mpirun status" in out, out + err
    assert "not restarting the learners" in out, out
    rc, out, err = c.frontend("--action=stop")
    assert rc == 0, out + err
    assert "stopped: no process of this run" in out
    c.assert_nothing_left()


def _cut_the_actor_host_and_bring_it_back(c):
    """h3 loses its network: its two actors keep running there but nobody hears them, so the watch
    starts them on h1 and h2 (one each: the fewest actors first); when h3 is back, its copies are
    ended, so each actor runs once again; status tells the history."""
    h1, h2, h3 = c.rig.hosts
    watch = subprocess.Popen(c.args("--action=watch", "--watch_interval_s=1", "--actor_host_lost_s=5",
                                    "--ssh_timeout_s=3"),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(2)
        t_cut = time.time()
        h3.cut()
        wait_for(lambda: c.log("actor_2.log").count("fake actor 2 pid") == 3 and
                 c.log("actor_3.log").count("fake actor 3 pid") == 2, 40, "actors 2 and 3 to start elsewhere")
        moved_s = time.time() - t_cut
        assert any("--task=2" in p for p in h1.processes()) and any("--task=3" in p for p in h2.processes())
        h3.heal()
        wait_for(lambda: not any("--task=" in p for p in h3.processes()), 30, "h3's stale actors to end")
        healed_s = time.time() - t_cut
        time.sleep(1.5)  # the watch's next poll: its lines about the ended copies
    finally:
        watch.send_signal(signal.SIGINT)  # Ctrl-C ends the watching; the workers keep running
        out = watch.communicate(timeout=60)[0]
    print(out)
    print(f"actors 2 and 3 ran again {moved_s:.1f} s after h3 was cut; its copies ended {healed_s:.1f} s after")
    assert f"actor host lost: root@{h3.ip} port 22 has not answered for" in out, out
    assert f"actor 2 moved from root@{h3.ip} port 22 to root@{h1.ip} port 22" in out, out
    assert f"actor 3 moved from root@{h3.ip} port 22 to root@{h2.ip} port 22" in out, out
    assert f"actor 2: ended its stale copy on root@{h3.ip} port 22" in out, out
    assert "restarted" not in out, out  # a moved actor is not also respawned where it was

    rc, out, err = c.frontend("--action=status")
    assert rc == 0, out + err
    assert "4/4 actors alive" in out, out
    assert re.search(rf"actor 3 +alive .* moved here from {re.escape(h3.ip)}:9004 .* on root@{re.escape(h2.ip)} port 22",
                     out), out
    assert "actors moved off lost hosts (2;" in out, out


# ---------------------------------------------------------------------------
# a learner rank killed, a learner host cut and healed (the real experiment.py)
# ---------------------------------------------------------------------------

def _metrics_frames(c):
    import csv
    path = os.path.join(c.logdir, "metrics.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [float(r["frames"]) for r in csv.DictReader(f) if r.get("frames")]


def _restarts(c):
    import json
    path = os.path.join(c.logdir, "learner_restarts.json")
    try:
        with open(path) as f:
            return [r["learners"] for r in json.load(f)["restarts"]]
    except (OSError, ValueError):
        return []


def _trains_past(c, frames, timeout, what):
    """Waits until rank 0's metrics.csv passes `frames` frames; returns the newest count."""
    wait_for(lambda: (_metrics_frames(c) or [0])[-1] > frames, timeout, what)
    return _metrics_frames(c)[-1]


def _resumed_and_training(c, n):
    """Rank 0 resumed for the n-th time and has printed a progress line since."""
    log = c.log("learner_0.log")
    return log.count("] resumed from ") >= n and "[learner 0] frames " in log.rsplit("] resumed from ", 1)[-1]


@pytest.mark.slow
def test_a_killed_rank_and_a_cut_learner_host_restart_the_learners_and_the_run_goes_on(cluster3):
    """Ranks on h1 and h2. kill -9 of rank 1: mpirun ends the job, the watch restarts both ranks from
    the newest checkpoint. h2 cut off: rank 0 waits in an allreduce; after --learner_host_lost_s the
    job restarts on h1 alone (h2's actor moves to h3). h2 back: its stale rank is ended and the job
    grows back to two ranks. The frame counter never steps back and every actor is fed throughout."""
    c = cluster3
    h1, h2, h3 = c.rig.hosts
    c.write_csv(learners=[0, 1], actors=[0, 1, 2, 2])
    run = ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=4", "--unroll_length=20",
           "--envs_per_actor=4", "--log_every_s=1", "--checkpoint_every_s=2", "--total_environment_frames=50000000"]
    follow = subprocess.Popen(c.args(*run, "--follow", "--watch_interval_s=1", "--learner_host_lost_s=6",
                                     "--actor_host_lost_s=6", "--ssh_timeout_s=3", fake=False),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    times = {}
    try:
        frames = _trains_past(c, 10000, 180, "the first 10K frames")
        h2.ssh(f"kill -9 {c.worker_pid(h2, '--job_name=learner')}", check=True)
        t = time.time()
        wait_for(lambda: len(_restarts(c)) == 1, 60, "the learners' restart after rank 1 was killed")
        wait_for(lambda: _resumed_and_training(c, 1), 120, "training again after the restart")
        times["rank killed -> training"] = time.time() - t

        t = time.time()
        h2.cut()
        wait_for(lambda: len(_restarts(c)) == 2, 60, "the learners' restart without h2")
        wait_for(lambda: _resumed_and_training(c, 2), 120, "training on h1 alone")
        times["h2 cut -> training on 1 rank"] = time.time() - t

        t = time.time()
        h2.heal()
        wait_for(lambda: len(_restarts(c)) == 3, 90, "the learners growing back to h2")
        wait_for(lambda: _resumed_and_training(c, 3), 120, "training on two ranks again")
        times["h2 healed -> training on 2 ranks"] = time.time() - t
    finally:
        follow.send_signal(signal.SIGINT)  # --follow: Ctrl-C stops the whole run
        out = follow.communicate(timeout=180)[0]
    print(out)
    print(times)
    assert _restarts(c) == [[0, 1], [0], [0, 1]], out
    assert "the learners' mpirun exited with status" in out and "(restart 1/3)" in out, out
    assert f"learner host root@{h2.ip} port 22 has not answered for" in out, out
    assert f"learner host root@{h2.ip} port 22 answers again" in out, out
    assert out.count("resuming from the newest checkpoint in") == 3, out
    seen = _metrics_frames(c)
    assert seen == sorted(seen), seen  # rows past a restart's checkpoint were removed: one curve
    learner0 = c.log("learner_0.log")
    assert learner0.count("] resumed from ") == 3, learner0
    assert "[learner 0/1] serving" in learner0 and "[learner 1/2] serving" in c.log("learner_1.log")
    assert "stopped: no process of this run" in out, out
    c.assert_nothing_left()


# ---------------------------------------------------------------------------
# a firewall between two hosts (the real experiment.py)
# ---------------------------------------------------------------------------

@pytest.mark.slow  # the default suite builds the namespace hosts (test_rig_*)
def test_a_firewall_is_reported_and_a_healed_30_s_partition_is_outlived(cluster3):
    c = cluster3
    h1, h2, h3 = c.rig.hosts
    c.write_csv(learners=[0], actors=[1, 2])
    # h1 drops its learner port for packets from h2 (h3 and h1 itself still get through)
    h1.netns_run("iptables", "-w", "-I", "INPUT", "-s", h2.ip, "-p", "tcp", "--dport", str(LEARNER_PORTS[0]),
                 "-j", "DROP")
    t0 = time.time()
    rc, out, err = c.frontend("--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=4",
                              "--unroll_length=20", "--envs_per_actor=2", "--log_every_s=3", "--actor_timeout_s=10",
                              "--total_environment_frames=100000000", fake=False, timeout=180)
    took = time.time() - t0
    expected = (f"error: actor host root@{h2.ip} port 22 cannot open a TCP connection to learner 0 at {h1.ip} "
                f"port {LEARNER_PORTS[0]} (actors 0 feed it): no answer within 3 s")
    assert rc == 1 and expected in out, out + err
    assert f"actor host root@{h3.ip}" not in out  # only the blocked pair
    after = float(re.search(r"found ([\d.]+) s after the learners started", out).group(1))
    print(f"the frontend named the blocked pair {took:.1f} s after it was started, {after:.1f} s after mpirun")
    assert after < 30, out
    assert took < 60, f"the frontend took {took:.0f} s"

    # the actor on h2 says so itself; the one on h3 connects
    msg = f"actor: cannot reach learner {h1.ip}:{LEARNER_PORTS[0]} for 10 s: is the port open from this host (h2)?"
    wait_for(lambda: msg in c.log("actor_0.log"), 60, "actor 0's message")
    wait_for(lambda: "connected to learner" in c.log("actor_1.log"), 60, "actor 1 to connect")
    rc, out, err = c.frontend("--action=status", fake=False)
    assert rc == 1, out + err
    assert re.search(rf"actor 0 .*\n\s+NOT CONNECTED to learner {h1.ip}:{LEARNER_PORTS[0]}: .*cannot reach", out), out
    assert "2/2 actors alive, 1 of them not connected" in out

    # the partition heals: actor 0 connects and its learner hears it; then a 30 s partition mid-run,
    # which the learner notices and the actor outlives (it retries for --actor_reconnect_timeout_s)
    rule = ["INPUT", "-s", h2.ip, "-p", "tcp", "--dport", str(LEARNER_PORTS[0]), "-j", "DROP"]
    h1.netns_run("iptables", "-w", "-D", *rule)
    wait_for(lambda: "actor 0 is sending again" in c.log("learner_0.log"), 90, "the learner to hear actor 0")
    h1.netns_run("iptables", "-w", "-I", *rule)
    wait_for(lambda: "actor 0 has sent nothing for" in c.log("learner_0.log"), 30, "the learner to miss actor 0")
    time.sleep(20)
    h1.netns_run("iptables", "-w", "-D", *rule)
    t0 = time.time()
    # 22-24 s measured with the cores kept busy; once, in CI beside the other test worker, over 90 s
    # (a failure's message carries both logs' ends).
    wait_for(lambda: c.log("learner_0.log").count("actor 0 is sending again") == 2, 180, "actor 0 to send again",
             show=lambda: c.tails("actor_0.log", "learner_0.log"))
    print(f"actor 0 delivered again {time.time() - t0:.1f} s after a 30 s partition healed")
    rc, out, err = c.frontend("--action=status", fake=False)
    assert rc == 0 and "2/2 actors alive" in out, out + err

    rc, out, err = c.frontend("--action=stop", fake=False, timeout=120)
    assert rc == 0, out + err
    c.assert_nothing_left()


# ---------------------------------------------------------------------------
# a finished run restarts nothing; train_w_load resumes it across hosts (the real experiment.py)
# ---------------------------------------------------------------------------

@pytest.mark.long
def test_finished_run_restarts_nothing_and_train_w_load_resumes_across_hosts(cluster3):
    c = cluster3
    c.write_csv(learners=[0, 1], actors=[1, 2, 2])
    run = ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=4", "--unroll_length=20",
           "--envs_per_actor=4", "--log_every_s=2", "--checkpoint_every_s=5"]
    rc, out, err = c.frontend(*run, "--total_environment_frames=30000", "--follow", "--watch_interval_s=0.5",
                              fake=False, timeout=400)
    assert rc == 0, out + err
    assert "the learners exited (mpirun status 0)" in out, out + err
    assert "restarted" not in out, out  # the actors that exited after their learner finished are done
    first = c.log("learner_0.log")
    frames = int(re.search(r"frame budget reached after (\d+) frames", first).group(1))
    hashes = re.findall(r"final weights sha256 ([0-9a-f]{64})", first + c.log("learner_1.log"))
    assert len(set(hashes)) == 1, hashes  # both ranks, on two hosts, ended with the same weights
    assert os.listdir(os.path.join(c.logdir, "checkpoints"))

    second = os.path.join(c.dir, "run2")
    rc, out, err = c.frontend(*run, f"--logdir={second}", "--mode=train_w_load", f"--load_model_url={c.logdir}",
                              "--total_environment_frames=60000", "--follow", "--watch_interval_s=0.5",
                              fake=False, timeout=400)
    assert rc == 0, out + err
    resumed = open(os.path.join(second, "logs", "learner_0.log")).read()
    assert re.search(rf"\[learner 0\] resumed from .* at {frames} frames", resumed), resumed
    assert re.search(rf"\[learner 1\] resumed from .* at {frames} frames",
                     open(os.path.join(second, "logs", "learner_1.log")).read())
    assert "frame budget reached after" in resumed and "restarted" not in out
    rc, out, err = c.frontend(f"--logdir={second}", "--action=stop", fake=False)
    assert rc == 0, out + err
    c.assert_nothing_left()

