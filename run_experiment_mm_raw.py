"""The cluster frontend: a workers CSV in, a training run started, watched or stopped.

    python run_experiment_mm_raw.py --workers_csv_path=sandbox/local_workers_example.csv \\
        --level_name=CartPole-v1 --agent_name=MLPAgent --batch_size=32 --unroll_length=20
    python run_experiment_mm_raw.py --workers_csv_path=... --action=status   # who is alive
    python run_experiment_mm_raw.py --workers_csv_path=... --action=watch    # restart dead actors
    python run_experiment_mm_raw.py --workers_csv_path=... --action=stop     # end everything
    python run_experiment_mm_raw.py ... --dry_run    # print the plan and every command only

Flags this script does not define are training flags: they go verbatim (as --name=value)
to experiment.py on every worker, after a check that experiment.py accepts them.

`start`, in order:
  1. Check everything: the CSV (workers_csv.py), the training flags, every host (SSH
     login and host key, tmux, python, experiment.py, the tmux session is free, the
     learners' ports are free). Any problem: exit 2 listing all of them; nothing started.
  2. Write the plan to <logdir>/cluster.json.
  3. Start the actors: tmux window `actor_<i>` in session --tmux_sess on the actor's host.
     This machine (127.0.0.1, localhost, its own addresses) gets a local tmux session;
     other hosts get one through SSH, so the workers outlive the SSH connection.
  4. Start all learners with one mpirun (Horovod rank r = the r-th learner row) in the
     local tmux window `learners`.
Each worker's output goes to <logdir>/logs/<job>_<i>.log on its own host (and mpirun's
to logs/learners.log here); `tmux attach -t impala` shows the windows.

`stop` interrupts every worker (SIGINT, as Ctrl-C would: learners write their
checkpoint), waits up to --stop_timeout_s, then kills what is left and closes the tmux
sessions on every host. The run's processes on a host are those under its tmux panes
plus any whose command line holds this run's --learner_hosts/--actor_hosts lists
(e.g. learner ranks that mpirun started on another host).

The same shell snippets run here (bash) and on remote hosts (bash over SSH), so one
code path serves both.
"""
import dataclasses
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

from absl import app
from absl import flags

import paramiko

import workers_csv

HERE = os.path.dirname(os.path.abspath(__file__))
logging.getLogger("paramiko").setLevel(logging.WARNING)  # no per-connection INFO lines

flags.DEFINE_string("workers_csv_path", None, "The workers CSV (see workers_csv.py and sandbox/).")
flags.DEFINE_enum("action", "start", ["start", "stop", "status", "watch"],
                  "start: check, then start actors and learners. stop: end the run's processes and "
                  "tmux sessions on every host. status: which workers are alive. watch: restart dead "
                  "actors (up to --max_restarts each) until the learners exit.")
flags.DEFINE_bool("dry_run", False, "Check everything and print the plan and every command; start nothing.")
flags.DEFINE_bool("follow", False, "After start (or with watch): print the learners' log here and restart "
                                   "dead actors until the learners exit; Ctrl-C stops the whole run.")
flags.DEFINE_string("tmux_sess", "impala", "tmux session name on every host.")
flags.DEFINE_string("tmux_socket", "", "tmux server socket name (tmux -L) on every host; empty: the default server.")
flags.DEFINE_string("logdir", None, "Run directory, also passed to experiment.py. Relative paths are relative "
                                    "to --repo_dir. Default: results/<level_name>_<unix time>.")
flags.DEFINE_string("repo_dir", HERE, "The repository's path, the same on every host (as for mpirun).")
flags.DEFINE_string("python", sys.executable, "Python interpreter for the workers, the same path on every host.")
flags.DEFINE_string("experiment_script", "experiment.py", "Training script, relative to --repo_dir (or absolute).")
flags.DEFINE_bool("check_flags", True, "Before starting, load experiment.py here and let it parse the training "
                                       "flags, so a typo fails now, not on 20 hosts.")
flags.DEFINE_string("mpi_args", "", "Extra mpirun arguments, e.g. '-mca btl_tcp_if_include eth0'.")
flags.DEFINE_string("ssh_known_hosts", "~/.ssh/known_hosts", "known_hosts file checked for every remote host key.")
flags.DEFINE_bool("ssh_insecure_ignore_host_keys", False, "Do not check SSH host keys (unsafe outside a "
                                                          "trusted network).")
flags.DEFINE_float("ssh_timeout_s", 15.0, "SSH connect timeout.")
flags.DEFINE_integer("max_restarts", 3, "watch/--follow: restarts of one dead actor before giving up on it.")
flags.DEFINE_float("watch_interval_s", 10.0, "watch/--follow: seconds between checks of the workers.")
flags.DEFINE_float("watch_timeout_s", 0.0, "watch: stop watching after this many seconds (0: until the "
                                           "learners exit or Ctrl-C).")
flags.DEFINE_float("stop_timeout_s", 60.0, "stop: seconds the workers get to exit after SIGINT before they "
                                           "are killed.")
FLAGS = flags.FLAGS

