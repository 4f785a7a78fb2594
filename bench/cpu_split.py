"""Where the CPU goes in a running cluster: CPU seconds per process role and thread kind,
read from /proc between two snapshots, plus the machine's idle share over the same window.

  before = cpu_split.snapshot({"learner": [pid], "actors": [pid, pid]})
  ...
  print(cpu_split.report(cpu_split.split(before, cpu_split.snapshot(same_roles))))

Thread kinds: "main" (each process's Python thread) and "other" (all its other threads:
TensorFlow's op pools, gRPC, and in actors ale-py's env threads). They are not told apart
further: with TensorFlow 2.18 and ale-py 0.12 every thread is named after the process
("python"). Children of the given pids (mpirun's ranks) count for the same role.
"""
import os

TICK = os.sysconf("SC_CLK_TCK")


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _tree(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def _threads(pid):
    """(kind, cpu seconds) for each thread of pid; empty once it has exited."""
    rows = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return rows
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)": fields[11], [12] are utime, stime
        rows.append(("main" if int(tid) == pid else "other", (int(fields[11]) + int(fields[12])) / TICK))
    return rows


def _idle_and_total():
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    return (cpu[3] + cpu[4]) / TICK, sum(cpu[:8]) / TICK  # idle + iowait, all but guest


def snapshot(roles):
    """{role: [pid, ...]} -> CPU seconds by (role, kind), with the machine's idle and total."""
    cpu = {}
    for role, pids in roles.items():
        for pid in pids:
            for p in _tree(pid):
                for kind, seconds in _threads(p):
                    cpu[(role, kind)] = cpu.get((role, kind), 0.0) + seconds
    idle, total = _idle_and_total()
    return {"cpu": cpu, "idle": idle, "total": total}


def split(before, after):
    """Shares of the machine's CPU time over the window: {"learner/main": 0.21, ..., "idle": 0.01}.
    A thread that exited in between counts from neither snapshot."""
    total = after["total"] - before["total"]
    if total <= 0:
        return {}
    shares = {"%s/%s" % key: (after["cpu"][key] - before["cpu"].get(key, 0.0)) / total
              for key in after["cpu"]}
    shares["idle"] = (after["idle"] - before["idle"]) / total
    shares["other processes"] = max(0.0, 1.0 - sum(shares.values()))
    shown = {k: v for k, v in shares.items() if v >= 0.005}  # below half a percent: left out of the line
    return dict(sorted(shown.items(), key=lambda kv: -kv[1]))


def report(shares):
    return ", ".join("%s %.0f%%" % (k, 100 * v) for k, v in shares.items())
