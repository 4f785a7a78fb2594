"""Container entrypoint: the compose settings -> experiment.py's host flags; then exec.

The container's command is the training flags (the same list for every service); this adds
the flags that describe the cluster, from three environment variables:

  IMPALA_ROLE   learner | actor (set by the image target)
  NUM_ACTORS    how many actor replicas run (default 1). The learner needs the count (it
                assigns actors to ranks and tracks each actor id's heartbeat); each actor needs
                a task id in 0..NUM_ACTORS-1.
  NUM_LEARNERS  Horovod ranks in the learner container (default 1); with K > 1 the learner runs
                `mpirun -np K` and rank r listens on LEARNER_HOST:8001+r; actor i feeds rank i % K.

An actor's task id is its compose replica number minus one (`--scale actor=N` or `scale:`
numbers replicas 1..N): the container asks Docker's embedded DNS server (127.0.0.11) for the
name of its own address, which is the container name, `<project>_actor_<n>` (Compose v1) or
`<project>-actor-<n>` (v2). ACTOR_TASK overrides it (e.g. for `docker run`).

Actors are gRPC clients and listen on nothing, so --actor_hosts only counts and assigns them:
the entrypoint fills it with placeholder names actor-<i>:<8101+i>.
"""
import os
import random
import re
import socket
import struct
import sys
import time

LEARNER_BASE_PORT = 8001


def fail(msg):
    print("docker/entrypoint.py: error: %s" % msg, file=sys.stderr, flush=True)
    sys.exit(2)


def env_int(name, default, low=1):
    """ASCII digits only, the rule of tools/digits.py, which this script (run from docker/, outside the
    project's packages) cannot import: int() would read NUM_ACTORS=２ as 2."""
    raw = os.environ.get(name, "") or str(default)
    if not re.fullmatch(r"[0-9]+", raw, re.ASCII) or int(raw) < low:
        fail("%s=%r must be an integer >= %d in ASCII digits 0-9" % (name, raw, low))
    return int(raw)


def _read_name(msg, pos):
    """A DNS name at msg[pos:] (with compression pointers) -> (name, position after it)."""
    labels, end, hops = [], None, 0
    while True:
        n = msg[pos]
        if n & 0xC0 == 0xC0:
            if end is None:
                end = pos + 2
            pos = ((n & 0x3F) << 8) | msg[pos + 1]
            hops += 1
            if hops > 32:
                raise ValueError("DNS name pointer loop")
            continue
        if n == 0:
            return ".".join(labels), (end if end is not None else pos + 1)
        labels.append(msg[pos + 1:pos + 1 + n].decode("ascii", "replace"))
        pos += 1 + n


def reverse_lookup(ip, server="127.0.0.11", port=53, timeout=2.0):
    """PTR names of `ip` asked straight from `server` (not /etc/hosts, which holds the container
    id as hostname)."""
    qid = random.randrange(65536)
    qname = b"".join(bytes([len(p)]) + p.encode() for p in reversed(ip.split("."))) + b"\x07in-addr\x04arpa\x00"
    query = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 12, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(query, (server, port))
        msg = s.recv(4096)
    rid, _, qd, an = struct.unpack(">HHHH", msg[:8])
    if rid != qid:
        raise ValueError("DNS answer for another query")
    pos = 12
    for _ in range(qd):
        pos = _read_name(msg, pos)[1] + 4
    names = []
    for _ in range(an):
        pos = _read_name(msg, pos)[1]
        rtype, _, _, rdlen = struct.unpack(">HHIH", msg[pos:pos + 10])
        pos += 10
        if rtype == 12:
            names.append(_read_name(msg, pos)[0])
        pos += rdlen
    return names


def replica_from_names(names):
    """(replica number, name) from container names like <project>_actor_3.<network> (Compose v1)
    or <project>-actor-3.<network> (v2); None if no name is an actor replica's."""
    for name in names:
        m = re.match(r"^[^.]*actor[-_](\d+)(\.|$)", name)
        if m:
            return int(m.group(1)), name
    return None