# experiment.py flags that the frontend sets from the CSV.
RESERVED_FLAGS = ("job_name", "task", "learner_hosts", "actor_hosts", "learner_host")
EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input found before anything was started; exit 2 with this message."""


# ---------------------------------------------------------------------------
# 1. The plan: CSV + training flags -> one command per tmux window
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Window:
    name: str      # tmux window: "actor_<i>" or "learners"
    host: str      # key into the hosts dict: "local" or "user@ip:port"
    argv: list     # the command
    env: dict      # extra environment
    log: str       # the window's log file, on its host
    title: str     # for messages, e.g. "actor 3"


@dataclasses.dataclass
class Plan:
    cluster: workers_csv.Cluster
    training_flags: list
    logdir: str
    windows: list        # actor windows first (started first), then the learners window
    marker: str          # a string only this run's worker command lines contain

    @property
    def actor_windows(self):
        return [w for w in self.windows if w.name != "learners"]

    @property
    def learners_window(self):
        return self.windows[-1]


def host_key(worker) -> str:
    return "local" if worker.is_local else f"{worker.ssh_username}@{worker.ip}:{worker.ssh_port}"


def split_training_flags(args) -> list:
    """The args absl left over -> the training flags for experiment.py, checked for form."""
    problems = []
    for a in args:
        if not a.startswith("--"):
            problems.append(f"{a!r}: training flags must be written --name=value (no separate values, "
                            f"no positional arguments)")
            continue
        name = a[2:].split("=", 1)[0]
        if name in RESERVED_FLAGS or (name.startswith("no") and name[2:] in RESERVED_FLAGS):
            problems.append(f"{a!r}: --{name} is set by the frontend from the workers CSV; remove it")
    if problems:
        raise UsageError("bad command line:\n" + "\n".join("  " + p for p in problems))
    return list(args)


def worker_argv(cluster, job, task, logdir, training_flags) -> list:
    # --learner_hosts/--actor_hosts first and --job_name right after them: the stop and
    # status scripts find the run's processes by that exact text (Plan.marker).
    argv = [FLAGS.python, FLAGS.experiment_script,
            f"--learner_hosts={cluster.learner_hosts}", f"--actor_hosts={cluster.actor_hosts}",
            f"--job_name={job}"]
    if job == "actor":
        argv.append(f"--task={task}")
    return argv + [f"--logdir={logdir}"] + list(training_flags)


def run_marker(cluster) -> str:
    return f"--learner_hosts={cluster.learner_hosts} --actor_hosts={cluster.actor_hosts} --job_name="


def mpirun_argv(cluster, logdir, training_flags) -> list:
    """One mpirun for all learners; rank r serves learner row r.

    A single app context when all learners share CUDA_VISIBLE_DEVICES and their hosts
    come in rank order; else MPMD (one `-np 1 -H host` context per learner, `:`-separated),
    since mpirun hands out ranks by context order.
    """
    learners = cluster.learners
    logs = os.path.join(logdir, "logs")
    # Each rank tees its output to logs/learner_<rank>.log on its host; tee ignores SIGINT
    # (-i) so the rank can still print while it shuts down after Ctrl-C.
    rank_wrapper = ["bash", "-c", 'exec > >(exec tee -ai "$0/learner_${OMPI_COMM_WORLD_RANK}.log") 2>&1; '
                                  'exec "$@"', logs]
    rank_cmd = rank_wrapper + worker_argv(cluster, "learner", None, logdir, training_flags)
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
            "-x", "PYTHONUNBUFFERED=1"]
    remote = [w for w in learners if not w.is_local]
    if remote:
        argv += ["-mca", "plm_rsh_args", mpirun_ssh_args(remote[0])]
    argv += shlex.split(FLAGS.mpi_args)

    hosts = [w.ip for w in learners]
    runs = []  # (host, count) in rank order
    for h in hosts:
        if runs and runs[-1][0] == h:
            runs[-1] = (h, runs[-1][1] + 1)
        else:
            runs.append((h, 1))
    same_env = len({w.cuda_visible_devices for w in learners}) == 1
    if same_env and (not remote or len(runs) == len(set(hosts))):
        argv += ["-np", str(len(learners))]
        if remote:
            argv += ["-H", ",".join(f"{h}:{n}" for h, n in runs)]
        if learners[0].cuda_visible_devices:
            argv += ["-x", f"CUDA_VISIBLE_DEVICES={learners[0].cuda_visible_devices}"]
        return argv + ["-wdir", FLAGS.repo_dir] + rank_cmd
    for r, w in enumerate(learners):
        if r:
            argv.append(":")
        argv += ["-np", "1"]
        if remote:
            argv += ["-H", f"{w.ip}:1"]
        if w.cuda_visible_devices:
            argv += ["-x", f"CUDA_VISIBLE_DEVICES={w.cuda_visible_devices}"]
        argv += ["-wdir", FLAGS.repo_dir] + rank_cmd
    return argv


def mpirun_ssh_args(w) -> str:
    """ssh options for mpirun's remote launch (OpenSSH, key or agent auth only)."""
    opts = ["-p", str(w.ssh_port), "-l", w.ssh_username, "-o", "BatchMode=yes"]
    if w.ssh_key_file:
        opts += ["-i", w.ssh_key_file]
    if FLAGS.ssh_insecure_ignore_host_keys:
        opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    else:
        opts += ["-o", "StrictHostKeyChecking=yes",
                 "-o", f"UserKnownHostsFile={os.path.expanduser(FLAGS.ssh_known_hosts)}"]
    return shlex.join(opts)


def make_plan(cluster, training_flags, logdir) -> Plan:
    windows = []
    logs = os.path.join(logdir, "logs")
    for a in cluster.actors:
        env = {"PYTHONUNBUFFERED": "1"}
        if a.cuda_visible_devices:
            env["CUDA_VISIBLE_DEVICES"] = a.cuda_visible_devices
        windows.append(Window(name=a.name, host=host_key(a), env=env, title=f"actor {a.index}",
                              argv=worker_argv(cluster, "actor", a.index, logdir, training_flags),
                              log=os.path.join(logs, f"{a.name}.log")))
    windows.append(Window(name="learners", host="local", env={}, title="learners (mpirun)",
                          argv=mpirun_argv(cluster, logdir, training_flags),
                          log=os.path.join(logs, "learners.log")))
    return Plan(cluster=cluster, training_flags=list(training_flags), logdir=logdir,
                windows=windows, marker=run_marker(cluster))


