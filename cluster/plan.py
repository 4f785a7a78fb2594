"""The plan: a workers CSV and training flags in, one command per tmux window out.

Actor i runs `experiment.py --job_name=actor --task=i` in tmux window actor_<i> on its
host; all learners run under one mpirun (Horovod rank r = the r-th learner row) in the
window `learners` on this machine. check_training_flags lets experiment.py itself parse
the training flags (in a child process) so a typo fails before anything starts.
print_plan shows it all (--dry_run); write_cluster_json records it in the run folder.
"""
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time

from absl import flags

from cluster import hosts as hosts_lib
from cluster import workers_csv
from tools.files import write_json

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # cluster/ lives in the repository

flags.DEFINE_string("tmux_sess", "impala", "tmux session name on every host.")
flags.DEFINE_string("tmux_socket", "", "tmux server socket name (tmux -L) on every host; empty: the default server.")
flags.DEFINE_string("repo_dir", REPO_DIR, "The repository's path, the same on every host (as for mpirun).")
flags.DEFINE_string("python", sys.executable, "Python interpreter for the workers, the same path on every host.")
flags.DEFINE_string("experiment_script", "experiment.py", "Training script, relative to --repo_dir (or absolute).")
flags.DEFINE_bool("check_flags", True, "Before starting, load experiment.py here and let it parse the training "
                                       "flags, so a typo fails now, not on 20 hosts.")
flags.DEFINE_string("mpi_args", "", "Extra mpirun arguments, e.g. '-mca btl_tcp_if_include eth0'.")
FLAGS = flags.FLAGS

# experiment.py flags that the frontend sets from the CSV.
RESERVED_FLAGS = ("job_name", "task", "learner_hosts", "actor_hosts", "learner_host")
EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input found before anything was started; exit 2 with this message."""


# ---------------------------------------------------------------------------
# 1. Windows and commands
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Window:
    name: str      # tmux window: "actor_<i>", "evaluator_0" or "learners"
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
    windows: list        # actor windows, the evaluator's (started first), then the learners window
    marker: str          # a string only this run's worker command lines contain
    csv_learners: list = None  # every learner row of the CSV; cluster.learners: those the job runs now

    @property
    def first_windows(self):
        """Every window started before mpirun: the actors' and the evaluator's."""
        return self.windows[:-1]

    @property
    def actor_windows(self):
        return [w for w in self.windows if w.name.startswith("actor_")]

    @property
    def evaluator_windows(self):
        return [w for w in self.windows if w.name.startswith("evaluator_")]

    @property
    def learners_window(self):
        return self.windows[-1]


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
    # --actor_hosts with --job_name right after it: the stop and status scripts find the run's
    # processes by that exact text (Plan.marker).
    argv = [FLAGS.python, FLAGS.experiment_script,
            f"--learner_hosts={cluster.learner_hosts}", f"--actor_hosts={cluster.actor_hosts}",
            f"--job_name={job}"]
    if job == "actor":
        argv.append(f"--task={task}")
    return argv + [f"--logdir={logdir}"] + list(training_flags)


def run_marker(cluster) -> str:
    # Not the learner list: a learner job restarted without a lost host (learnerloss.py) is still
    # this run, and its stale ranks, started with the old list, are found by the same text.
    return f"--actor_hosts={cluster.actor_hosts} --job_name="


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
            "-x", "PYTHONUNBUFFERED=1"] + [a for k in _passed_env() for a in ("-x", k)]
    remote = [w for w in learners if not w.is_local]
    if remote:
        argv += ["-mca", "plm_rsh_args", hosts_lib.mpirun_ssh_args(remote[0])]
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


def _passed_env():
    """The frontend's PYTHONPATH goes to every worker, so an --env_module kept on it (with the repository
    on a shared path, as mpirun needs anyway) is found on the other hosts too."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}


