"""Watch: which workers are alive (--action=status), and the loop that restarts dead
actors until the learners exit (--action=watch, --follow); an actor host that stops
answering has its actors moved to the others (hostloss.py); a learner job that fails or
loses a host restarts from its newest checkpoint with the learners that answer
(learnerloss.py).

An actor window whose command exited with status 0 is finished, not dead: actors exit 0
when their learner closed its queue (the run reached its frame budget) or when they were
interrupted on purpose, so the loop leaves them alone. Any other exit (a crash, kill -9,
exit 3 after the learner stayed away) is restarted, up to --max_restarts times.
"""
import concurrent.futures
import dataclasses
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from absl import flags

import paramiko

from cluster import hostloss
from cluster import learnerloss
from cluster import hosts as hosts_lib
from cluster import reach
from cluster.hosts import HostError
from cluster.launch import prelude, status_script, stop

flags.DEFINE_integer("max_restarts", 3, "watch/--follow: restarts of one dead actor before giving up on it.")
flags.DEFINE_float("watch_interval_s", 10.0, "watch/--follow: seconds between checks of the workers.")
flags.DEFINE_float("watch_timeout_s", 0.0, "watch: stop watching after this many seconds (0: until the "
                                           "learners exit or Ctrl-C).")
FLAGS = flags.FLAGS


@dataclasses.dataclass
class PaneState:
    alive: bool
    pid: int
    exit_status: str


def _ask(plan, key, host):
    """One host's status script; its output, or None (said on stderr) when it does not answer in
    --ssh_timeout_s (a host that is gone leaves an SSH channel waiting, not an error)."""
    try:
        return host.run(status_script(plan, key), timeout=max(FLAGS.ssh_timeout_s, 5.0))[1]
    except (OSError, HostError, paramiko.SSHException, subprocess.TimeoutExpired) as e:
        print(f"warning: cannot reach {host.label}: {e or type(e).__name__}", file=sys.stderr)
        return None


