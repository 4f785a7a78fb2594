"""The cluster frontend: a workers CSV in, a training run started, watched or stopped.

    python run_experiment_mm_raw.py --workers_csv_path=sandbox/local_workers_example.csv \\
        --level_name=CartPole-v1 --agent_name=MLPAgent --batch_size=32 --unroll_length=20
    python run_experiment_mm_raw.py --workers_csv_path=... --action=status   # who is alive
    python run_experiment_mm_raw.py --workers_csv_path=... --action=watch    # restart dead actors; move a lost host's actors
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
  5. Wait for each learner to listen, then check from every actor host that it can open
     a TCP connection to its learner's port; name each failing pair (exit 1, the run
     goes on).
Each worker's output goes to <logdir>/logs/<job>_<i>.log on its own host (and mpirun's
to logs/learners.log here); `tmux attach -t impala` shows the windows.

`stop` interrupts every worker (SIGINT, as Ctrl-C would: learners write their
checkpoint), waits up to --stop_timeout_s, then kills what is left and closes the tmux
sessions of every host. The run's processes on a host are those under its tmux panes
plus any whose command line holds this run's --actor_hosts list
(e.g. learner ranks that mpirun started on another host).

The same shell snippets run here (bash) and on remote hosts (bash over SSH), so one
code path serves both.

Where things are: plan.py (CSV + flags -> commands, --dry_run's listing), hosts.py
(this machine and SSH hosts), launch.py (tmux/process shell snippets, start, stop),
reach.py (can each actor host open a TCP connection to its learner?), watch.py (status,
and the loop that restarts dead actors), hostloss.py (the actors of a lost host move to the
others), learnerloss.py (a failed learner job restarts from its newest checkpoint with the
learner hosts that answer). This file: the flags of the actions and main.
"""
import os
import signal
import sys

from absl import app
from absl import flags

from cluster import hostloss
from cluster import hosts as hosts_lib
from cluster import launch
from cluster import learnerloss
from cluster import plan as plan_lib
from cluster import reach
from cluster import watch
from cluster import workers_csv
from cluster.plan import EXIT_BAD_INPUT, UsageError
from tools.digits import strict_number_flags

flags.DEFINE_string("workers_csv_path", None, "The workers CSV (see workers_csv.py and sandbox/).")
flags.DEFINE_enum("action", "start", ["start", "stop", "status", "watch"],
                  "start: check, then start actors and learners. stop: end the run's processes and "
                  "tmux sessions of every host. status: which workers are alive. watch: restart dead "
                  "actors (up to --max_restarts each), move the actors of a host silent for "
                  "--actor_host_lost_s to the other actor hosts, and restart a failed learner job from its "
                  "newest checkpoint (--learner_restarts), until the learners exit.")
flags.DEFINE_bool("dry_run", False, "Check everything and print the plan and every command; start nothing.")
flags.DEFINE_bool("follow", False, "After start (or with watch): print the learners' log here and restart "
                                   "dead actors until the learners exit; Ctrl-C stops the whole run.")
flags.DEFINE_string("logdir", None, "Run directory, also passed to experiment.py. Relative paths are relative "
                                    "to --repo_dir. Default: results/<level_name>_<unix time>.")
for _module in (hosts_lib, plan_lib, launch, reach, watch, hostloss, learnerloss):  # their flags show in --help too
    flags.adopt_module_key_flags(_module)
FLAGS = flags.FLAGS
strict_number_flags(FLAGS)  # absl's int() and float() would read --max_restarts=３ as 3

# Kept importable from here (tests and tools used these names).
experiment_flag_names = plan_lib.experiment_flag_names


def parse_flags(argv):
    """absl parses the frontend's flags; what it does not know are training flags."""
    try:
        rest = FLAGS(argv, known_only=True)
    except flags.Error as e:
        print(f"error: {e}\nSee --helpfull.", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    return rest


def load_plan(argv):
    """The CSV, the training flags and the logdir -> the Plan; UsageError on bad input."""
    if not FLAGS.workers_csv_path:
        raise UsageError("--workers_csv_path is required (see sandbox/local_workers_example.csv)")
    training_flags = plan_lib.split_training_flags(argv[1:])
    try:
        cluster = workers_csv.load(FLAGS.workers_csv_path)
    except workers_csv.WorkersCsvError as e:
        raise UsageError(str(e)) from None
    for warning in cluster.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    plan_lib.check_plan(cluster)
    FLAGS.repo_dir = os.path.abspath(FLAGS.repo_dir)
    if FLAGS.action == "start":
        level = plan_lib.check_training_flags(cluster, training_flags) if FLAGS.check_flags else None
        logdir = FLAGS.logdir or plan_lib.default_logdir(training_flags, level)
    else:  # the logdir only names log files in messages; start noted it in the tmux session
        logdir = FLAGS.logdir or launch.session_logdir() or "(unknown logdir: pass --logdir)"
    logdir = os.path.normpath(os.path.join(FLAGS.repo_dir, logdir))
    plan = plan_lib.make_plan(cluster, training_flags, logdir)
    if FLAGS.action != "start":  # where a watch restarted the learners or moved actors, look for them there
        try:
            learnerloss.apply_restarts(plan, learnerloss.read_restarts(logdir))
            hostloss.apply_moves(plan, hostloss.read_moves(logdir))
        except ValueError as e:
            raise UsageError(str(e)) from None
    return plan


def start(plan, hosts) -> int:
    try:
        launch.preflight(plan, hosts)
    except UsageError as e:
        print(f"error: nothing was started:\n{e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    plan_lib.print_plan(plan, {k: h.label for k, h in hosts.items()})
    if FLAGS.dry_run:
        print("dry run: all checks passed; nothing was started")
        return 0
    hostloss.forget_moves(plan.logdir)
    learnerloss.forget_restarts(plan.logdir)
    learners_log = plan.learners_window.log
    offset = os.path.getsize(learners_log) if os.path.exists(learners_log) else 0
    rc = launch.start(plan, hosts)
    if rc:
        return rc
    try:
        if not reach.check_after_start(plan, hosts, lambda: launch.learners_alive(plan),
                                       say=lambda m: print(m, flush=True)):
            rc = 1
            print("the run goes on (actors retry); fix the path or end it with --action=stop", flush=True)
    except KeyboardInterrupt:
        if not FLAGS.follow:
            print("Ctrl-C: reachability check skipped; the run goes on (--action=stop ends it)", flush=True)
            return 130
        print("Ctrl-C: stopping the run", flush=True)
        return launch.stop(plan, hosts) or 130
    if not FLAGS.follow:
        return rc
    return watch.monitor(plan, hosts, tail_from=offset, stop_at_end=True)


def main(argv):
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited as ignored
    try:
        plan = load_plan(argv)
        # start needs every host; stop and status do what they can and say what not; watch keeps
        # asking a silent host (its actors move after --actor_host_lost_s, and it may come back)
        hosts = hosts_lib.connect_hosts(plan.cluster, strict=FLAGS.action == "start",
                                        keep_unreachable=FLAGS.action == "watch")
    except (UsageError, hosts_lib.HostError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    unreachable = {w.host for w in plan.windows} - set(hosts)
    try:
        if FLAGS.action == "start":
            return start(plan, hosts)
        if FLAGS.action == "stop":
            return max(launch.stop(plan, hosts), 1 if unreachable else 0)
        if FLAGS.action == "status":
            return max(watch.status(plan, hosts), 1 if unreachable else 0)
        return watch.monitor(plan, hosts, tail_from=0 if FLAGS.follow else None, stop_at_end=FLAGS.follow)
    finally:
        hosts_lib.close_hosts(hosts)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
