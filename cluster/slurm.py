"""IMPALA inside a Slurm allocation: `sbatch sandbox/slurm_impala.sbatch [launcher flags] [experiment flags]`.

The batch script execs this launcher on the allocation's first node. It reads the allocation
(SLURM_JOB_NODELIST, SLURM_NTASKS, GPUs per node) instead of a workers CSV and starts one task per
worker: the learner ranks on the first node(s) (with the node's GPUs when it has them; several ranks
under one mpirun), the actors on the other nodes as job steps (`srun --overlap`), or beside the
learners when the allocation has one node. Every worker logs to <logdir>/logs/.

Stopping: `scancel` and the time limit make Slurm send SIGTERM to every process of the job, and
--signal=B:TERM@<s> (the batch script asks for a minute) gives the launcher that warning first:
it passes SIGINT to the learners, which write their checkpoint and close their queues; the actors
then leave by themselves. Slurm's KillWait bounds how long the checkpoint may take.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import NamedTuple

from cluster import slurm_watch
from cluster.plan import resume_flags
from tools.digits import NumberError, int_arg, parse_int

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTOR_GRACE_S = 60.0  # after the learners' end, how long actors get to see the closed queue


class SlurmError(Exception):
    """The allocation or the launcher flags cannot run a cluster; one line saying what would."""


class Allocation(NamedTuple):
    job_id: str
    nodes: list
    tasks: int
    gpus_per_node: int


class Layout(NamedTuple):
    learners: list  # (node, port) per rank
    actors: list  # (node, port) per actor; the port only names the actor in --actor_hosts


def read_allocation(environ=os.environ) -> Allocation:
    if "SLURM_JOB_ID" not in environ:
        raise SlurmError("not inside a Slurm allocation (no SLURM_JOB_ID): submit it with "
                         "sbatch sandbox/slurm_impala.sbatch, or use local_cluster.py / run_experiment_mm_raw.py")
    nodelist = environ.get("SLURM_JOB_NODELIST", "")
    p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    nodes = p.stdout.split()
    if p.returncode != 0 or not nodes:
        raise SlurmError("cannot expand SLURM_JOB_NODELIST=%r with scontrol: %s" % (nodelist, p.stderr.strip()))
    tasks = _count(environ, "SLURM_NTASKS", len(nodes), "sbatch --ntasks=N sets it")
    return Allocation(environ["SLURM_JOB_ID"], nodes, tasks, _gpus_per_node(environ))


def _count(environ, name, default, right, text=None):
    """The count in variable `name` (or in `text`, the count's part of its value); `default` if that is
    empty. A SlurmError naming the variable unless it is ASCII digits: int() would read '３' as 3."""
    text = environ.get(name, "") if text is None else text
    if not text:
        return default
    try:
        return parse_int(text)
    except NumberError as e:
        raise SlurmError("%s=%r: %s; %s" % (name, environ[name], e, right)) from None


def _gpus_per_node(environ):
    """SLURM_GPUS_ON_NODE, else the count of SLURM_GPUS_PER_NODE ([type:]count, e.g. a100:2); 0 without."""
    if environ.get("SLURM_GPUS_ON_NODE"):
        return _count(environ, "SLURM_GPUS_ON_NODE", 0, "Slurm sets it to the node's GPU count")
    value = environ.get("SLURM_GPUS_PER_NODE", "")
    return _count(environ, "SLURM_GPUS_PER_NODE", 0, "sbatch --gpus-per-node=[type:]N sets it, e.g. a100:2",
                  text=value.split(":")[-1])


def plan_layout(alloc, num_learners, learners_per_node, base_port) -> Layout:
    """Learners fill the first nodes (learners_per_node each: 0 = one per GPU, or all on the first node
    without GPUs); actors take the rest of the tasks, on the nodes without learners if there are any."""
    per_node = learners_per_node or alloc.gpus_per_node or num_learners
    learner_nodes = [alloc.nodes[r // per_node] for r in range(num_learners) if r // per_node < len(alloc.nodes)]
    if len(learner_nodes) < num_learners:
        raise SlurmError("--num_learners=%d at %d per node needs %d nodes; the allocation has %d"
                         % (num_learners, per_node, -(-num_learners // per_node), len(alloc.nodes)))
    num_actors = alloc.tasks - num_learners
    if num_actors < 1:
        raise SlurmError("the allocation has %d task(s) and --num_learners=%d leaves no actor; ask for more "
                         "(sbatch --ntasks=%d or more)" % (alloc.tasks, num_learners, num_learners + 1))
    actor_nodes = [n for n in alloc.nodes if n not in learner_nodes] or alloc.nodes
    learners = [(n, base_port + r) for r, n in enumerate(learner_nodes)]
    actors = [(actor_nodes[i % len(actor_nodes)], base_port + 100 + i) for i in range(num_actors)]
    return Layout(learners, actors)


def _hosts(pairs):
    return ",".join("%s:%d" % p for p in pairs)


def worker_argv(python, layout, job, logdir, training_flags, task=None):
    argv = [python, os.path.join(REPO_DIR, "experiment.py"), "--job_name=" + job,
            "--learner_hosts=" + _hosts(layout.learners), "--actor_hosts=" + _hosts(layout.actors)]
    return argv + (["--task=%d" % task] if task is not None else []) + ["--logdir=" + logdir] + list(training_flags)


def learners_argv(python, layout, logdir, training_flags):
    """One learner runs as a plain process; several as one mpirun over their nodes (OpenMPI starts its
    daemons on other nodes with srun, which SLURM_OVERLAP lets share the job's CPUs)."""
    cmd = worker_argv(python, layout, "learner", logdir, training_flags)
    if len(layout.learners) == 1:
        return cmd
    counts = {}
    for node, _ in layout.learners:
        counts[node] = counts.get(node, 0) + 1
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return (["mpirun"] + root + ["--oversubscribe", "--bind-to", "none", "-np", str(len(layout.learners)),
                                 "-H", ",".join("%s:%d" % c for c in counts.items()), "-x", "PYTHONUNBUFFERED=1",
                                 "-x", "PYTHONPATH", "-x", "SLURM_OVERLAP"] + cmd)


def actor_argv(python, layout, task, logdir, training_flags, node=None):
    """Actor `task`'s srun step, on its layout node or on `node` (where a restart moved it)."""
    node = node or layout.actors[task][0]
    return (["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=" + node, "--job-name=actor_%d" % task,
             "--output=" + os.path.join(logdir, "logs", "actor_%d.log" % task)]
            + worker_argv(python, layout, "actor", logdir, training_flags, task))


class Run:
    """The launched workers: the learners' process (its own process group, so a stop reaches every
    rank) and one srun step per actor, started again when they fail (cluster/slurm_watch.py)."""

    def __init__(self, alloc, layout, logdir, python, training_flags, actor_restarts=3, learner_restarts=3):
        self.alloc, self.layout, self.logdir, self.python = alloc, layout, logdir, python
        self.flags, self.learner_flags = list(training_flags), list(training_flags)
        self.learner, self.actors, self.stopping = None, [], False
        self.actor_nodes = [node for node, _ in layout.actors]
        self.actor_started, self.actor_restarts_done = [], [0] * len(layout.actors)
        self.limits = {"actor": actor_restarts, "learners": learner_restarts}
        self.restarts, self.suspect_nodes = [], set()
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", SLURM_OVERLAP="1", TF_CPP_MIN_LOG_LEVEL="2")

    def write_plan(self):
        alloc = self.alloc
        doc = {"job_id": alloc.job_id, "nodes": alloc.nodes, "tasks": alloc.tasks, "gpus_per_node": alloc.gpus_per_node,
               "learners": _hosts(self.layout.learners), "actors": _hosts(self.layout.actors),
               "learner_command": shlex.join(learners_argv(self.python, self.layout, self.logdir, self.flags)),
               "actor_commands": [shlex.join(actor_argv(self.python, self.layout, i, self.logdir, self.flags))
                                  for i in range(len(self.layout.actors))]}
        with open(os.path.join(self.logdir, "slurm.json"), "w") as f:
            json.dump(doc, f, indent=2)

    def start(self):
        for i in range(len(self.layout.actors)):
            self.actors.append(None)
            self.actor_started.append(0.0)
            self._start_actor(i)
        self._start_learners()

    def _start_actor(self, i):
        argv = actor_argv(self.python, self.layout, i, self.logdir, self.flags, node=self.actor_nodes[i])
        self.actors[i] = subprocess.Popen(argv, env=self.env, cwd=REPO_DIR, stdin=subprocess.DEVNULL)
        self.actor_started[i] = time.time()

    def _start_learners(self):
        log = open(os.path.join(self.logdir, "logs", "learner.log"), "ab")
        self.learner = subprocess.Popen(learners_argv(self.python, self.layout, self.logdir, self.learner_flags),
                                        env=self.env, cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def stop(self, signum=None, frame=None):
        """SIGINT to every learner rank: a checkpoint, then closed queues that send the actors home."""
        if self.learner is not None and self.learner.poll() is None and not self.stopping:
            say("signal %s: stopping the learners (checkpoint first)" % (signum or "-"))
            try:
                os.killpg(self.learner.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        self.stopping = True

    def wait(self):
        """The learners' exit code, once the actors are gone too (ended by srun after a grace period).
        Until then failed actors and learners are started again."""
        while self.learner.poll() is None or self._restart_learners():
            self._tend_actors()
            time.sleep(0.5)
        say("learners exited with status %d; waiting up to %.0f s for the actors" % (self.learner.returncode,
                                                                                     ACTOR_GRACE_S))
        deadline = time.time() + ACTOR_GRACE_S
        while any(a.poll() is None for a in self.actors) and time.time() < deadline:
            time.sleep(0.5)
        _end_steps(self.actors)
        codes = [a.returncode for a in self.actors]
        say("actors exited with status %s" % ", ".join(str(c) for c in codes))
        return self.learner.returncode

    def _tend_actors(self):
        """Start again each actor whose step failed while the learners train, moving it off a node
        where its step could not even start."""
        if self.stopping or self.learner.poll() is not None:
            return
        for i, a in enumerate(self.actors):
            code = a.poll()
            if code is None or code == 0 or self.actor_restarts_done[i] > self.limits["actor"]:
                continue
            node = self.actor_nodes[i]
            if self.actor_restarts_done[i] == self.limits["actor"]:
                self.actor_restarts_done[i] += 1  # said once
                say("actor %d on %s exited with status %d; not restarting it (restarted %d time(s) already, "
                    "--actor_restarts=%d); the others train on" % (i, node, code, self.limits["actor"],
                                                                   self.limits["actor"]))
                continue
            if time.time() - self.actor_started[i] < slurm_watch.FAST_FAIL_S:
                self.suspect_nodes.add(node)
                learner_nodes = [n for n, _ in self.layout.learners]
                self.actor_nodes[i] = slurm_watch.next_node(node, self.alloc.nodes, learner_nodes,
                                                            slurm_watch.nodes_up(self.alloc.nodes), self.suspect_nodes)
            self.actor_restarts_done[i] += 1
            why = "actor %d on %s exited with status %d" % (i, node, code)
            say("%s: restarting it on %s (restart %d/%d)" % (why, self.actor_nodes[i], self.actor_restarts_done[i],
                                                             self.limits["actor"]))
            self._start_actor(i)
            self._record("actor %d" % i, [self.actor_nodes[i]], why, "")

    def _restart_learners(self) -> bool:
        """Start the learners again after a failure, on the learner nodes that are up, from the newest
        checkpoint; False (and why, unless they finished or were stopped) when they are not."""
        code = self.learner.returncode
        done = sum(r.worker == "learners" for r in self.restarts)
        why_not = slurm_watch.why_not_restart(code, self.stopping, done, self.limits["learners"])
        learners = []
        if not why_not:  # sinfo only when a restart is due, not at every run's end
            up = slurm_watch.nodes_up(sorted({n for n, _ in self.layout.learners}))
            learners = [(n, port) for n, port in self.layout.learners if n in up]
            why_not = "" if learners else "no learner node is up"
        if why_not:
            if why_not not in ("finished", "stopping"):
                say("the learners exited with status %d; not restarting them: %s" % (code, why_not))
            return False
        why = "the learners exited with status %d" % code
        resumed = slurm_watch.checkpoint_dir(self.logdir)
        self.learner_flags = resume_flags(self.flags, self.logdir) if resumed else list(self.flags)
        moved = len(learners) != len(self.layout.learners)
        self.layout = self.layout._replace(learners=learners)
        say("%s: restarting them (restart %d/%d) with %d rank(s) on %s, %s" % (
            why, done + 1, self.limits["learners"], len(learners), _hosts(learners),
            "resuming from the newest checkpoint in " + resumed if resumed else "from the start (no checkpoint yet)"))
        self._start_learners()
        if moved:  # actor i feeds learner i % K: every actor needs the new list
            _end_steps(self.actors)
            for i in range(len(self.actors)):
                self._start_actor(i)
        self._record("learners", sorted({n for n, _ in learners}), why, resumed)
        return True

    def _record(self, worker, nodes, why, resumed):
        self.restarts.append(slurm_watch.Restart(time=time.time(), worker=worker, nodes=nodes, why=why,
                                                 resumed=resumed))
        slurm_watch.record(self.logdir, self.restarts)


def _end_steps(steps):
    """SIGTERM to the srun steps still running (srun ends its step on it), then a kill for any that
    has not ended 30 s later."""
    for a in steps:
        if a.poll() is None:
            a.send_signal(signal.SIGTERM)
    for a in steps:
        try:
            a.wait(30)
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait()


def say(msg):
    print("[slurm %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m cluster.slurm", description=__doc__.split("\n\n")[0],
                                epilog="Every other --flag=value goes to experiment.py (training flags).")
    p.add_argument("--num_learners", type=int_arg, default=1,
                   help="learner ranks (Horovod); the rest of the tasks are actors")
    p.add_argument("--learners_per_node", type=int_arg, default=0,
                   help="learner ranks per node; 0: one per GPU of the node, or all on the first node without GPUs")
    p.add_argument("--base_port", type=int_arg, default=8001, help="learner rank r serves base_port + r on its node")
    p.add_argument("--logdir", default=None, help="run folder (default results/<level_name>_slurm<job id>)")
    p.add_argument("--python", default=sys.executable, help="the Python of the project's venv on every node")
    p.add_argument("--actor_restarts", type=int_arg, default=3,
                   help="times each actor is started again after its step failed, on another node when its own "
                        "could not start it (0: a failed actor stays down)")
    p.add_argument("--learner_restarts", type=int_arg, default=3,
                   help="times the learners are started again after they failed, from the newest checkpoint, "
                        "with the learner nodes that are up (0: a failed learner ends the run)")
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if not a.startswith("--")]
    if bad:
        p.error("%s: training flags are written --name=value" % " ".join(bad))
    if args.num_learners < 1 or args.learners_per_node < 0 or not 0 < args.base_port < 65000:
        p.error("--num_learners must be >= 1, --learners_per_node >= 0 and --base_port in 1-64999")
    for name in ("actor_restarts", "learner_restarts"):
        if getattr(args, name) < 0:
            p.error("--%s must be >= 0, got %d" % (name, getattr(args, name)))
    return args, rest


def main(argv=None):
    args, training_flags = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        alloc = read_allocation()
        layout = plan_layout(alloc, args.num_learners, args.learners_per_node, args.base_port)
    except SlurmError as e:
        print("slurm.py: error: %s" % e, file=sys.stderr)
        return 2
    level = next((f.split("=", 1)[1] for f in training_flags if f.startswith("--level_name=")), "impala")
    logdir = os.path.abspath(args.logdir or os.path.join("results", "%s_slurm%s" % (level.replace("/", "-"),
                                                                                    alloc.job_id)))
    os.makedirs(os.path.join(logdir, "logs"), exist_ok=True)
    run = Run(alloc, layout, logdir, args.python, training_flags, args.actor_restarts, args.learner_restarts)
    run.write_plan()
    signal.signal(signal.SIGTERM, run.stop)
    signal.signal(signal.SIGINT, run.stop)
    say("job %s on %s: %d learner(s) at %s, %d actor(s); logs in %s"
        % (alloc.job_id, ",".join(alloc.nodes), len(layout.learners), _hosts(layout.learners), len(layout.actors),
           os.path.join(logdir, "logs")))
    run.start()
    return run.wait()


if __name__ == "__main__":
    sys.exit(main())
