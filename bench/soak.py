"""Soak test: a local cluster trains for --minutes while every process's memory (RSS),
open file descriptors and threads, and the learner's queue fill, are sampled every
--every_s seconds. After the warm-up (--warmup_frac of the run) a least-squares line
through each process's RSS gives its growth in MB/hour; fds and threads should not grow.

  .venv/bin/python bench/soak.py                                # 30 min, Pong, 1 learner + 2 actors
  .venv/bin/python bench/soak.py --minutes 5 --level CartPole-v1 --agent MLPAgent

Not part of the test suite (too long). Writes bench/results/soak.{csv,md,png}.
"""
import argparse
import csv
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import psutil

from local_cluster import LocalCluster, obey_ctrl_c
from bench import common

HERE = os.path.dirname(os.path.abspath(__file__))


def sample(procs):
    out = {}
    for name, p in procs.items():
        try:
            ps = psutil.Process(p.pid)
            out[name] = (ps.memory_info().rss / 2 ** 20, ps.num_fds(), ps.num_threads())
        except psutil.Error:
            out[name] = (float("nan"),) * 3
    return out


def queue_fill(logdir):
    path = os.path.join(logdir, "metrics.csv")
    if not os.path.exists(path):
        return float("nan"), 0
    rows = open(path).read().splitlines()[1:]
    if not rows:
        return float("nan"), 0
    last = rows[-1].split(",")
    return float(last[6]), int(last[1])


def slope_per_hour(ts, ys):
    ts, ys = np.asarray(ts), np.asarray(ys)
    ok = np.isfinite(ys)
    if ok.sum() < 3:
        return float("nan")
    return float(np.polyfit(ts[ok] / 3600.0, ys[ok], 1)[0])


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--every_s", type=float, default=10)
    p.add_argument("--warmup_frac", type=float, default=0.2)
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--agent", default="SimpleConvNetAgent")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--envs_per_actor", type=int, default=16)
    p.add_argument("--base_port", type=int, default=19700)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    return p.parse_args()


def watch(a, procs, logdir):
    """One row every --every_s seconds for --minutes: frames, queue fill, and each process's memory,
    file descriptors and threads."""
    rows, t0 = [], time.time()
    while time.time() - t0 < a.minutes * 60:
        time.sleep(a.every_s)
        s = sample(procs)
        fill, frames = queue_fill(logdir)
        row = {"t_s": time.time() - t0, "frames": frames, "queue_fill": fill}
        for name, (rss, fds, threads) in s.items():
            row.update({name + "_rss_mb": rss, name + "_fds": fds, name + "_threads": threads})
        rows.append(row)
        print("%5.0f s  frames %d  queue %.2f  %s" % (row["t_s"], frames, fill, "  ".join(
            "%s %.0f MB/%d fds" % (n, v[0], v[1]) for n, v in s.items())), flush=True)
    return rows


def soak(a, flags, logdir):
    """Runs the cluster for the soak. Returns the rows, the process names, and the exit code and the
    end of the log of each process that died during it."""
    cluster = LocalCluster(a.actors, a.base_port, flags, logdir).start()
    procs = {"learner": cluster.learner}
    procs.update({"actor_%d" % i: q for i, q in enumerate(cluster.actor_procs)})
    rows = []
    try:
        rows = watch(a, procs, logdir)
    finally:
        died = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        cluster.stop()
        tails = {}
        for n in died:  # keep the words of any process that died during the soak
            path = os.path.join(logdir, "logs", n + ".log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tails[n] = f.read().splitlines()[-15:]
        shutil.rmtree(logdir, ignore_errors=True)
    return rows, list(procs), died, tails


def table(a, rows, names, died, tails):
    warm = [r for r in rows if r["t_s"] >= a.warmup_frac * a.minutes * 60]
    ts = [r["t_s"] for r in warm]
    lines = ["# Soak: %s, 1 learner + %d actors x %d envs, %.0f min (%d cores)" % (
                 a.level, a.actors, a.envs_per_actor, a.minutes, os.cpu_count()), "",
             "Sampled every %.0f s; slopes are least-squares fits after the first %.0f%% (warm-up)." % (
                 a.every_s, 100 * a.warmup_frac), "",
             "| process | RSS after warm-up (MB) | RSS at end (MB) | RSS slope (MB/hour) | fds start-end "
             "| threads start-end |",
             "|---|---|---|---|---|---|"]
    for name in names:
        rss = [r[name + "_rss_mb"] for r in warm]
        fds = [r[name + "_fds"] for r in warm]
        th = [r[name + "_threads"] for r in warm]
        lines.append("| %s | %.0f | %.0f | %+.1f | %s-%s | %s-%s |" % (
            name, rss[0], rss[-1], slope_per_hour(ts, rss), fds[0], fds[-1], th[0], th[-1]))
    fills = [r["queue_fill"] for r in warm if np.isfinite(r["queue_fill"])]
    lines += ["", "Queue fill after warm-up: mean %.2f, min %.2f, max %.2f; frames trained: %d." % (
        np.mean(fills), np.min(fills), np.max(fills), rows[-1]["frames"]) if fills else "",
        "", "Command: `.venv/bin/python bench/soak.py --minutes %g --level %s --agent %s`" % (
            a.minutes, a.level, a.agent)]
    for n, code in died.items():
        lines += ["", "**%s exited during the soak (code %s)**; the end of its log:" % (n, code), "", "```"]
        lines += tails.get(n, ["(no log)"]) + ["```"]
    return lines


def plot(path, rows, names):
    fig, ax = common.subplots(figsize=(7, 4))
    for name in names:
        ax.plot([r["t_s"] / 60 for r in rows], [r[name + "_rss_mb"] for r in rows], label=name)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MB)")
    ax.set_title("Soak: memory per process")
    ax.legend()
    common.save_figure(fig, path)


def main():
    obey_ctrl_c()
    a = parse_args()
    logdir = tempfile.mkdtemp(prefix="soak_")
    flags = ["--level_name=" + a.level, "--agent_name=" + a.agent, "--batch_size=32", "--unroll_length=20",
             "--envs_per_actor=%d" % a.envs_per_actor, "--queue_capacity=64", "--log_every_s=10",
             "--total_environment_frames=1000000000", "--checkpoint_every_s=120"]
    rows, names, died, tails = soak(a, flags, logdir)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "soak.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = table(a, rows, names, died, tails)
    common.write_lines(os.path.join(a.out, "soak.md"), lines)
    plot(os.path.join(a.out, "soak.png"), rows, names)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
