"""A local cluster without tmux or SSH: one learner and N actors as child
processes of this one, on 127.0.0.1. Used by the benchmarks and tests, and
handy on a laptop:

  python local_cluster.py --num_actors=2 --base_port=8001 -- \
      --level_name=CartPole-v1 --agent_name=MLPAgent --total_environment_frames=500000

Everything after `--` goes to experiment.py unchanged. The learner's output is
shown here; actors log to <logdir>/logs/actor_<i>.log. Ctrl-C (or SIGTERM)
stops the learner first (it writes a checkpoint and closes its queue, which
stops the actors), then anything left after a grace period is killed. An actor
that dies is reported; the run goes on with the others.
"""
import argparse
import os
import signal
import subprocess
import sys
import time

from tools.digits import int_arg

HERE = os.path.dirname(os.path.abspath(__file__))


class LocalCluster:
    def __init__(self, num_actors, base_port, extra_flags, logdir, python=sys.executable,
                 num_learners=1, learner_stdout=None, evaluator=False):
        self.num_actors = num_actors
        self.learners = ["127.0.0.1:%d" % (base_port + i) for i in range(num_learners)]
        self.actors = ["127.0.0.1:%d" % (base_port + num_learners + i) for i in range(num_actors)]
        self.extra = list(extra_flags)
        self.logdir = logdir
        self.python = python
        self.learner_stdout = learner_stdout
        self.learner = None
        self.actor_procs = []
        self.evaluator = evaluator
        self.evaluator_proc = None
        self._reported = set()  # actors whose death wait() has reported
        self._logs = []

    def _common(self):
        return ["--learner_hosts=" + ",".join(self.learners), "--actor_hosts=" + ",".join(self.actors),
                "--logdir=" + self.logdir] + self.extra

    def learner_cmd(self):
        cmd = [self.python, os.path.join(HERE, "experiment.py"), "--job_name=learner"] + self._common()
        if len(self.learners) > 1:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(len(self.learners)),
                   "--bind-to", "none", "-x", "PYTHONUNBUFFERED=1", "-x", "TF_CPP_MIN_LOG_LEVEL"] + cmd
        return cmd

    def actor_cmd(self, i):
        return [self.python, os.path.join(HERE, "experiment.py"), "--job_name=actor",
                "--task=%d" % i] + self._common()

    def start(self):
        os.makedirs(os.path.join(self.logdir, "logs"), exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        out = self.learner_stdout
        if out is None:
            out = open(os.path.join(self.logdir, "logs", "learner.log"), "w")
            self._logs.append(out)
        self.learner = subprocess.Popen(self.learner_cmd(), stdout=out, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
        for i in range(self.num_actors):
            f = open(os.path.join(self.logdir, "logs", "actor_%d.log" % i), "w")
            self._logs.append(f)
            self.actor_procs.append(subprocess.Popen(self.actor_cmd(i), stdout=f, stderr=subprocess.STDOUT,
                                                     env=env, start_new_session=True))
        if self.evaluator:
            f = open(os.path.join(self.logdir, "logs", "evaluator.log"), "w")
            self._logs.append(f)
            cmd = [self.python, os.path.join(HERE, "experiment.py"), "--job_name=evaluator"] + self._common()
            self.evaluator_proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True)
        return self

    def actors_alive(self):
        return [p.poll() is None for p in self.actor_procs]

    def wait(self, timeout=None, on_actor_death=None):
        """Waits for the learner to exit; returns its exit code (None on timeout)."""
        deadline = None if timeout is None else time.time() + timeout
        reported = self._reported
        while self.learner.poll() is None:
            for i, p in enumerate(self.actor_procs):
                if p.poll() is not None and i not in reported:
                    reported.add(i)
                    if on_actor_death:
                        on_actor_death(i, p.returncode)
            if deadline is not None and time.time() > deadline:
                return None
            time.sleep(0.2)
        return self.learner.returncode

    def stop(self, grace_s=30.0):
        """SIGINT to the learner (checkpoint + close queue), then to actors; kill leftovers."""
        others = self.actor_procs + ([self.evaluator_proc] if self.evaluator_proc else [])
        procs = [self.learner] + others
        if self.learner is not None and self.learner.poll() is None:
            _signal_group(self.learner, signal.SIGINT)
            _wait_all([self.learner], grace_s)
        for p in others:
            if p.poll() is None:
                _signal_group(p, signal.SIGINT)
        _wait_all(others, min(grace_s, 15.0))
        for p in procs:
            if p is not None and p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        for f in self._logs:
            f.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def obey_ctrl_c():
    """Makes SIGINT raise KeyboardInterrupt again: a shell starting a script in the background
    hands Python SIGINT ignored, and then Ctrl-C (kill -INT) would not stop it or its cluster."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def _wait_all(procs, timeout):
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass


def flag_value(flags, name, default):
    """An experiment.py flag's value among `flags`, flag files included (the last one given wins, as
    absl reads them)."""
    value = default
    for f in flags:
        if f.startswith("--flagfile="):
            with open(f.split("=", 1)[1]) as fh:
                lines = [line.strip() for line in fh if line.strip() and not line.strip().startswith("#")]
            value = flag_value(lines, name, value)
        elif f.startswith("--%s=" % name):
            value = f.split("=", 1)[1]
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_actors", type=int_arg, default=2)
    parser.add_argument("--num_learners", type=int_arg, default=1, help="Horovod ranks (mpirun)")
    parser.add_argument("--base_port", type=int_arg, default=8001)
    parser.add_argument("--logdir", default=None)
    parser.add_argument("--evaluator", action="store_true",
                        help="also run the test worker (greedy evaluation every --test_every_s)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then experiment.py flags")
    args = parser.parse_args()
    extra = [f for f in args.flags if f != "--"]
    if args.num_actors < 1:
        parser.error("--num_actors must be >= 1")
    if not 1 <= args.base_port <= 65535 - args.num_actors - args.num_learners:
        parser.error("--base_port must leave room for %d ports below 65536"
                     % (args.num_actors + args.num_learners))
    try:  # read as experiment.py will read them, so the run folder is where the learner writes
        level = flag_value(extra, "level_name", "PongNoFrameskip-v4")
        logdir = args.logdir or flag_value(extra, "logdir", None)
    except OSError as e:
        parser.error("--flagfile: %s" % e)
    logdir = logdir or os.path.join("results", "%s_%d" % (level.replace("/", "-"), int(time.time())))
    cluster = LocalCluster(args.num_actors, args.base_port, extra, logdir,
                           num_learners=args.num_learners, learner_stdout=sys.stdout,
                           evaluator=args.evaluator)
    stopping = {"flag": False}

    def handle(signum, frame):
        stopping["flag"] = True
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    print("[local_cluster] run folder %s; actor logs in %s/logs" % (logdir, logdir), flush=True)
    cluster.start()
    code = None
    while code is None and not stopping["flag"]:
        code = cluster.wait(timeout=0.5, on_actor_death=lambda i, rc: print(
            "[local_cluster] actor %d exited with code %s (see %s/logs/actor_%d.log)" % (i, rc, logdir, i),
            flush=True))
    if stopping["flag"]:
        print("[local_cluster] stopping: learner checkpoints, then everything exits", flush=True)
    cluster.stop()
    code = cluster.learner.returncode if code is None else code
    print("[local_cluster] done (learner exit code %s)" % code, flush=True)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