def check_plan(cluster) -> None:
    """What the CSV alone cannot know: constraints of mpirun and tmux."""
    problems = []
    for name, value in (("--tmux_sess", FLAGS.tmux_sess), ("--tmux_socket", FLAGS.tmux_socket)):
        if (value or name == "--tmux_sess") and not re.match(r"^[A-Za-z0-9_-]+$", value):
            problems.append(f"{name}={value!r}: use letters, digits, _ and - only")
    remote = [w for w in cluster.learners if not w.is_local]
    if len({(w.ssh_port, w.ssh_username, w.ssh_key_file) for w in remote}) > 1:
        lines = ", ".join(str(w.line) for w in remote)
        problems.append(f"{cluster.path}: remote learners (lines {lines}) differ in ssh_port, ssh_username or "
                        f"ssh_key_file; mpirun takes one set of ssh options, so make them equal")
    for w in remote:
        if w.ssh_password and not w.ssh_key_file:
            print(f"warning: {cluster.path}:{w.line}: mpirun starts remote learners with the ssh client, "
                  f"which does not use ssh_password; it needs key or agent login to {w.ip}", file=sys.stderr)
    if problems:
        raise UsageError("\n".join(problems))


# ---------------------------------------------------------------------------
# 2. Training flags: let experiment.py itself parse them (in a child process)
# ---------------------------------------------------------------------------

_FLAG_CHECK = r"""
import importlib.util, json, sys
script, mode, argvs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spec = importlib.util.spec_from_file_location("experiment", script)
module = importlib.util.module_from_spec(spec)
sys.modules["experiment"] = module
spec.loader.exec_module(module)          # defines the flags; main() does not run
from absl import flags
F = flags.FLAGS
if mode == "names":
    print(json.dumps({"names": sorted(F)}))
    sys.exit(0)
for argv in argvs:
    F.unparse_flags()
    try:
        F([script] + argv)
        # experiment.py's own checks that need imports (env id, agent name), if it has them
        if getattr(module, "validate_run", None) and ("mode" not in F or F["mode"].value == "train"):
            module.validate_run()
    except Exception as e:  # flags.Error, experiment.UsageError
        print(json.dumps({"error": str(e)}))
        sys.exit(0)
print(json.dumps({"ok": True, "level_name": F["level_name"].value if "level_name" in F else None}))
"""