def replica_number():
    """This container's compose replica number (1-based), from its name in Docker's DNS."""
    ip = socket.gethostbyname(socket.gethostname())
    names, err = [], None
    for _ in range(20):  # the name can appear a moment after the container starts
        try:
            names = reverse_lookup(ip)
        except (OSError, ValueError) as e:
            err = e
        if names:
            break
        time.sleep(0.5)
    found = replica_from_names(names)
    if found:
        return found
    fail("cannot tell which actor replica this container is: Docker's DNS (127.0.0.11) named %s %s%s; "
         "run actors as the compose service `actor` (names <project>_actor_<n> or <project>-actor-<n>) "
         "or set ACTOR_TASK=<0-based id>" % (ip, names or "nothing", " (%s)" % err if err else ""))


def main(argv):
    role = os.environ.get("IMPALA_ROLE", "")
    if role not in ("learner", "actor"):
        fail("IMPALA_ROLE=%r must be learner or actor (the image targets set it)" % role)
    num_actors = env_int("NUM_ACTORS", 1)
    num_learners = env_int("NUM_LEARNERS", 1)
    learner_host = os.environ.get("LEARNER_HOST", "learner")
    for a in argv:
        if a.startswith(("--learner_host", "--actor_hosts", "--task", "--job_name")):  # --learner_host(s)
            fail("%s: the entrypoint sets this flag (from NUM_LEARNERS, NUM_ACTORS and the replica "
                 "number); leave it out of the command" % a.split("=")[0])
    hosts = ["--learner_hosts=" + ",".join("%s:%d" % (learner_host, LEARNER_BASE_PORT + r)
                                            for r in range(num_learners)),
             "--actor_hosts=" + ",".join("actor-%d:%d" % (i, 8101 + i) for i in range(num_actors))]
    cmd = [sys.executable, "experiment.py", "--job_name=" + role]
    if role == "actor":
        if os.environ.get("ACTOR_TASK", ""):
            task, why = env_int("ACTOR_TASK", 0, low=0), "ACTOR_TASK"
        else:
            n, name = replica_number()
            task, why = n - 1, "replica %s" % name
        if task >= num_actors:
            fail("this is actor %d (%s) but NUM_ACTORS=%d: set NUM_ACTORS to the number of actor "
                 "replicas for every service, e.g. NUM_ACTORS=%d docker compose up (not --scale alone)"
                 % (task, why, num_actors, task + 1))
        cmd.append("--task=%d" % task)
        print("docker/entrypoint.py: actor task %d of %d (%s), feeds learner rank %d of %d"
              % (task, num_actors, why, task % num_learners, num_learners), flush=True)
    elif num_learners > 1:
        # One container, K ranks; --bind-to none: the ranks share the container's CPUs with the
        # system's other work; vader's single-copy (CMA) needs ptrace rights containers lack.
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(num_learners),
               "--mca", "btl_vader_single_copy_mechanism", "none"] + cmd
    cmd += hosts + list(argv)
    if cmd[0] == "mpirun":
        print("docker/entrypoint.py: run %s" % " ".join(cmd), flush=True)
        sys.exit(supervise_mpirun(cmd))
    print("docker/entrypoint.py: exec %s" % " ".join(cmd), flush=True)
    os.execvp(cmd[0], cmd)


def supervise_mpirun(cmd):
    """Runs mpirun in its own session and passes a stop signal (SIGINT/SIGTERM, from tini) to the
    ranks themselves as SIGINT, not to mpirun: mpirun answers a signal by killing its ranks
    (SIGTERM, then SIGKILL a moment later, which can cut a checkpoint short) and exits 1. The
    ranks agree to stop, rank 0 writes the checkpoint, and mpirun exits with their status."""
    import signal
    import subprocess

    import psutil
    proc = subprocess.Popen(cmd, start_new_session=True)

    def forward(signum, frame):
        try:
            ranks = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for rank in ranks:
            try:
                rank.send_signal(signal.SIGINT)
            except psutil.NoSuchProcess:
                pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    code = proc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    main(sys.argv[1:])
