"""Learner loss: a learner job that fails, or that loses a host, is restarted from the run's newest
checkpoint with the learners whose hosts answer, and grows back when a lost host answers again.

All learners are one mpirun job (Horovod averages every gradient over all ranks), so one dead rank
ends the job, and a rank whose host is cut off leaves the others waiting in an allreduce. The watch
loop (watch.monitor) therefore restarts the whole job:
  - the learners' mpirun exited with a failure (a rank was killed or crashed): up to
    --learner_restarts times, with the learners whose hosts answer now;
  - a learner host has not answered over SSH for --learner_host_lost_s: the job (stuck, or about
    to be) is ended and restarted without that host, K-1 ranks;
  - a left-out learner host answers again: its stale rank is ended, the learners are interrupted
    (each writes a checkpoint, as on Ctrl-C) and the job restarts with all of them.
A restart resumes from the newest checkpoint (--mode=train_w_load) when the new rank 0's host can
read one in the run folder, so the frame counter and the learning-rate schedule go on from there;
what was trained after that checkpoint is lost (at most --checkpoint_every_s of training). The
run folder must be on a path every learner host shares (as NFS) for rank 0 to change hosts.
Actor i feeds learner i % K, so every actor and the evaluator restart with the new learner list.

Every restart is appended to <logdir>/learner_restarts.json; --action=status, watch and stop read
it back (load_plan applies it), so they know which learners the job runs now.
"""
import dataclasses
import os
import shlex
import time

from absl import flags

import paramiko

from cluster import hosts as hosts_lib
from cluster import plan as plan_lib
from cluster.hosts import HostError
from cluster.launch import kill_window_script, learners_alive, prelude, start_windows_script
from tools.files import read_records, remove_if_there, write_json

flags.DEFINE_integer("learner_restarts", 3, "watch/--follow: restarts of the learner job after it failed (a rank "
                                            "died, or a learner host went silent) before the run is given up; "
                                            "0: a failed learner job ends the run.")
flags.DEFINE_float("learner_host_lost_s", 60.0, "watch/--follow: a learner host that has not answered over SSH for "
                                                "this many seconds is lost: the learner job restarts without it, "
                                                "from the newest checkpoint (0: never).")
flags.DEFINE_bool("learner_grow_back", True, "watch/--follow: when a learner host left out of the job answers "
                                             "again, interrupt the learners (they write a checkpoint) and restart "
                                             "them with it.")
FLAGS = flags.FLAGS
RESTARTS_FILE = "learner_restarts.json"
# mpirun exit statuses a restart cannot mend: bad input, and weights that stopped being finite
# (experiment.py's exit codes 2 and 7; training.NONFINITE_EXIT).
NO_RESTART = {"2": "bad input", "7": "the weights or gradients stopped being finite"}


@dataclasses.dataclass
class Restart:
    time: float
    learners: list     # positions of the CSV's learner rows the job runs now, in rank order
    hosts: list        # their hosts' labels, for the reader
    why: str
    resumed: str       # the checkpoint folder it resumed from, or "" (no checkpoint yet: from the start)


def restarts_path(logdir):
    return os.path.join(logdir, RESTARTS_FILE)


def read_restarts(logdir) -> list:
    """The restarts recorded in logdir, oldest first; [] when there are none."""
    return read_records(restarts_path(logdir), "restarts", Restart, "learner restarts",
                        "use the workers CSV's learners")


def forget_restarts(logdir):
    """A new start runs the CSV's learners: restarts of an earlier run in this folder are void."""
    remove_if_there(restarts_path(logdir))


def apply_restarts(plan, restarts):
    """Point the plan at the learners of the newest restart (the windows' commands as they run)."""
    if restarts:
        last = restarts[-1]
        if any(not 0 <= i < len(plan.csv_learners) for i in last.learners) or not last.learners:
            raise ValueError(f"{restarts_path(plan.logdir)}: learners {last.learners} do not fit the workers CSV's "
                             f"{len(plan.csv_learners)} learner row(s); move the file aside")
        plan_lib.reshape(plan, last.learners, resume=bool(last.resumed))


def describe_restarts(restarts) -> list:
    """status's lines for the run's history of learner restarts."""
    return [f"  {time.strftime('%H:%M:%S', time.localtime(r.time))} {len(r.learners)} learner(s) on "
            f"{', '.join(r.hosts)}, {'from ' + r.resumed if r.resumed else 'from the start (no checkpoint yet)'}: "
            f"{r.why}" for r in restarts]


