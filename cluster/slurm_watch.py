"""Keeping a Slurm run going when a worker or a node is lost (cluster/slurm.py's Run.wait).

An actor job step that ends with a failure while the learners train is started again, up to
--actor_restarts times per actor: on its node, or, when its step failed within FAST_FAIL_S of its
start (srun could not place it: the node is down or drained), on the next node of the allocation
that Slurm reports up, actor nodes first. The learners' process that fails (a rank died, or a
learner node went down and took its rank with it) is started again, up to --learner_restarts
times, with the learner nodes Slurm reports up, from the run's newest checkpoint
(--mode=train_w_load: the frame counter and the learning-rate schedule go on from there; what was
trained after that checkpoint is lost). When that drops ranks, every actor restarts with the new
learner list. Exit statuses a restart cannot mend (bad input, weights no longer finite) end the
run as before.

The batch script asks Slurm not to end the whole job when one of its nodes fails (--no-kill), so
these restarts have an allocation to run in; the node the launcher runs on is the one that cannot
be lost. Every restart is appended to <logdir>/slurm_restarts.json.
"""
import dataclasses
import os
import subprocess

from cluster.learnerloss import NO_RESTART
from tools.files import write_json

FAST_FAIL_S = 10.0
RESTARTS_FILE = "slurm_restarts.json"
DOWN_STATES = ("down", "drain", "fail", "maint", "unk", "no_respond", "power")


@dataclasses.dataclass
class Restart:
    time: float
    worker: str    # "learners" or "actor <i>"
    nodes: list    # where it runs now
    why: str
    resumed: str   # learners: the checkpoint folder they resumed from, or ""


def nodes_up(nodes, run=subprocess.run) -> list:
    """The nodes Slurm does not report down, drained or failing (sinfo); all of them when sinfo
    cannot say (the restart then shows whether a node works)."""
    try:
        p = run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"], capture_output=True, text=True,
                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return list(nodes)
    if p.returncode != 0:
        return list(nodes)
    down = {n for n, state in (line.split()[:2] for line in p.stdout.splitlines() if len(line.split()) >= 2)
            if state.rstrip("*~#!%$@^-").lower().startswith(DOWN_STATES)}
    return [n for n in nodes if n not in down]


def next_node(node, allocation_nodes, learner_nodes, up, suspect) -> str:
    """Where an actor whose step failed at once on `node` goes: the next node that is up and not
    suspect, after `node` in the allocation's order, nodes without learners first; `node` itself if
    there is none."""
    order = allocation_nodes[allocation_nodes.index(node) + 1:] + allocation_nodes[:allocation_nodes.index(node) + 1] \
        if node in allocation_nodes else list(allocation_nodes)
    fine = [n for n in order if n in up and n not in suspect and n != node]
    preferred = [n for n in fine if n not in learner_nodes]
    return (preferred or fine or [node])[0]


def checkpoint_dir(logdir) -> str:
    """The run's checkpoint folder when it holds a checkpoint index, else ""."""
    folder = os.path.join(logdir, "checkpoints")
    index = os.path.join(folder, "checkpoint")
    return folder if os.path.isfile(index) and os.path.getsize(index) > 0 else ""


def why_not_restart(code, stopping, done, limit) -> str:
    """'' when a learner process that exited with `code` is to be started again, else why not."""
    if stopping or code == 0:
        return "stopping" if stopping else "finished"
    if str(code) in NO_RESTART:
        return "exit status %d (%s): a restart would not mend it" % (code, NO_RESTART[str(code)])
    if done >= limit:
        return "restarted %d time(s) already (--learner_restarts=%d)" % (done, limit)
    return ""


def record(logdir, restarts):
    write_json(os.path.join(logdir, RESTARTS_FILE), {"restarts": [dataclasses.asdict(r) for r in restarts]},
               indent=2)