def poll(plan, hosts):
    """-> ({(host key, window): PaneState}, {host key: [(job, task, (machine, pid))] of worker
    processes}, {(host key, window): newest connect line of that actor's log}). A host that
    cannot be reached now is missing from the second dict. The hosts are asked all at once, so
    one that is gone delays the answer by --ssh_timeout_s at most, not once per host."""
    panes, procs, states = {}, {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        answers = dict(zip(hosts, pool.map(lambda kv: _ask(plan, *kv), hosts.items())))
    for key, out in answers.items():
        if out is None:
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
            elif section == "#reach" and parts:
                name, _, rest = line.partition(" ")
                states[(key, name)] = rest.strip()
    return panes, procs, states


def status(plan, hosts) -> int:
    panes, procs, states = poll(plan, hosts)
    labels = {k: h.label for k, h in hosts.items()}
    ok = True
    print(f"run {FLAGS.tmux_sess!r} from {plan.cluster.path}:")
    lw = plan.learners_window
    p = panes.get(("local", "learners"))
    learner_hosts = {hosts_lib.host_key(w) for w in plan.cluster.learners}
    # a set: two host entries may be one machine (then both see the same processes)
    ranks = len({pid for key, ps in procs.items() if key in learner_hosts for job, _, pid in ps if job == "learner"})
    k = len(plan.cluster.learners)
    if p and p.alive:
        print(f"  learners  mpirun alive (pid {p.pid}); learner processes found: {ranks}/{k}")
        ok &= ranks == k
    else:
        ok = False
        print(f"  learners  {_dead(p)}  log: {lw.log}")
    alive = not_connected = 0
    for w in plan.actor_windows:
        p = panes.get((w.host, w.name))
        a = plan.cluster.actors[int(w.name.split("_")[1])]
        if w.host not in procs:
            print(f"  {w.title:<9} UNKNOWN (cannot reach {w.host})")
        elif p and p.alive:
            alive += 1
            moved = hosts_lib.host_key(a) != w.host  # the CSV's row names the host it left
            print(f"  {w.title:<9} alive (pid {p.pid})  {'moved here from ' if moved else ''}{a.address} -> learner "
                  f"{a.index % k}  on {labels[w.host]}")
            state = states.get((w.host, w.name), "")
            if reach.never_connected(state):
                not_connected += 1
                print(f"            NOT CONNECTED to learner {plan.cluster.learners[a.index % k].address}: "
                      f"{state or 'no connection yet (its log says nothing about it)'}")
        else:
            print(f"  {w.title:<9} {_dead(p)}  on {labels[w.host]}  log: {w.log}")
    ok &= alive == len(plan.actor_windows) and not not_connected
    for w in plan.evaluator_windows:
        p = panes.get((w.host, w.name))
        if w.host not in procs:
            print(f"  {w.title:<9} UNKNOWN (cannot reach {w.host})")
        elif p and p.alive:
            print(f"  {w.title:<9} alive (pid {p.pid})  plays learner 0's policy  on {labels[w.host]}  log: {w.log}")
        else:
            ok &= bool(p) and p.exit_status == "0"
            print(f"  {w.title:<9} {_dead(p)}  on {labels[w.host]}  log: {w.log}")
    print(f"summary: learners {'up' if panes.get(('local', 'learners'), PaneState(False, 0, '')).alive else 'down'},"
          f" {alive}/{len(plan.actor_windows)} actors alive"
          + (f", {not_connected} of them not connected to their learner" if not_connected else ""))
    restarts = learnerloss.read_restarts(plan.logdir)
    if restarts:
        print(f"learner job restarts ({len(restarts)}; {learnerloss.restarts_path(plan.logdir)}):")
        print("\n".join(learnerloss.describe_restarts(restarts)))
    moves = hostloss.read_moves(plan.logdir)
    if moves:
        print(f"actors moved off lost hosts ({len(moves)}; {hostloss.moves_path(plan.logdir)}):")
        print("\n".join(hostloss.describe_moves(moves, labels)))
    print_telemetry(plan.logdir)
    return 0 if ok else 1


def print_telemetry(logdir):
    """The learners' newest per-worker table (<logdir>/telemetry/rank<r>.json, written every log period),
    where the run folder is readable from here (the learner's host, or a shared path)."""
    for path in sorted(glob.glob(os.path.join(logdir, "telemetry", "rank*.json"))):
        try:
            with open(path) as f:
                snap = json.load(f)
        except (OSError, ValueError):
            continue
        print(f"telemetry of learner {snap['rank']} ({os.path.relpath(path, logdir)}, {time.time() - snap['time']:.0f} s "
              f"old, {snap['frames']:,} frames): bottleneck {snap['bottleneck']}")
        print(f"  {'worker':<11} {'host':<16} {'cpu %':>6} {'rss MB':>7} {'rate':>18}  time shares")
        for w in snap["workers"]:
            shares = " ".join(f"{name} {100 * w[k]:.0f}%" for name, k in zip(w["shares"].split(","),
                                                                            ("share_a", "share_b", "share_c")))
            if w["share_a"] != w["share_a"]:
                shares = "sent nothing in the last period"
            extra = f" queue {100 * w['queue_fill']:.0f}%" if w.get("queue_fill") is not None else ""
            print(f"  {w['worker']:<11} {w['host'][:16]:<16} {w['cpu_percent']:>6.0f} {w['rss_mb']:>7.0f} "
                  f"{w['rate']:>10,.0f} {w['rate_unit']:<9} {shares}{extra}")


def _dead(p):
    if p is None:
        return "NOT RUNNING (no tmux window)"
    if p.exit_status == "0":
        return "FINISHED (exit status 0)"
    return "DEAD" + (f" (exit status {p.exit_status})" if p.exit_status else "")


def monitor(plan, hosts, tail_from=None, stop_at_end=False) -> int:
    """The watch loop: restart dead actors (up to --max_restarts each) until the learners
    exit; with tail_from (a byte offset), also print the learners' log from there.
    stop_at_end (--follow): when the learners exit, or on Ctrl-C/SIGTERM, stop the run."""
    restarts = {w.name: 0 for w in plan.actor_windows}
    said = {}  # window -> the connect line last reported
    loss = hostloss.HostLoss(plan, hosts, _say)
    relearn = learnerloss.LearnerLoss(plan, hosts, _say)
    t0, next_poll = time.time(), 0.0
    # SIGINT may be inherited as ignored (a background job of a non-interactive shell),
    # in which case Python raises no KeyboardInterrupt: install the default handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if stop_at_end:
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    _say(_banner(plan, stop_at_end))
    try:
        while True:
            if tail_from is not None:
                tail_from = _print_new(plan.learners_window.log, tail_from)
            if time.time() >= next_poll:
                next_poll = time.time() + FLAGS.watch_interval_s
                panes, reachable, states = poll(plan, hosts)  # reachable: keyed by the hosts that answered
                learners = panes.get(("local", "learners"))
                if learners is None:
                    _say(f"no tmux window {FLAGS.tmux_sess}:learners on this machine: the run was not started "
                         f"or is stopped")
                    return 1
                if not learners.alive and relearn.on_exit(learners.exit_status, reachable):
                    _reset(restarts)  # every actor was restarted with the new learner list
                    continue
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
                if relearn.observe(reachable, learners):
                    _reset(restarts)
                    continue
                moved = loss.observe(reachable, panes)
                restart_dead_actors(plan, hosts, panes, reachable, restarts, skip=moved)
                report_connections(plan, hosts, panes, states, said)
            if FLAGS.watch_timeout_s and time.time() - t0 > FLAGS.watch_timeout_s and not stop_at_end:
                _say("--watch_timeout_s reached; workers keep running")
                return 0
            time.sleep(0.5 if tail_from is not None else min(1.0, FLAGS.watch_interval_s))
    except KeyboardInterrupt as e:
        if stop_at_end:
            _say(f"{'SIGTERM' if isinstance(e, _Terminated) else 'Ctrl-C'}: stopping the run")
            return stop(plan, hosts) or 130
        _say("Ctrl-C: no longer watching; the workers keep running")
        return 130


def _banner(plan, stop_at_end):
    moving = (f"moving the actors of a host silent for {FLAGS.actor_host_lost_s:g} s; " if FLAGS.actor_host_lost_s
              else "")
    relearning = (f"restarting a failed learner job up to {FLAGS.learner_restarts} time(s) from its newest "
                  f"checkpoint; " if FLAGS.learner_restarts else "")
    return (f"watching {len(plan.actor_windows)} actor(s) every {FLAGS.watch_interval_s:g} s, restarting each up "
            f"to {FLAGS.max_restarts} time(s); {moving}{relearning}Ctrl-C "
            f"{'stops the run' if stop_at_end else 'ends watching (workers keep running)'}")


def _reset(restarts):
    for name in restarts:
        restarts[name] = 0


def restart_dead_actors(plan, hosts, panes, reachable, restarts, skip=()):
    """respawn-pane each dead actor window, at most --max_restarts times per actor; an
    actor that exited 0 is finished and stays so. skip: windows just opened elsewhere (this
    poll's panes predate them)."""
    for w in plan.actor_windows:
        p = panes.get((w.host, w.name))
        if (p is not None and p.alive) or w.host not in reachable or restarts[w.name] < 0 or w.name in skip:
            continue
        label = hosts[w.host].label
        if p is None:
            _say(f"{w.title} on {label}: no tmux window; cannot restart it")
            restarts[w.name] = -1  # said once
        elif p.exit_status == "0":  # its learner finished (closed the queue), or it was stopped on purpose
            _say(f"{w.title} on {label} finished (exit status 0); not restarting it")
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


def report_connections(plan, hosts, panes, states, said):
    """Say each new 'cannot reach learner' line of a live actor's log, and when it connects."""
    for w in plan.actor_windows:
        p, state = panes.get((w.host, w.name)), states.get((w.host, w.name), "")
        if p is None or not p.alive or not state or state == said.get(w.name, ""):
            continue
        if not reach.never_connected(state):
            if said.get(w.name):  # only after a reported problem
                _say(f"{w.title} on {hosts[w.host].label}: {state}")
        else:
            _say(f"{w.title} on {hosts[w.host].label} has not connected: {state}")
        said[w.name] = state


def _say(msg):
    print(f"[watch {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _Terminated(KeyboardInterrupt):
    """SIGTERM in --follow: stops the run as Ctrl-C does, and says which it was."""


def _raise_keyboard_interrupt(signum, frame):
    raise _Terminated


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