def end_learners_script(plan, key) -> str:
    """TERM, up to 5 s, then KILL this run's learner ranks on this host: also a stale rank started
    with an older learner list (the marker does not name the learners)."""
    return (prelude(plan, key) + 'export OURS="learner-"\n'
            "pids=$(run_pids | awk '$3 == \"learner\" {print $1}')\n"
            "end_pids 50 $pids\ntrue\n")


def interrupt_learners_script(plan, key) -> str:
    return (prelude(plan, key) + 'export OURS="learner-"\n'
            "run_pids | awk '$2 == \"worker\" && $3 == \"learner\" {print $1}' | xargs -r kill -INT\ntrue\n")


class LearnerLoss:
    """The watch loop's memory of the learner hosts: who answered when, which are left out of the job,
    how many failures it restarted, which windows still run an older learner list."""

    def __init__(self, plan, hosts, say):
        self.plan, self.hosts, self.say = plan, hosts, say
        self.restarts = read_restarts(plan.logdir)
        self.failures = 0
        self.started = time.time()  # counts as everyone's answer: a host silent since is lost after the wait
        self.last_answer = {}
        self.outdated = {}  # window name -> the silent host it missed a new learner list on

    # -- what the watch loop calls --------------------------------------
    def observe(self, reachable, learners_pane) -> bool:
        """One poll's answers, while the learner job runs. -> True when the job was restarted (the
        poll's view of the windows is stale then)."""
        now = time.time()
        for key in reachable:
            self.last_answer[key] = now
        if FLAGS.learner_host_lost_s:
            silent = [k for k in self._job_hosts() if k != "local" and k not in reachable and
                      now - self.last_answer.get(k, self.started) >= FLAGS.learner_host_lost_s]
            if silent:
                labels = ", ".join(self.hosts[k].label for k in silent)
                return self.on_failure(reachable, f"learner host {labels} has not answered for "
                                                  f"{now - self.last_answer.get(silent[0], self.started):.0f} s "
                                                  f"(--learner_host_lost_s)")
        back = [k for k in self._left_out() if k in reachable]
        if back and FLAGS.learner_grow_back and learners_pane is not None and learners_pane.alive:
            return self._grow_back(reachable, back)  # restarts every worker, those outdated too
        self._refresh_outdated(reachable)
        return False

    def on_exit(self, status, reachable) -> bool:
        """The learner job ended with mpirun's `status`: True when it was restarted, False when the
        run ends (finished, a failure no restart mends, or the restarts used up)."""
        if status == "0":
            return False
        if status in NO_RESTART:
            self.say(f"the learners failed with status {status} ({NO_RESTART[status]}): not restarting them")
            return False
        return self.on_failure(reachable, f"the learners' mpirun exited with status {status or '?'}")

    def on_failure(self, reachable, why) -> bool:
        if self.failures >= FLAGS.learner_restarts:
            self.say(f"{why}; not restarting the learners (restarted {self.failures} time(s) already, "
                     f"--learner_restarts={FLAGS.learner_restarts})")
            return False
        self.failures += 1
        return self.restart(reachable, f"{why} (restart {self.failures}/{FLAGS.learner_restarts})")

    # -- the restart ----------------------------------------------------
    def restart(self, reachable, why) -> bool:
        keep = [i for i, w in enumerate(self.plan.csv_learners) if hosts_lib.host_key(w) in reachable]
        if not keep:
            self.say(f"{why}; no learner host answers, so the learners cannot restart")
            return False
        t0 = time.time()
        self.say(f"{why}: restarting the learners on {self._labels(keep)}")
        self._end_job(reachable)
        resumed = self._checkpoint_dir(keep[0])
        plan_lib.reshape(self.plan, keep, resume=bool(resumed))
        self._restart_workers(reachable)
        try:  # _end_job closed the old learners window
            self._run(self.hosts["local"], start_windows_script([self.plan.learners_window], self.plan))
        except RuntimeError as e:
            self.say(f"could not start the learners again: {e}")
            return False
        self.restarts.append(Restart(time=time.time(), learners=keep, hosts=self._labels(keep).split(", "),
                                     why=why, resumed=resumed))
        write_json(restarts_path(self.plan.logdir), {"restarts": [dataclasses.asdict(r) for r in self.restarts]},
                   indent=2)
        self.say(f"learners restarted in {time.time() - t0:.1f} s: {len(keep)} rank(s), "
                 + (f"resuming from the newest checkpoint in {resumed}" if resumed else
                    "from the start (no checkpoint was written yet)") + f"; log {self.plan.learners_window.log}")
        return True

    def _grow_back(self, reachable, back) -> bool:
        # A rank left running behind a network partition holds its port: it must be gone first. A
        # host that answered the poll may still refuse this (its SSH server still busy with the
        # sessions that hung while it was cut off): then it is tried again at the next poll.
        back = [key for key in back if self._try(key, end_learners_script(self.plan, key))]
        if not back:
            return False
        labels = ", ".join(self.hosts[k].label for k in back)
        self.say(f"learner host {labels} answers again: interrupting the learners (they write a checkpoint) "
                 f"to restart them with it")
        for key in self._job_hosts():
            if key in reachable:
                self._try(key, interrupt_learners_script(self.plan, key))
        deadline = time.time() + FLAGS.stop_timeout_s
        while learners_alive(self.plan) and time.time() < deadline:
            time.sleep(0.5)
        return self.restart({k for k in reachable if k not in self._left_out() or k in back},
                            f"learner host {labels} answers again")

    def _end_job(self, reachable):
        """mpirun and the ranks under it here, then any rank left on the job's other hosts that answer."""
        self._try("local", kill_window_script(self.plan, "local", ["learners"]))
        for key in self._job_hosts() | self._left_out():
            if key in reachable:
                self._try(key, end_learners_script(self.plan, key))

    def _restart_workers(self, reachable):
        """Every actor and evaluator window, with the new learner list; those on silent hosts when
        their host answers (or when an actor move starts them elsewhere with the new command)."""
        by_host = {}
        for w in self.plan.first_windows:
            by_host.setdefault(w.host, []).append(w)
        for key, windows in by_host.items():
            if key in reachable and self._respawn(key, windows):
                for w in windows:
                    self.outdated.pop(w.name, None)
            else:
                self.outdated.update({w.name: key for w in windows})

    def _refresh_outdated(self, reachable):
        for w in self.plan.first_windows:  # an actor moved off the silent host started with the new list
            if w.name in self.outdated and self.outdated[w.name] != w.host:
                del self.outdated[w.name]
        stale = [w for w in self.plan.first_windows if w.name in self.outdated and w.host in reachable]
        for key in {w.host for w in stale}:
            windows = [w for w in stale if w.host == key]
            if self._respawn(key, windows):
                for w in windows:
                    del self.outdated[w.name]
                self.say(f"{', '.join(w.title for w in windows)} on {self.hosts[key].label} restarted with the "
                         f"learners' new list")

    def _checkpoint_dir(self, position) -> str:
        """The run's checkpoint folder when the host of the learner at `position` (the new rank 0)
        can read a checkpoint index in it, else ""."""
        folder = os.path.join(self.plan.logdir, "checkpoints")
        key = hosts_lib.host_key(self.plan.csv_learners[position])
        try:
            rc, _, _ = self.hosts[key].run(f"test -s {shlex.quote(os.path.join(folder, 'checkpoint'))}",
                                           timeout=max(FLAGS.ssh_timeout_s, 5.0))
        except (OSError, HostError, paramiko.SSHException):
            return ""
        return folder if rc == 0 else ""

    # -- helpers ----------------------------------------------------------
    def _respawn(self, key, windows) -> bool:
        """Close these windows on this host and open them again with their (new) commands."""
        return self._try(key, kill_window_script(self.plan, key, [w.name for w in windows]) +
                         start_windows_script(windows, self.plan))

    def _job_hosts(self) -> set:
        return {hosts_lib.host_key(w) for w in self.plan.cluster.learners}

    def _left_out(self) -> set:
        return {hosts_lib.host_key(w) for w in self.plan.csv_learners} - self._job_hosts()

    def _labels(self, positions) -> str:
        keys = []
        for i in positions:
            key = hosts_lib.host_key(self.plan.csv_learners[i])
            if key not in keys:
                keys.append(key)
        return ", ".join(self.hosts[k].label for k in keys)

    def _try(self, key, script) -> bool:
        try:
            self._run(self.hosts[key], script)
            return True
        except RuntimeError as e:
            self.say(f"warning: {self.hosts[key].label}: {e}")
            return False

    @staticmethod
    def _run(host, script):
        try:
            rc, out, err = host.run(script, timeout=max(FLAGS.ssh_timeout_s, 30.0))
        except (OSError, HostError, paramiko.SSHException) as e:
            raise RuntimeError(str(e) or type(e).__name__) from None
        if rc != 0:
            raise RuntimeError(f"exit {rc}: {(err or out).strip()[-300:]}")
        return out
