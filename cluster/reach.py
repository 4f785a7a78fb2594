"""Reachability between hosts: can each actor host open a TCP connection to its learner?

The SSH checks before a start go from this machine to each host; they say nothing about
the paths between the workers, where a firewall may drop a learner's port. So after the
learners start, check_after_start

  1. waits until each learner listens (a TCP connect to its address from its own host),
     for up to --reach_timeout_s, and
  2. from every actor host, opens a TCP connection to each learner that host's actors
     feed, and reports every pair that fails, naming both hosts and the port.

Actors say the same in their logs ("cannot reach learner ...", actor.py); actor_log_states
reads the newest such line of each actor, for --action=status and --follow.

The check is bash's /dev/tcp under coreutils' timeout, so it needs nothing installed.
"""
import concurrent.futures
import shlex
import time

from absl import flags

from cluster import hosts as hosts_lib

flags.DEFINE_float("reach_timeout_s", 90.0, "start: after the learners start, wait up to this long for each to "
                                            "listen, then check that every actor host can open a TCP connection "
                                            "to its learner's port (0: skip the check).")
flags.DEFINE_float("reach_connect_timeout_s", 3.0, "The TCP connect timeout of that check.")
FLAGS = flags.FLAGS

# Lines actor.py prints on its connect path; the newest one says where the actor stands.
CONNECTED, UNREACHABLE, NOT_PUBLISHED = "connected to learner", "cannot reach learner", "has published no weights"
LOG_PATTERN = f"{CONNECTED}|{UNREACHABLE}|{NOT_PUBLISHED}|giving up on learner"


def probe_script(addresses, timeout_s) -> str:
    """For each (ip, port): 'ok|refused|timeout ip port'."""
    lines = []
    for ip, port in addresses:
        target = shlex.quote(f"/dev/tcp/{ip}/{port}")
        lines.append(f"timeout {timeout_s:g} bash -c 'exec 3<>\"$0\"' {target} 2>/dev/null; rc=$?; "
                     f"if [ $rc = 0 ]; then r=ok; elif [ $rc = 124 ]; then r=timeout; else r=refused; fi; "
                     f"echo \"$r {ip} {port}\"")
    return "\n".join(lines) + "\ntrue\n"


def _probe(host, addresses, timeout_s) -> dict:
    """{(ip, port): 'ok'|'refused'|'timeout'|'error: ...'} as seen from host."""
    try:
        rc, out, err = host.run(probe_script(addresses, timeout_s), timeout=30 + timeout_s * len(addresses))
    except Exception as e:  # noqa: BLE001 (OSError, HostError, paramiko errors: say which host)
        return {a: f"error: {e}" for a in addresses}
    got = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            got[(parts[1], int(parts[2]))] = parts[0]
    return {a: got.get(a, f"error: the TCP check printed nothing ({err.strip()[-200:]})") for a in addresses}


def wait_for_learners(plan, hosts, timeout_s, learners_alive) -> tuple:
    """-> ({rank: seconds until it listened}, {rank: why not}). learners_alive() is
    checked between rounds, so a dead mpirun ends the wait at once."""
    learners = plan.cluster.learners
    up, pending, t0 = {}, set(range(len(learners))), time.time()
    while pending:
        by_host = {}
        for r in pending:
            by_host.setdefault(hosts_lib.host_key(learners[r]), []).append(r)
        for key, ranks in by_host.items():
            seen = _probe(hosts[key], [(learners[r].ip, learners[r].tf_port) for r in ranks], 1.0)
            for r in ranks:
                if seen[(learners[r].ip, learners[r].tf_port)] == "ok":
                    up[r] = time.time() - t0
                    pending.discard(r)
        if not pending:
            break
        if not learners_alive():
            return up, {r: "the learners (mpirun) exited before it listened" for r in pending}
        if time.time() - t0 > timeout_s:
            return up, {r: f"not listening after {timeout_s:.0f} s" for r in pending}
        time.sleep(1.0)
    return up, {}


def check_pairs(plan, hosts, ranks, timeout_s) -> list:
    """From each actor host, a TCP connect to each learner (of `ranks`) its actors feed.
    -> [(actor host key, learner rank, [actor indices], result)] for every pair probed."""
    cluster = plan.cluster
    k = len(cluster.learners)
    pairs = {}  # (actor host key, rank) -> [actor index]
    for a in cluster.actors:
        if a.index % k in ranks:
            pairs.setdefault((hosts_lib.host_key(a), a.index % k), []).append(a.index)
    by_host = {}
    for key, r in pairs:
        by_host.setdefault(key, []).append(r)

    def probe(key):
        addresses = [(cluster.learners[r].ip, cluster.learners[r].tf_port) for r in by_host[key]]
        return key, _probe(hosts[key], addresses, timeout_s)

    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for key, seen in pool.map(probe, by_host):
            for r in by_host[key]:
                w = cluster.learners[r]
                results.append((key, r, pairs[(key, r)], seen[(w.ip, w.tf_port)]))
    return results


def describe(result, timeout_s) -> str:
    if result == "timeout":
        return f"no answer within {timeout_s:g} s (a firewall dropping the packets?)"
    if result == "refused":
        return "connection refused (a firewall rejecting it, or the learner listens on another address?)"
    return result


def check_after_start(plan, hosts, learners_alive, say=print) -> bool:
    """Steps 1 and 2 of the module docstring; prints what it finds. True if all is well."""
    if FLAGS.reach_timeout_s <= 0:
        return True
    learners, t0 = plan.cluster.learners, time.time()
    say(f"checking that every actor host can reach its learner's port (learners get up to "
        f"{FLAGS.reach_timeout_s:g} s to start listening)")
    up, down = wait_for_learners(plan, hosts, FLAGS.reach_timeout_s, learners_alive)
    for r, why in sorted(down.items()):
        say(f"error: learner {r} at {learners[r].address} on {hosts[hosts_lib.host_key(learners[r])].label}: "
            f"{why}; see {plan.logdir}/logs/learner_{r}.log")
    results = check_pairs(plan, hosts, set(up), FLAGS.reach_connect_timeout_s)
    bad = [x for x in results if x[3] != "ok"]
    for key, r, actors, result in bad:
        w = learners[r]
        say(f"error: actor host {hosts[key].label} cannot open a TCP connection to learner {r} at "
            f"{w.ip} port {w.tf_port} (actors {', '.join(map(str, actors))} feed it): "
            f"{describe(result, FLAGS.reach_connect_timeout_s)}. Open TCP port {w.tf_port} on {w.ip} to that host "
            f"(found {time.time() - t0:.1f} s after the learners started)")
    if up and not bad:
        say(f"reachability: {len(results)} actor-host -> learner pair(s) connect "
            f"(learners listening after {max(up.values()):.1f} s)")
    return not down and not bad


def actor_log_states(out_lines) -> dict:
    """'#reach' lines "window newest-connect-line" of the status script -> {window: line}
    ('' when the actor logged none of them yet)."""
    states = {}
    for line in out_lines:
        name, _, rest = line.partition(" ")
        states[name] = rest.strip()
    return states


def log_lines_script(windows) -> str:
    """The newest connect-path line of each actor window's log on this host."""
    return "".join(f"echo {shlex.quote(w.name)} \"$(grep -E {shlex.quote(LOG_PATTERN)} {shlex.quote(w.log)} "
                   f"2>/dev/null | tail -n 1)\"\n" for w in windows)


def never_connected(state) -> bool:
    return CONNECTED not in state