def make_plan(cluster, training_flags, logdir) -> Plan:
    windows = []
    logs = os.path.join(logdir, "logs")
    for a in cluster.actors:
        env = {"PYTHONUNBUFFERED": "1", **_passed_env()}
        if a.cuda_visible_devices:
            env["CUDA_VISIBLE_DEVICES"] = a.cuda_visible_devices
        windows.append(Window(name=a.name, host=hosts_lib.host_key(a), env=env, title=f"actor {a.index}",
                              argv=worker_argv(cluster, "actor", a.index, logdir, training_flags),
                              log=os.path.join(logs, f"{a.name}.log")))
    for e in cluster.evaluators:  # a gRPC client of learner 0, like an actor; never on a GPU
        windows.append(Window(name=e.name, host=hosts_lib.host_key(e), env={"PYTHONUNBUFFERED": "1", **_passed_env()},
                              title="evaluator", argv=worker_argv(cluster, "evaluator", None, logdir, training_flags),
                              log=os.path.join(logs, f"{e.name}.log")))
    windows.append(Window(name="learners", host="local", env={}, title="learners (mpirun)",
                          argv=mpirun_argv(cluster, logdir, training_flags),
                          log=os.path.join(logs, "learners.log")))
    return Plan(cluster=cluster, training_flags=list(training_flags), logdir=logdir,
                windows=windows, marker=run_marker(cluster), csv_learners=list(cluster.learners))


def resume_flags(training_flags, logdir) -> list:
    """The training flags of a learner job that resumes the run in logdir from its newest checkpoint."""
    kept = [f for f in training_flags if not f.startswith(("--mode=", "--load_model_url="))]
    return kept + ["--mode=train_w_load", f"--load_model_url={logdir}"]


def reshape(plan, positions, resume):
    """Point the plan at the CSV's learners at `positions` (rank order), in place: every window's
    command gets the new --learner_hosts (actor i feeds learner i % K of them), and with resume the
    learners resume the run from its newest checkpoint."""
    plan.cluster = dataclasses.replace(plan.cluster, learners=[plan.csv_learners[i] for i in positions])
    learner_flags = resume_flags(plan.training_flags, plan.logdir) if resume else plan.training_flags
    for w in plan.windows:
        if w.name == "learners":
            w.argv = mpirun_argv(plan.cluster, plan.logdir, learner_flags)
        elif w.name.startswith("actor_"):
            w.argv = worker_argv(plan.cluster, "actor", int(w.name.split("_")[1]), plan.logdir, plan.training_flags)
        else:
            w.argv = worker_argv(plan.cluster, "evaluator", None, plan.logdir, plan.training_flags)


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


def experiment_flag_names(repo_dir=REPO_DIR, python=sys.executable, script="experiment.py") -> set:
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
# 3. The plan shown (--dry_run) and recorded (cluster.json)
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
              f"{hosts_labels[hosts_lib.host_key(learner)]}  CUDA_VISIBLE_DEVICES={cvd}")
        for a in actors:
            print(f"      actor {a.index}  {a.address}  on {hosts_labels[hosts_lib.host_key(a)]}")
    for e in c.evaluators:
        print(f"  evaluator (plays learner 0's policy)  on {hosts_labels[hosts_lib.host_key(e)]}")
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
        "learners": [dict(w.masked(), rank=w.index, host=hosts_labels[hosts_lib.host_key(w)],
                          actors=[a.index for a in actors]) for w, actors in c.assignment()],
        "actors": [dict(w.masked(), task=w.index, learner=w.index % len(c.learners),
                        host=hosts_labels[hosts_lib.host_key(w)]) for w in c.actors],
        "evaluators": [dict(w.masked(), host=hosts_labels[hosts_lib.host_key(w)]) for w in c.evaluators],
        "windows": [{"window": w.name, "host": hosts_labels[w.host], "env": w.env, "log": w.log,
                     "command": shlex.join(w.argv)} for w in plan.windows],
    }
    os.makedirs(os.path.join(plan.logdir, "logs"), exist_ok=True)
    write_json(os.path.join(plan.logdir, "cluster.json"), doc, indent=2)