def _run_flag_check(mode, argvs, repo_dir, python, script, timeout=180):
    path = script if os.path.isabs(script) else os.path.join(repo_dir, script)
    if not os.path.isfile(path):
        raise UsageError(f"--experiment_script: {path} does not exist")
    p = subprocess.run([python, "-c", _FLAG_CHECK, path, mode, json.dumps(argvs)], cwd=repo_dir,
                       capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    try:
        return json.loads(last)
    except ValueError:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        raise UsageError(f"could not load {path} to check the training flags (exit {p.returncode}):\n{tail}\n"
                         f"(--nocheck_flags skips this check)") from None


def experiment_flag_names(repo_dir=HERE, python=sys.executable, script="experiment.py") -> set:
    """Every flag name experiment.py accepts (its own, its modules', absl's)."""
    return set(_run_flag_check("names", [], repo_dir, python, script)["names"])


def check_training_flags(cluster, training_flags):
    """Raise UsageError unless experiment.py parses the learner and actor command lines.
    Returns experiment.py's level_name (for the default logdir)."""
    common = [f"--learner_hosts={cluster.learner_hosts}", f"--actor_hosts={cluster.actor_hosts}"] + training_flags
    argvs = [common + ["--job_name=learner"], common + ["--job_name=actor", "--task=0"]]
    result = _run_flag_check("check", argvs, FLAGS.repo_dir, FLAGS.python, FLAGS.experiment_script)
    if "error" in result:
        raise UsageError(f"{FLAGS.experiment_script} rejects the training flags: {result['error']}")
    return result.get("level_name")


def default_logdir(training_flags, level_name) -> str:
    for f in training_flags:
        if f.startswith("--level_name="):
            level_name = f.split("=", 1)[1]
    level = re.sub(r"[^A-Za-z0-9_.-]+", "-", level_name or "run")  # ALE/Pong-v5 -> ALE-Pong-v5
    return os.path.join("results", f"{level}_{int(time.time())}")


# ---------------------------------------------------------------------------
# 3. Hosts: run a bash script here or over SSH
# ---------------------------------------------------------------------------

class HostError(Exception):
    """A host could not be reached or refused us; the message says why and what to do."""


class LocalHost:
    key = "local"
    label = "this machine"

    def run(self, script, timeout=120.0):
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def close(self):
        pass


class UnknownHostKey(Exception):
    def __init__(self, key):
        super().__init__()
        self.key = key


class RejectUnknownHostKey(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(key)


class AcceptHostKeyWithoutSaving(paramiko.MissingHostKeyPolicy):  # --ssh_insecure_ignore_host_keys
    def missing_host_key(self, client, hostname, key):
        pass


class RemoteHost:
    """A host reached with paramiko. Key login is preferred: the CSV's ssh_key_file, then
    the SSH agent and ~/.ssh/id_*; the CSV's password only if one is given."""

    def __init__(self, worker):
        self.key = host_key(worker)
        self.ip, self.port, self.user = worker.ip, worker.ssh_port, worker.ssh_username
        self.key_file, self._password = worker.ssh_key_file, worker.ssh_password
        self.label = f"{self.user}@{self.ip} port {self.port}"
        self.client = None

    def connect(self):
        client = paramiko.SSHClient()
        known_hosts = os.path.expanduser(FLAGS.ssh_known_hosts)
        if FLAGS.ssh_insecure_ignore_host_keys:
            client.set_missing_host_key_policy(AcceptHostKeyWithoutSaving())
        else:
            if os.path.exists(known_hosts):
                client.load_system_host_keys(known_hosts)
            client.set_missing_host_key_policy(RejectUnknownHostKey())
        scan = f"ssh-keyscan -p {self.port} {self.ip} >> {FLAGS.ssh_known_hosts}"
        try:
            client.connect(self.ip, port=self.port, username=self.user, password=self._password or None,
                           key_filename=self.key_file or None, allow_agent=True, look_for_keys=True,
                           timeout=FLAGS.ssh_timeout_s, banner_timeout=FLAGS.ssh_timeout_s,
                           auth_timeout=FLAGS.ssh_timeout_s)
        except UnknownHostKey as e:
            client.close()
            raise HostError(
                f"{self.label}: its SSH host key ({e.key.get_name()} {e.key.fingerprint}) is not in "
                f"{known_hosts}, so the host cannot be verified. Check that fingerprint with the host's owner, "
                f"then add it (`{scan}`), or pass --ssh_insecure_ignore_host_keys on a trusted network."
            ) from None
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostError(
                f"{self.label}: its SSH host key ({e.key.get_name()} {e.key.fingerprint}) differs from the one "
                f"in {known_hosts}. The host was reinstalled or someone is intercepting the connection; if you "
                f"know the host changed, remove its old line (`ssh-keygen -R '[{self.ip}]:{self.port}'`)."
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            tried = ", ".join(x for x in [f"key file {self.key_file}" if self.key_file else "",
                                           "SSH agent and ~/.ssh/id_* keys",
                                           "password from the CSV" if self._password else ""] if x)
            raise HostError(f"{self.label}: SSH login failed (tried {tried}). Put your public key in the "
                            f"host's ~/.ssh/authorized_keys or fix the CSV's ssh_* columns.") from None
        except (OSError, paramiko.SSHException) as e:
            client.close()
            raise HostError(f"{self.label}: cannot connect over SSH: {e}") from None
        self.client = client
        return self

    def run(self, script, timeout=120.0):
        transport = self.client.get_transport() if self.client else None
        if transport is None or not transport.is_active():  # dropped (e.g. during a long watch)
            self.close()
            self.connect()
        _, stdout, stderr = self.client.exec_command("bash -c " + shlex.quote(script), timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err

    def close(self):
        if self.client is not None:
            self.client.close()
            self.client = None


def connect_hosts(cluster, strict=True) -> dict:
    """Host key -> connected host, for this machine and every remote host in the CSV.
    strict: raise one UsageError naming every unreachable host; else print and skip them."""
    if FLAGS.ssh_insecure_ignore_host_keys and any(not w.is_local for w in cluster.learners + cluster.actors):
        print("WARNING: --ssh_insecure_ignore_host_keys: SSH host keys are NOT checked; anyone on the network "
              "path could pose as the hosts.", file=sys.stderr)
    hosts = {"local": LocalHost()}
    problems = []
    for w in cluster.learners + cluster.actors:
        key = host_key(w)
        if key in hosts:
            continue
        try:
            hosts[key] = RemoteHost(w).connect()
        except HostError as e:
            problems.append(f"{cluster.path}:{w.line}: {e}")
            hosts[key] = None
    if problems:
        if strict:
            close_hosts(hosts)
            raise UsageError("\n".join(problems))
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
    return {k: h for k, h in hosts.items() if h is not None}


def close_hosts(hosts):
    for h in hosts.values():
        if h is not None:
            h.close()


# ---------------------------------------------------------------------------
# 4. Shell snippets: tmux windows and the run's processes on one host
# ---------------------------------------------------------------------------

# run_pids prints "pid worker|other job task" for each live process of this run on this
# host: the processes under the live panes of session $S, and those whose command line
# holds $MARK (only this run can have it: it names the run's ports) for a job that runs
# on this host ($OURS: "learner-" and "actor-<i>" tokens), with their descendants.
# Workers are the python processes among them. The calling script, its children and its
# ancestors are left out (its own text holds $MARK). Zombies are left out too.
RUN_PIDS_SH = r"""
run_pids() {
  local roots
  roots=$($T list-panes -s -t "=$S" -F '#{pane_dead} #{pane_pid}' 2>/dev/null | awk '$1 == 0 {print $2}' | tr '\n' ' ')
  ps -e -ww -o pid=,ppid=,stat=,args= | ROOTS="$roots" SELF=$$ awk '
    { p = $1; pp = $2; st = $3; sub(/^ *[0-9]+ +[0-9]+ +[^ ]+ */, "")
      if (st ~ /^Z/) next
      n++; pid[n] = p; par[n] = pp; cmd[n] = $0; parent[p] = pp
      job[n] = "-"; task[n] = "-"
      if (match($0, /--job_name=[a-z]+/)) job[n] = substr($0, RSTART + 11, RLENGTH - 11)
      if (match($0, /--task=[0-9]+/)) task[n] = substr($0, RSTART + 7, RLENGTH - 7) }
    END {
      k = split(ENVIRON["ROOTS"], r, " "); for (i = 1; i <= k; i++) mine[r[i]] = 1
      ours = " " ENVIRON["OURS"] " "
      for (i = 1; i <= n; i++) {
        token = job[i] "-" (job[i] == "actor" ? task[i] : "")
        if (index(cmd[i], ENVIRON["MARK"]) && index(ours, " " token " ")) mine[pid[i]] = 1 }
      a = ENVIRON["SELF"]; while (a in parent && !(a in skip)) { skip[a] = 1; a = parent[a] }
      self[ENVIRON["SELF"]] = 1
      do { grew = 0
        for (i = 1; i <= n; i++) {
          if ((par[i] in self) && !(pid[i] in self)) { self[pid[i]] = 1; grew = 1 }
          if ((par[i] in mine) && !(pid[i] in mine)) { mine[pid[i]] = 1; grew = 1 } }
      } while (grew)
      for (i = 1; i <= n; i++) {
        if (!(pid[i] in mine) || (pid[i] in self) || (pid[i] in skip)) continue
        split(cmd[i], w, " "); exe = w[1]; sub(/.*\//, "", exe)
        kind = (index(cmd[i], ENVIRON["MARK"]) && exe ~ /^python/) ? "worker" : "other"
        print pid[i], kind, job[i], task[i]
      }
    }'
}
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }
"""


def prelude(plan=None, key=None) -> str:
    """Shell definitions every script starts with: $T (tmux), $S (session), run_pids, alive.
    key: the host the script runs on (which workers belong there)."""
    tmux = "tmux" + (f" -L {FLAGS.tmux_socket}" if FLAGS.tmux_socket else "")
    ours = []
    if plan is not None:
        ours += ["learner-"] if any(host_key(w) == key for w in plan.cluster.learners) else []
        ours += [f"actor-{w.index}" for w in plan.cluster.actors if host_key(w) == key]
    return (f"T={shlex.quote(tmux)}\n"
            f"S={shlex.quote(FLAGS.tmux_sess)}\n"
            f"export MARK={shlex.quote(plan.marker if plan else '')} OURS={shlex.quote(' '.join(ours))}\n"
            + RUN_PIDS_SH)


def pane_script(window, plan) -> str:
    """What runs in a tmux window: the command, its output tee'd to the log (tee -i: it
    ignores Ctrl-C, so the worker's last words still reach the log), its exit status noted
    in the log and in the pane's tmux option @exit_status (tmux's own pane_dead_status is
    lost after a respawn-pane)."""
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in window.env.items())
    stamp = "$(date '+%F %T')"
    return (f"exec > >(exec tee -ai {shlex.quote(window.log)}) 2>&1\n"
            f"tmux set-option -p -t \"$TMUX_PANE\" -u @exit_status 2>/dev/null\n"
            f"cd {shlex.quote(FLAGS.repo_dir)} || exit 97\n"
            f"echo \"[frontend] {stamp} starting {window.title} (tmux {FLAGS.tmux_sess}:{window.name})\"\n"
            f"{env}{shlex.join(window.argv)}\n"
            f"rc=$?\n"
            f"echo \"[frontend] {stamp} {window.title} exited with status $rc\"\n"
            f"tmux set-option -p -t \"$TMUX_PANE\" @exit_status $rc 2>/dev/null\n"
            f"exit $rc\n")


def start_windows_script(windows, plan) -> str:
    """Open one tmux window per command in session $S, creating the session if needed.
    A window first runs a placeholder so remain-on-exit is on before the real command
    starts (a dead worker's window stays, for status/watch and for the user to read)."""
    lines = [prelude(plan, windows[0].host), "set -e", f"mkdir -p {shlex.quote(os.path.join(plan.logdir, 'logs'))}"]
    for w in windows:
        name = shlex.quote(w.name)
        lines += [
            f'if $T has-session -t "=$S" 2>/dev/null; then $T new-window -d -t "=$S:" -n {name} "sleep 1000000"; '
            f'else $T new-session -d -s "$S" -n {name} -x 200 -y 50 "sleep 1000000"; fi',
            f'$T set-environment -t "=$S" IMPALA_LOGDIR {shlex.quote(plan.logdir)}',
            f'$T set-option -w -t "=$S:"{name} remain-on-exit on',
            f'$T respawn-pane -k -t "=$S:"{name} bash -c {shlex.quote(pane_script(w, plan))}',
        ]
    return "\n".join(lines) + "\n"


def preflight_script(plan, key) -> str:
    """Prints one line per problem that would stop the start on this host."""
    py, repo, script = shlex.quote(FLAGS.python), shlex.quote(FLAGS.repo_dir), shlex.quote(FLAGS.experiment_script)
    checks = [prelude(plan, key),
              'command -v tmux >/dev/null 2>&1 || echo "tmux is not installed (apt-get install tmux)"',
              f'$T has-session -t "=$S" 2>/dev/null && echo "tmux session $S already exists (stop that run with '
              f'--action=stop, or pick another --tmux_sess)"',
              f'[ -x {py} ] || echo "no python at {FLAGS.python} (--python)"',
              f'[ -d {repo} ] || echo "no repository at {FLAGS.repo_dir} (--repo_dir)"',
              f'cd {repo} 2>/dev/null && {{ [ -f {script} ] || echo "no {FLAGS.experiment_script} in '
              f'{FLAGS.repo_dir} (--experiment_script)"; }}']
    if key == "local":  # mpirun runs here
        checks.append('command -v mpirun >/dev/null 2>&1 || echo "mpirun is not on PATH (apt-get install openmpi-bin)"')
    elif any(host_key(w) == key for w in plan.cluster.learners):  # mpirun's ssh starts orted there
        checks.append('command -v orted >/dev/null 2>&1 || echo "orted (Open MPI) is not on the PATH of '
                      'non-interactive SSH logins (apt-get install openmpi-bin)"')
    return "\n".join(checks) + "\ntrue\n"


def status_script(plan, key) -> str:
    """'#machine <boot id>' (to tell hosts that are the same machine apart), '#panes' lines
    "window pid dead exit_status", then '#procs' lines (run_pids)."""
    return prelude(plan, key) + """
echo "#machine $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || hostname)"
echo '#panes'
$T list-panes -s -t "=$S" -F '#{window_name} #{pane_pid} #{pane_dead} #{@exit_status}' 2>/dev/null
echo '#procs'
run_pids
true
"""


def interrupt_script(plan, key) -> str:
    return (prelude(plan, key) +
            'run_pids | while read -r pid kind job task; do\n'
            '  [ "$kind" = worker ] && kill -INT "$pid" 2>/dev/null && echo "$job $task $pid"\n'
            'done\ntrue\n')


def finish_script(plan, key) -> str:
    """TERM then KILL whatever of the run is left, close the session, print survivors."""
    return prelude(plan, key) + """
pids=$(run_pids | awk '{print $1}')
if [ -n "$pids" ]; then
  kill -TERM $pids 2>/dev/null
  for i in $(seq 30); do
    left=""; for p in $pids; do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && break; sleep 0.1
  done
  [ -n "$left" ] && kill -KILL $left 2>/dev/null && sleep 0.3
fi
$T kill-session -t "=$S" 2>/dev/null
sleep 0.2
for p in $pids; do alive "$p" && echo "left $p $(ps -o args= -p "$p" | cut -c1-120)"; done
run_pids | while read -r pid kind job task; do echo "left $pid $(ps -o args= -p "$pid" | cut -c1-120)"; done
true
"""


# ---------------------------------------------------------------------------
# 5. Actions
# ---------------------------------------------------------------------------

def print_plan(plan, hosts_labels):
    c = plan.cluster
    sock = FLAGS.tmux_socket or "default"
    print(f"Run from {c.path}: {len(c.learners)} learner(s), {len(c.actors)} actor(s); "
          f"tmux session {FLAGS.tmux_sess!r} (socket: {sock}) on each host")
    print(f"logdir: {plan.logdir}")
    for learner, actors in c.assignment():
        cvd = learner.cuda_visible_devices or "(inherited)"
        print(f"  learner {learner.index} = Horovod rank {learner.index}  {learner.address}  on "
              f"{hosts_labels[host_key(learner)]}  CUDA_VISIBLE_DEVICES={cvd}")
        for a in actors:
            print(f"      actor {a.index}  {a.address}  on {hosts_labels[host_key(a)]}")
    print("Commands:")
    for w in plan.windows:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in w.env.items())
        print(f"  [{hosts_labels[w.host]}] tmux window {FLAGS.tmux_sess}:{w.name}, cwd {FLAGS.repo_dir}, "
              f"log {w.log}")
        print(f"      {env + ' ' if env else ''}{shlex.join(w.argv)}")


def write_cluster_json(plan, hosts_labels):
    c = plan.cluster
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "workers_csv": os.path.abspath(c.path),
        "tmux_session": FLAGS.tmux_sess, "tmux_socket": FLAGS.tmux_socket,
        "repo_dir": FLAGS.repo_dir, "python": FLAGS.python, "logdir": plan.logdir,
        "learner_hosts": c.learner_hosts, "actor_hosts": c.actor_hosts,
        "training_flags": plan.training_flags,
        "learners": [dict(w.masked(), rank=w.index, host=hosts_labels[host_key(w)],
                          actors=[a.index for a in actors]) for w, actors in c.assignment()],
        "actors": [dict(w.masked(), task=w.index, learner=w.index % len(c.learners),
                        host=hosts_labels[host_key(w)]) for w in c.actors],
        "windows": [{"window": w.name, "host": hosts_labels[w.host], "env": w.env, "log": w.log,
                     "command": shlex.join(w.argv)} for w in plan.windows],
    }
    os.makedirs(os.path.join(plan.logdir, "logs"), exist_ok=True)
    tmp = os.path.join(plan.logdir, "cluster.json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, os.path.join(plan.logdir, "cluster.json"))


def preflight(plan, hosts):
    problems = []
    for key, host in hosts.items():
        rc, out, err = host.run(preflight_script(plan, key))
        if rc != 0:
            problems.append(f"{host.label}: the check script failed: {err.strip()}")
        problems += [f"{host.label}: {line}" for line in out.splitlines() if line.strip()]
    for w in plan.cluster.learners:
        if w.is_local:
            with socket.socket(socket.AF_INET6 if ":" in w.ip else socket.AF_INET) as s:
                try:
                    s.bind((w.ip, w.tf_port))
                except OSError as e:
                    problems.append(f"{plan.cluster.path}:{w.line}: learner port {w.address} is not free on this "
                                    f"machine ({e.strerror}); pick a free tf_port")
    if problems:
        raise UsageError("\n".join(problems))


def start(plan, hosts) -> int:
    labels = {k: h.label for k, h in hosts.items()}
    write_cluster_json(plan, labels)
    learners_log = plan.learners_window.log
    offset = os.path.getsize(learners_log) if os.path.exists(learners_log) else 0
    try:
        for key in [k for k in hosts if any(w.host == k for w in plan.actor_windows)]:
            windows = [w for w in plan.actor_windows if w.host == key]
            _run_or_raise(hosts[key], start_windows_script(windows, plan), f"starting actors on {labels[key]}")
            print(f"started {len(windows)} actor(s) on {labels[key]}: "
                  f"{', '.join(w.name for w in windows)}", flush=True)
        _run_or_raise(hosts["local"], start_windows_script([plan.learners_window], plan), "starting mpirun")
        print(f"started {len(plan.cluster.learners)} learner(s) with mpirun in tmux window "
              f"{FLAGS.tmux_sess}:learners; log {learners_log}", flush=True)
    except (Exception, KeyboardInterrupt) as e:
        print(f"error: start failed ({e or type(e).__name__}); stopping what was started", file=sys.stderr)
        stop(plan, hosts)
        return 1
    print(f"plan: {os.path.join(plan.logdir, 'cluster.json')}\n"
          f"see: tmux {'-L ' + FLAGS.tmux_socket + ' ' if FLAGS.tmux_socket else ''}attach -t {FLAGS.tmux_sess}"
          f"   status/stop: the same command with --action=status / --action=stop", flush=True)
    if FLAGS.follow:
        return monitor(plan, hosts, tail_from=offset, stop_at_end=True)
    return 0


def _session_logdir():
    rc, out, _ = LocalHost().run(prelude() + '$T show-environment -t "=$S" IMPALA_LOGDIR 2>/dev/null\n')
    return out.strip().split("=", 1)[1] if rc == 0 and "=" in out else None


def _run_or_raise(host, script, what):
    rc, out, err = host.run(script)
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}): {(err or out).strip()[-2000:]}")
    return out


