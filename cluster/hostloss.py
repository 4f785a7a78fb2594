"""Actor and evaluator host loss: when such a host stops answering, its actors and its evaluator
move to the actor hosts that still answer, and their stale copies go when the lost host answers
again.

The watch loop (watch.monitor) polls every host over SSH. A host that has not answered for
--actor_host_lost_s is lost: each of its actor windows (and the evaluator's) is opened on the
surviving actor host with the fewest of them, under the same --task (so it feeds the same
learner under the same id, and the learner's `actors alive/n` comes back). Nothing is trained
twice: what died with the host was never sent, and a moved actor's copy left running behind a
network partition sends unrolls of its own, never the same ones; when that host answers again its
copies of moved actors are killed, so the run is back to one process per actor.

Every move is appended to <logdir>/actor_moves.json, which --action=status, watch and stop
read back (load_plan applies it), so they look for each actor where it runs now.
"""
import dataclasses
import os
import sys
import time

from absl import flags

import paramiko

from cluster.hosts import HostError
from cluster.launch import kill_window_script, start_windows_script
from tools.files import read_records, remove_if_there, write_json

flags.DEFINE_float("actor_host_lost_s", 30.0, "watch/--follow: an actor or evaluator host that has not answered "
                                              "over SSH for this many seconds is lost; its actors and evaluator "
                                              "are started on the actor hosts that still answer (0: never move "
                                              "them).")
FLAGS = flags.FLAGS
MOVES_FILE = "actor_moves.json"


@dataclasses.dataclass
class Move:
    time: float
    actor: str      # window name: actor_<i>, or evaluator_0
    from_key: str
    to_key: str
    why: str


def moves_path(logdir):
    return os.path.join(logdir, MOVES_FILE)


def read_moves(logdir) -> list:
    """The moves recorded in logdir, oldest first; [] when there are none."""
    return read_records(moves_path(logdir), "moves", Move, "actor moves", "use the workers CSV's placement")


def forget_moves(logdir):
    """A new start follows the workers CSV again: moves of an earlier run in this folder are void."""
    remove_if_there(moves_path(logdir))


def movable_windows(plan):
    """The windows a lost host's work moves in: the actors' and the evaluator's."""
    return plan.actor_windows + plan.evaluator_windows


def apply_moves(plan, moves):
    """Put each moved actor or evaluator window on the host it was moved to last."""
    by_name = {w.name: w for w in movable_windows(plan)}
    for m in moves:
        if m.actor in by_name:
            by_name[m.actor].host = m.to_key


class HostLoss:
    """The watch loop's memory of who answered when, and what it moved where."""

    def __init__(self, plan, hosts, say):
        self.plan, self.hosts, self.say = plan, hosts, say
        self.moves = read_moves(plan.logdir)
        self.started = time.time()  # counts as everyone's answer: a host silent since is lost after the wait
        self.last_answer = {}
        self.lost = set()      # actor or evaluator hosts declared lost and not heard from since
        self.stranded = set()  # lost hosts whose actors had nowhere to go (said once)

    def observe(self, reachable, panes) -> set:
        """One poll's answers: note who answered, declare hosts lost, move their actors, and
        end stale copies on a host that is back. -> the names of the windows moved now."""
        now, before = time.time(), len(self.moves)
        for key in reachable:
            if key in self.lost:
                self.lost.discard(key)
                self.stranded.discard(key)
                self.say(f"{self.hosts[key].label} answers again after {self._since(key, now)} of silence")
            self.last_answer[key] = now
            self._end_stale_copies(key, panes)
        if FLAGS.actor_host_lost_s:
            for key in self._worker_hosts():
                if key not in reachable and self._silent(key, now) >= FLAGS.actor_host_lost_s:
                    self._move_workers_off(key, now, reachable)  # what could not move tries again next poll
        return {m.actor for m in self.moves[before:]}

    def _worker_hosts(self):
        return sorted({w.host for w in movable_windows(self.plan)} - {"local"})

    def _silent(self, key, now):
        return now - self.last_answer.get(key, self.started)

    def _since(self, key, now):
        return f"{self._silent(key, now):.0f} s"

    def _move_workers_off(self, key, now, reachable):
        label = self.hosts[key].label
        leaving = [w for w in movable_windows(self.plan) if w.host == key]
        why = f"{label} has not answered for {self._since(key, now)} (--actor_host_lost_s)"
        if key not in self.lost:
            self.lost.add(key)
            actors = sum(w in self.plan.actor_windows for w in leaving)
            what = " and its ".join(([f"{actors} actor(s)"] if actors else []) +
                                    (["evaluator"] if actors < len(leaving) else []))
            self.say(f"{'actor' if actors else 'evaluator'} host lost: {why}; moving its {what}")
        for w in leaving:
            target = self._target(reachable)
            if target is None:
                if key not in self.stranded:
                    self.stranded.add(key)
                    self.say(f"no other actor host answers: the actors of {label} wait for it (or for another "
                             f"actor host to answer)")
                return
            self._start_on(w, target, why)

    def _target(self, reachable):
        """The answering actor host (this machine included, if it runs actors) with the fewest actors."""
        candidates = [k for k in {w.host for w in self.plan.actor_windows} | {m.from_key for m in self.moves}
                      if k in reachable and k not in self.lost and k in self.hosts]
        if not candidates:
            return None
        load = {k: sum(w.host == k for w in movable_windows(self.plan)) for k in candidates}
        return min(sorted(candidates), key=lambda k: load[k])

    def _start_on(self, window, target, why):
        old = window.host
        window.host = target
        try:
            rc, out, err = self.hosts[target].run(start_windows_script([window], self.plan), timeout=FLAGS.ssh_timeout_s)
        except (OSError, HostError, paramiko.SSHException) as e:
            rc, err = 1, str(e)
        if rc != 0:
            window.host = old
            self.say(f"{window.title}: could not start it on {self.hosts[target].label}: {err.strip()[-300:]}")
            return
        self.moves.append(Move(time=time.time(), actor=window.name, from_key=old, to_key=target, why=why))
        write_json(moves_path(self.plan.logdir), {"moves": [dataclasses.asdict(m) for m in self.moves]}, indent=2)
        self.say(f"{window.title} moved from {self.hosts[old].label} to {self.hosts[target].label}; log {window.log} "
                 f"there")

    def _end_stale_copies(self, key, panes):
        """Kill the windows, on a host that answers, of actors (or the evaluator) moved away from it."""
        stale = [w for w in movable_windows(self.plan) if w.host != key and (key, w.name) in panes]
        if not stale:
            return
        try:
            rc, _, err = self.hosts[key].run(kill_window_script(self.plan, key, [w.name for w in stale]),
                                             timeout=FLAGS.ssh_timeout_s)
        except (OSError, HostError, paramiko.SSHException) as e:
            print(f"warning: cannot end the stale actors on {self.hosts[key].label}: {e}", file=sys.stderr)
            return
        for w in stale:
            self.say(f"{w.title}: ended its stale copy on {self.hosts[key].label} (it runs on "
                     f"{self.hosts[w.host].label} now)")


def describe_moves(moves, labels) -> list:
    """status's lines for the run's history of moves."""
    return [f"  {time.strftime('%H:%M:%S', time.localtime(m.time))} {m.actor.replace('_', ' ')} moved from "
            f"{labels.get(m.from_key, m.from_key)} to {labels.get(m.to_key, m.to_key)}: {m.why}" for m in moves]
