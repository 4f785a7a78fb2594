"""Launch and stop: the shell snippets that open tmux windows on a host and find, signal
and kill the run's processes there, and the start/stop actions built on them.

Every snippet is one bash script that runs the same way here (LocalHost) and on a remote
host (RemoteHost, over SSH): prelude() defines $T (tmux), $S (session), run_pids and
alive. The run's processes on a host are those under its tmux panes plus any whose
command line holds this run's --actor_hosts list (e.g. learner ranks
that mpirun started on another host).
"""
import os
import shlex
import signal
import socket
import sys
import time

from absl import flags

import paramiko

from cluster import hosts as hosts_lib
from cluster import reach
from cluster.hosts import HostError, LocalHost
from cluster.plan import UsageError, write_cluster_json

flags.DEFINE_float("stop_timeout_s", 60.0, "stop: seconds the workers get to exit after SIGINT before they "
                                           "are killed.")
FLAGS = flags.FLAGS


# ---------------------------------------------------------------------------
# 1. Shell snippets: tmux windows and the run's processes on one host
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
# end_pids TRIES PID...: TERM them, give them TRIES tenths of a second, KILL the rest; true when it
# had to KILL.
end_pids() {
  local tries=$1 i p left=""; shift
  [ $# -gt 0 ] || return 1
  kill -TERM "$@" 2>/dev/null
  for i in $(seq "$tries"); do
    left=""; for p in "$@"; do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && return 1; sleep 0.1
  done
  kill -KILL $left 2>/dev/null
}
"""


def prelude(plan=None, key=None) -> str:
    """Shell definitions every script starts with: $T (tmux), $S (session), run_pids, alive.
    key: the host the script runs on (which workers belong there)."""
    tmux = "tmux" + (f" -L {FLAGS.tmux_socket}" if FLAGS.tmux_socket else "")
    ours = []
    if plan is not None:
        # every learner row's host, also one a restarted job left out (learnerloss.py): a rank left
        # running there behind a partition is still this run's
        ours += ["learner-"] if any(hosts_lib.host_key(w) == key for w in plan.csv_learners or plan.cluster.learners) \
            else []
        # the actors' and the evaluator's windows, not the CSV: one moved off a lost host runs where
        # its window is now
        ours += [f"actor-{w.name.split('_', 1)[1]}" for w in plan.actor_windows if w.host == key]
        ours += ["evaluator-"] if any(w.host == key for w in plan.evaluator_windows) else []
    return (f"T={shlex.quote(tmux)}\n"
            f"S={shlex.quote(FLAGS.tmux_sess)}\n"
            f"export MARK={shlex.quote(plan.marker if plan else '')} OURS={shlex.quote(' '.join(ours))}\n"
            + RUN_PIDS_SH)


def pane_script(window, plan) -> str:
    """What runs in a tmux window: the command, its output tee'd to the log (tee -i: it
    ignores Ctrl-C, so the worker's last words still reach the log), its exit status noted
    in the log and in the pane's tmux option @exit_status (tmux's own pane_dead_status is
    lost after a respawn-pane). Before the pane ends, the wrapper closes tee's pipe and waits
    for it: a pane that closes first takes tee with it, and the status line with tee."""
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in window.env.items())
    stamp = "$(date '+%F %T')"
    return (f"exec > >(exec tee -ai {shlex.quote(window.log)}) 2>&1\n"
            f"tee_pid=$!\n"
            f"tmux set-option -p -t \"$TMUX_PANE\" -u @exit_status 2>/dev/null\n"
            f"cd {shlex.quote(FLAGS.repo_dir)} || exit 97\n"
            f"echo \"[frontend] {stamp} starting {window.title} (tmux {FLAGS.tmux_sess}:{window.name})\"\n"
            f"{env}{shlex.join(window.argv)}\n"
            f"rc=$?\n"
            f"echo \"[frontend] {stamp} {window.title} exited with status $rc\"\n"
            f"tmux set-option -p -t \"$TMUX_PANE\" @exit_status $rc 2>/dev/null\n"
            f"exec >&- 2>&-\n"
            f"wait $tee_pid\n"
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
    elif any(hosts_lib.host_key(w) == key for w in plan.cluster.learners):  # mpirun's ssh starts orted there
        checks.append('command -v orted >/dev/null 2>&1 || echo "orted (Open MPI) is not on the PATH of '
                      'non-interactive SSH logins (apt-get install openmpi-bin)"')
    return "\n".join(checks) + "\ntrue\n"


def status_script(plan, key) -> str:
    """'#machine <boot id> <PID namespace>' (to tell hosts that are the same machine and
    process table apart: containers share a boot id), '#panes' lines
    "window pid dead exit_status", '#procs' lines (run_pids), then '#reach' lines: each
    actor window here and the newest line of its log about connecting to its learner."""
    return prelude(plan, key) + """