def stop(plan, hosts) -> int:
    """SIGINT every worker on every host, wait, then kill the rest and close the sessions."""
    forced, rc = [], 0
    old = signal.signal(signal.SIGINT, lambda *_: forced.append(1))

    def run(host, script):
        nonlocal rc
        try:
            return host.run(script)[1]
        except (OSError, HostError, paramiko.SSHException) as e:
            print(f"error: {host.label}: {e}", file=sys.stderr)
            rc = 1
            return ""

    try:
        sent = 0
        for key, host in hosts.items():
            out = run(host, interrupt_script(plan, key))
            n = len(out.splitlines())
            sent += n
            if n:
                print(f"{host.label}: sent SIGINT to {n} worker(s)", flush=True)
        t0 = time.time()
        if sent:
            print(f"waiting up to {FLAGS.stop_timeout_s:.0f} s for the workers to exit "
                  f"(Ctrl-C: kill them now)", flush=True)
            while not forced and time.time() - t0 < FLAGS.stop_timeout_s:
                left = sum(_count_workers(run(host, prelude(plan, key) + "run_pids\n"))
                           for key, host in hosts.items())
                if not left:
                    print(f"all workers exited after {time.time() - t0:.1f} s", flush=True)
                    break
                time.sleep(0.5)
            else:
                print("workers still running: killing them", flush=True)
        for key, host in hosts.items():
            out = run(host, finish_script(plan, key))
            left = [line[5:] for line in out.splitlines() if line.startswith("left ")]
            if left:
                rc = 1
                print(f"error: {host.label}: still running after stop:\n  " + "\n  ".join(left), file=sys.stderr)
        if rc == 0:
            print(f"stopped: no process of this run and no tmux session {FLAGS.tmux_sess!r} left on "
                  f"{', '.join(h.label for h in hosts.values())}", flush=True)
        return rc
    finally:
        signal.signal(signal.SIGINT, old)


