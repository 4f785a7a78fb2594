"""A throw-away one-node Slurm for the tests: Debian's munged, slurmctld and slurmd, started as root
with every file (munge key and socket, slurm.conf, state, spool, logs, pid files) in one folder and
their own ports, and stopped again, so nothing of it outlives the test.

The node is this machine under its hostname. It declares more CPUs than the machine has
(SlurmdParameters=config_overrides), so a job of a learner and several actors fits on 2 cores as the
local cluster does. proctrack/linuxproc and task/none need no cgroups or systemd. KillWait gives a
stopped job's processes time to write their checkpoint between SIGTERM and SIGKILL.
"""
import os
import shutil
import signal
import socket
import subprocess
import time

PACKAGES = {"slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd", "slurm-client": "/usr/bin/sbatch",
            "munge": "/usr/sbin/munged"}
NODE_CPUS = 8
KILL_WAIT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_missing():
    """apt-get installs the Slurm and munge packages that are not there (the docker tests do the same
    for Docker); '' or why it cannot."""
    missing = [pkg for pkg, path in PACKAGES.items() if not os.path.exists(path)]
    if not missing:
        return ""
    if os.geteuid() != 0:
        return "the Slurm tests need %s (apt-get install %s) or root" % (", ".join(missing), " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600, env=env)
    p = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing,
                       capture_output=True, text=True, timeout=900, env=env)
    return "" if p.returncode == 0 else "apt-get install %s failed: %s" % (" ".join(missing), p.stderr[-1000:])


class Slurm:
    """start() -> self; env: the environment for sbatch/squeue/scancel (SLURM_CONF); stop() always."""

    def __init__(self, root):
        self.root = root
        self.node = socket.gethostname()
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=os.path.join(root, "slurm.conf"))

    def path(self, *names):
        return os.path.join(self.root, *names)

    def start(self):
        for d in ("state", "spool", "logs"):
            os.makedirs(self.path(d), exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", self.path("slurm.conf")], "slurmctld.log")
        self._spawn(["/usr/sbin/slurmd", "-D", "-N", self.node, "-f", self.path("slurm.conf")], "slurmd.log")
        self._wait_idle(60)
        return self

    def _start_munge(self):
        with open(self.path("munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(self.path("munge.key"), 0o400)
        os.chmod(self.root, 0o755)  # munged refuses a socket folder that others can write to
        self._spawn(["/usr/sbin/munged", "--foreground", "--force", "--key-file", self.path("munge.key"),
                     "--socket", self.path("munge.sock"), "--pid-file", self.path("munged.pid"),
                     "--log-file", self.path("logs", "munged.log"), "--seed-file", self.path("munge.seed")],
                    "munged.out")
        deadline = time.time() + 20
        while not os.path.exists(self.path("munge.sock")):
            if time.time() > deadline:
                raise RuntimeError("munged did not start:\n" + self.log("munged.out") + self.log("munged.log"))
            time.sleep(0.1)

    def _write_conf(self):
        lines = [
            "ClusterName=impalatest", "SlurmctldHost=%s(127.0.0.1)" % self.node, "SlurmUser=root",
            "SlurmctldPort=%d" % free_port(), "SlurmdPort=%d" % free_port(),
            "AuthType=auth/munge", "CredType=cred/munge", "AuthInfo=socket=%s" % self.path("munge.sock"),
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides",
            "StateSaveLocation=%s" % self.path("state"), "SlurmdSpoolDir=%s" % self.path("spool"),
            "SlurmctldPidFile=%s" % self.path("slurmctld.pid"), "SlurmdPidFile=%s" % self.path("slurmd.pid"),
            "SlurmctldLogFile=%s" % self.path("logs", "slurmctld.log"),
            "SlurmdLogFile=%s" % self.path("logs", "slurmd.log"),
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2", "KillWait=%d" % KILL_WAIT_S, "InactiveLimit=0", "MinJobAge=600",
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d RealMemory=1000 State=UNKNOWN" % (self.node, NODE_CPUS),
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        ]
        with open(self.path("slurm.conf"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, cmd, log):
        out = open(self.path("logs", log), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def _wait_idle(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
            if p.returncode == 0 and p.stdout.strip() == "idle":
                return
            dead = [c for c in self.procs if c.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        raise RuntimeError("the Slurm node did not become idle:\n" + "\n".join(
            self.log(n)[-1500:] for n in ("slurmctld.log", "slurmd.log")))

    def run(self, *cmd, timeout=60):
        return subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout)

    def job_state(self, job_id):
        """squeue's state of a running or pending job; sacct is not there without accounting, so a
        finished job is read from scontrol while MinJobAge keeps it."""
        p = self.run("scontrol", "show", "job", str(job_id))
        for word in p.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "GONE"

    def job_exit_code(self, job_id):
        p = self.run("scontrol", "show", "job", str(job_id))
        for word in p.stdout.split():
            if word.startswith("ExitCode="):
                return word.split("=", 1)[1]
        return None

    def log(self, name):
        path = self.path("logs", name)
        return open(path).read() if os.path.exists(path) else ""

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self._kill_step_daemons()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_step_daemons(self):
        """slurmd's step daemons of a job a failed test never cancelled outlive slurmd: those of
        this Slurm (their SLURM_CONF is in our folder) are killed."""
        conf = "SLURM_CONF=" + self.path("slurm.conf")
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                with open("/proc/%d/comm" % pid) as f:
                    if f.read().strip() != "slurmstepd":
                        continue
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if conf.encode() not in f.read().split(b"\0"):
                        continue
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone meanwhile, or not ours to read
                continue