echo "#machine $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || hostname) $(readlink /proc/self/ns/pid)"
echo '#panes'
$T list-panes -s -t "=$S" -F '#{window_name} #{pane_pid} #{pane_dead} #{@exit_status}' 2>/dev/null
echo '#procs'
run_pids
echo '#reach'
""" + reach.log_lines_script([w for w in plan.actor_windows if w.host == key]) + "true\n"


def kill_window_script(plan, key, names) -> str:
    """End the named windows on this host and every process under them: TERM, up to 5 s, then KILL
    (for the copies of actors that were moved away while this host did not answer)."""
    lines = [prelude(plan, key), "pids="]
    for name in names:
        lines.append(f'root=$($T list-panes -t "=$S:"{shlex.quote(name)} -F "#{{pane_dead}} #{{pane_pid}}" '
                     f"2>/dev/null | awk '$1 == 0 {{print $2}}')")  # a dead pane's pid may be another's now
        lines.append('[ -n "$root" ] && pids="$pids $root $(ps -e -o pid=,ppid= | awk -v r="$root" '
                     "'{par[$1] = $2} END {for (p in par) {a = p; while (a in par && a != r) a = par[a]; "
                     "if (a == r && p != r) print p}}')\"")
    lines.append("end_pids 50 $pids")
    lines += [f'$T kill-window -t "=$S:"{shlex.quote(name)} 2>/dev/null' for name in names]
    return "\n".join(lines) + "\ntrue\n"


def learners_alive(plan) -> bool:
    """Is mpirun's tmux window (on this machine) still running its command?"""
    rc, out, _ = LocalHost().run(prelude(plan, "local") + '$T list-panes -t "=$S:learners" -F "#{pane_dead}"\n')
    return rc == 0 and out.strip() == "0"


def interrupt_script(plan, key) -> str:
    return (prelude(plan, key) +
            'run_pids | while read -r pid kind job task; do\n'
            '  [ "$kind" = worker ] && kill -INT "$pid" 2>/dev/null && echo "$job $task $pid"\n'
            'done\ntrue\n')


def finish_script(plan, key) -> str:
    """TERM then KILL whatever of the run is left, let the panes' wrappers log the exit
    statuses (up to 5 s), close the session, print survivors."""
    return prelude(plan, key) + """
pids=$(run_pids | awk '{print $1}')
end_pids 30 $pids && sleep 0.3
# Let each pane's wrapper write its "exited with status" line to the log before the session goes.
for i in $(seq 50); do
  $T list-panes -s -t "=$S" -F '#{pane_dead}' 2>/dev/null | grep -q '^0$' || break
  sleep 0.1
done
$T kill-session -t "=$S" 2>/dev/null
sleep 0.2
for p in $pids; do alive "$p" && echo "left $p $(ps -o args= -p "$p" | cut -c1-120)"; done
run_pids | while read -r pid kind job task; do echo "left $pid $(ps -o args= -p "$pid" | cut -c1-120)"; done
true
"""


# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# 2. Actions: preflight, start, stop
# ---------------------------------------------------------------------------

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
    """Actors first (each host's in one script), then mpirun; on any failure, stop it all."""
    labels = {k: h.label for k, h in hosts.items()}
    write_cluster_json(plan, labels)
    learners_log = plan.learners_window.log
    try:
        for key in [k for k in hosts if any(w.host == k for w in plan.first_windows)]:
            windows = [w for w in plan.first_windows if w.host == key]
            _run_or_raise(hosts[key], start_windows_script(windows, plan), f"starting actors on {labels[key]}")
            extra = " and the evaluator" if any(w in plan.evaluator_windows for w in windows) else ""
            print(f"started {sum(w in plan.actor_windows for w in windows)} actor(s){extra} on {labels[key]}: "
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
    return 0


def session_logdir():
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