def _count_workers(run_pids_output) -> int:
    return sum(1 for line in run_pids_output.splitlines() if line.split()[1:2] == ["worker"])


@dataclasses.dataclass
class PaneState:
    alive: bool
    pid: int
    exit_status: str


def poll(plan, hosts):
    """-> ({(host key, window): PaneState}, {host key: [(job, task, (machine, pid))] of worker
    processes}). A host that cannot be reached now is missing from the second dict."""
    panes, procs = {}, {}
    for key, host in hosts.items():
        try:
            rc, out, err = host.run(status_script(plan, key))
        except (OSError, HostError, paramiko.SSHException) as e:
            print(f"warning: cannot reach {host.label}: {e}", file=sys.stderr)
            continue
        section, machine = None, key
        procs[key] = []
        for line in out.splitlines():
            if line.startswith("#machine"):
                machine = line.split(" ", 1)[-1]
            if line.startswith("#"):
                section = line
                continue
            parts = line.split()
            if section == "#panes" and len(parts) >= 3:
                panes[(key, parts[0])] = PaneState(alive=parts[2] == "0", pid=int(parts[1]),
                                                   exit_status=parts[3] if len(parts) > 3 else "")
            elif section == "#procs" and len(parts) == 4 and parts[1] == "worker":
                procs[key].append((parts[2], parts[3], (machine, int(parts[0]))))
    return panes, procs


