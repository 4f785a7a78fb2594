"""Which learner server each worker serves or feeds, from the host flags of either launch form.

Two forms name the same cluster:

* SPMD (one command line for every learner rank): `--learner_hosts` lists every rank's server,
  rank r serves learner_hosts[r], and actor i of `--actor_hosts` feeds learner_hosts[i mod K].
* MPMD (the original project's manual launch, `mpirun ... : ...` with a command line per rank):
  `--learner_host` names this rank's own server and `--actor_hosts` lists only this learner's
  actors; an actor names the learner it feeds with `--learner_host` and its index in that
  learner's list with `--task`.

Both forms together are allowed when they agree; then the SPMD form decides the assignment and
`--learner_host` is a check. No TensorFlow here: the checks run before anything starts.
"""
import zlib
from typing import NamedTuple


class PlacementError(ValueError):
    """Host flags that disagree; the message names the flags and what would agree."""


class Hosts(NamedTuple):
    learner_host: str | None  # --learner_host (None when not given)
    learner_hosts: list  # --learner_hosts
    listed: bool  # whether --learner_hosts was given on the command line (not its default)
    actor_hosts: list  # --actor_hosts

    @property
    def mpmd(self):
        return self.learner_host is not None and not self.listed


def from_flags(flags):
    return Hosts(flags.learner_host, list(flags.learner_hosts), flags["learner_hosts"].present,
                 list(flags.actor_hosts))


def learner_address(hosts, rank, size):
    """The server this learner rank binds, checked against the launch's rank count."""
    if hosts.mpmd:
        return hosts.learner_host
    if size != len(hosts.learner_hosts):
        raise PlacementError("--learner_hosts lists %d learner(s) but %d Horovod rank(s) are running; start "
                             "one rank per learner (mpirun -np %d), or give each rank its own --learner_host "
                             "(mpirun's MPMD form)" % (len(hosts.learner_hosts), size, len(hosts.learner_hosts)))
    mine = hosts.learner_hosts[rank]
    if hosts.learner_host is not None and hosts.learner_host != mine:
        raise PlacementError("rank %d: --learner_host=%s but --learner_hosts gives this rank %s; give one of the "
                             "two forms, or make them agree" % (rank, hosts.learner_host, mine))
    return mine


def learner_actor_ids(hosts, rank, size):
    """Indices into --actor_hosts of the actors this rank trains on (each actor's --task)."""
    if hosts.mpmd:
        return list(range(len(hosts.actor_hosts)))
    return [i for i in range(len(hosts.actor_hosts)) if i % size == rank]


def check_ranks_agree(addresses):
    """addresses[r]: the server rank r binds. Two ranks on one server would take each other's unrolls."""
    seen = {}
    for rank, address in enumerate(addresses):
        if address in seen:
            raise PlacementError("learner ranks %d and %d both serve %s; give each rank its own --learner_host"
                                 % (seen[address], rank, address))
        seen[address] = rank


def actor_learner(hosts, task):
    """The learner server actor --task feeds."""
    if hosts.actor_hosts and task >= len(hosts.actor_hosts):
        raise PlacementError("--task=%d but --actor_hosts lists only %d actor(s)%s"
                             % (task, len(hosts.actor_hosts),
                                " (in the MPMD form, this learner's own actors)" if hosts.mpmd else ""))
    if hosts.mpmd:
        return hosts.learner_host
    mine = hosts.learner_hosts[task % len(hosts.learner_hosts)]
    if hosts.learner_host is not None and hosts.learner_host != mine:
        if hosts.learner_host not in hosts.learner_hosts:
            raise PlacementError("--learner_host=%s is not a learner of this job (--learner_hosts=%s)"
                                 % (hosts.learner_host, ",".join(hosts.learner_hosts)))
        raise PlacementError("actor --task=%d feeds learner %d of --learner_hosts (%s), not --learner_host=%s; "
                             "give one of the two forms, or make them agree"
                             % (task, task % len(hosts.learner_hosts), mine, hosts.learner_host))
    return mine


def actor_seed_index(hosts, task):
    """A number that tells this actor's envs and sampling apart from every other actor of the job.
    In the MPMD form --task counts from 0 at each learner, so the learner's address is mixed in
    (up to 1000 actors a learner keep their seeds apart)."""
    if not hosts.mpmd:
        return task
    return task + 1000 * (zlib.crc32(hosts.learner_host.encode()) % 1000)


def evaluator_learner(hosts):
    """The evaluator reads the policy from learner 0 (every rank holds the same weights)."""
    return hosts.learner_host if hosts.learner_host is not None else hosts.learner_hosts[0]