def status(plan, hosts) -> int:
    panes, procs = poll(plan, hosts)
    labels = {k: h.label for k, h in hosts.items()}
    ok = True
    print(f"run {FLAGS.tmux_sess!r} from {plan.cluster.path}:")
    lw = plan.learners_window
    p = panes.get(("local", "learners"))
    learner_hosts = {host_key(w) for w in plan.cluster.learners}
    # a set: two host entries may be one machine (then both see the same processes)
    ranks = len({pid for key, ps in procs.items() if key in learner_hosts for job, _, pid in ps if job == "learner"})
    k = len(plan.cluster.learners)
    if p and p.alive:
        print(f"  learners  mpirun alive (pid {p.pid}); learner processes found: {ranks}/{k}")
        ok &= ranks == k
    else:
        ok = False
        print(f"  learners  {_dead(p)}  log: {lw.log}")
    alive = 0
    for w in plan.actor_windows:
        p = panes.get((w.host, w.name))
        a = plan.cluster.actors[int(w.name.split("_")[1])]
        if w.host not in procs:
            print(f"  {w.title:<9} UNKNOWN (cannot reach {w.host})")
        elif p and p.alive:
            alive += 1
            print(f"  {w.title:<9} alive (pid {p.pid})  {a.address} -> learner {a.index % k}  on {labels[w.host]}")
        else:
            print(f"  {w.title:<9} {_dead(p)}  on {labels[w.host]}  log: {w.log}")
    ok &= alive == len(plan.actor_windows)
    print(f"summary: learners {'up' if panes.get(('local', 'learners'), PaneState(False, 0, '')).alive else 'down'},"
          f" {alive}/{len(plan.actor_windows)} actors alive")
    return 0 if ok else 1


def _dead(p):
    if p is None:
        return "NOT RUNNING (no tmux window)"
    return "DEAD" + (f" (exit status {p.exit_status})" if p.exit_status else "")


def monitor(plan, hosts, tail_from=None, stop_at_end=False) -> int:
    """The watch loop: restart dead actors (up to --max_restarts each) until the learners
    exit; with tail_from (a byte offset), also print the learners' log from there.
    stop_at_end (--follow): when the learners exit, or on Ctrl-C/SIGTERM, stop the run."""
    restarts = {w.name: 0 for w in plan.actor_windows}
    t0, next_poll = time.time(), 0.0
    # SIGINT may be inherited as ignored (a background job of a non-interactive shell),
    # in which case Python raises no KeyboardInterrupt: install the default handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if stop_at_end:
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    _say(f"watching {len(plan.actor_windows)} actor(s) every {FLAGS.watch_interval_s:g} s, restarting each up "
         f"to {FLAGS.max_restarts} time(s); Ctrl-C "
         f"{'stops the run' if stop_at_end else 'ends watching (workers keep running)'}")
    try:
        while True:
            if tail_from is not None:
                tail_from = _print_new(plan.learners_window.log, tail_from)
            if time.time() >= next_poll:
                next_poll = time.time() + FLAGS.watch_interval_s
                panes, reachable = poll(plan, hosts)  # reachable: keyed by the hosts that answered
                learners = panes.get(("local", "learners"))
                if learners is None:
                    _say(f"no tmux window {FLAGS.tmux_sess}:learners on this machine: the run was not started "
                         f"or is stopped")
                    return 1
                if not learners.alive:
                    if tail_from is not None:
                        time.sleep(0.5)
                        _print_new(plan.learners_window.log, tail_from)
                    _say(f"the learners exited (mpirun status {learners.exit_status or '?'})")
                    if stop_at_end:
                        stop(plan, hosts)
                    else:
                        print("actors may still run: stop them with --action=stop", flush=True)
                    return 0 if learners.exit_status == "0" else 1
                restart_dead_actors(plan, hosts, panes, reachable, restarts)
            if FLAGS.watch_timeout_s and time.time() - t0 > FLAGS.watch_timeout_s and not stop_at_end:
                _say("--watch_timeout_s reached; workers keep running")
                return 0
            time.sleep(0.5 if tail_from is not None else min(1.0, FLAGS.watch_interval_s))
    except KeyboardInterrupt:
        if stop_at_end:
            _say("Ctrl-C: stopping the run")
            return stop(plan, hosts) or 130
        _say("Ctrl-C: no longer watching; the workers keep running")
        return 130


def restart_dead_actors(plan, hosts, panes, reachable, restarts):
    """respawn-pane each dead actor window, at most --max_restarts times per actor."""
    for w in plan.actor_windows:
        p = panes.get((w.host, w.name))
        if (p is not None and p.alive) or w.host not in reachable or restarts[w.name] < 0:
            continue
        label = hosts[w.host].label
        if p is None:
            _say(f"{w.title} on {label}: no tmux window; cannot restart it")
            restarts[w.name] = -1  # said once
        elif restarts[w.name] < FLAGS.max_restarts:
            try:
                hosts[w.host].run(prelude(plan, w.host) + f'$T respawn-pane -t "=$S:"{shlex.quote(w.name)}\n')
            except (OSError, HostError, paramiko.SSHException) as e:
                print(f"warning: cannot reach {label} to restart {w.title}: {e}", file=sys.stderr)
                continue
            restarts[w.name] += 1
            _say(f"{w.title} on {label} was dead (exit status {p.exit_status or '?'}); restarted it "
                 f"({restarts[w.name]}/{FLAGS.max_restarts}); log {w.log}")
        else:
            _say(f"{w.title} on {label} is dead (exit status {p.exit_status or '?'}); not restarting it "
                 f"(restarted {restarts[w.name]} time(s) already, --max_restarts={FLAGS.max_restarts}); log {w.log}")
            restarts[w.name] = -1  # said once


def _say(msg):
    print(f"[watch {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def _print_new(path, offset) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data)


# ---------------------------------------------------------------------------
# 6. main
# ---------------------------------------------------------------------------

def parse_flags(argv):
    """absl parses the frontend's flags; what it does not know are training flags."""
    try:
        rest = FLAGS(argv, known_only=True)
    except flags.Error as e:
        print(f"error: {e}\nSee --helpfull.", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    return rest


def main(argv):
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited as ignored
    try:
        if not FLAGS.workers_csv_path:
            raise UsageError("--workers_csv_path is required (see sandbox/local_workers_example.csv)")
        training_flags = split_training_flags(argv[1:])
        try:
            cluster = workers_csv.load(FLAGS.workers_csv_path)
        except workers_csv.WorkersCsvError as e:
            raise UsageError(str(e)) from None
        for warning in cluster.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        check_plan(cluster)
        FLAGS.repo_dir = os.path.abspath(FLAGS.repo_dir)

        if FLAGS.action == "start":
            level = None
            if FLAGS.check_flags:
                level = check_training_flags(cluster, training_flags)
            logdir = FLAGS.logdir or default_logdir(training_flags, level)
            logdir = os.path.normpath(os.path.join(FLAGS.repo_dir, logdir))
        else:  # the logdir only names log files in messages; start noted it in the tmux session
            logdir = FLAGS.logdir or _session_logdir() or "(unknown logdir: pass --logdir)"
            logdir = os.path.normpath(os.path.join(FLAGS.repo_dir, logdir))
        plan = make_plan(cluster, training_flags, logdir)
        # start and watch need every host; stop and status do what they can and say what not
        hosts = connect_hosts(cluster, strict=FLAGS.action in ("start", "watch"))
        unreachable = {w.host for w in plan.windows} - set(hosts)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    try:
        if FLAGS.action == "start":
            try:
                preflight(plan, hosts)
            except UsageError as e:
                print(f"error: nothing was started:\n{e}", file=sys.stderr)
                return EXIT_BAD_INPUT
            if FLAGS.dry_run:
                print_plan(plan, {k: h.label for k, h in hosts.items()})
                print("dry run: all checks passed; nothing was started")
                return 0
            print_plan(plan, {k: h.label for k, h in hosts.items()})
            return start(plan, hosts)
        if FLAGS.action == "stop":
            return max(stop(plan, hosts), 1 if unreachable else 0)
        if FLAGS.action == "status":
            return max(status(plan, hosts), 1 if unreachable else 0)
        return monitor(plan, hosts, tail_from=0 if FLAGS.follow else None, stop_at_end=FLAGS.follow)
    finally:
        close_hosts(hosts)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
