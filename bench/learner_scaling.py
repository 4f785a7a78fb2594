"""Learner scaling: samples/s with 1, 2, ... Horovod learner ranks fed by the same actors,
and the allreduce time per update.

  .venv/bin/python bench/learner_scaling.py --ranks 1 2 --actors 4 --seconds 90

For each K in --ranks, one run of `mpirun -np K experiment.py --job_name=learner`
(K = 1: a plain process) with the same --actors actor processes (actor i feeds rank
i mod K) for --seconds; the figure is rank 0's median frames/s after the first 20 s
(frames count every rank's batch), also given as learner samples/s (agent steps/s).
Then, with the same K, `mpirun -np K` times hvd.allreduce of gradients shaped like
the agent's (the work DistributedGradientTape adds per update): median ms over 50
updates. Ratios are against K = 1 measured in this run.

On a 2-core machine all ranks and actors share the same two cores, so more ranks
cannot add compute: the figure shows the overhead. Writes
bench/results/learner_scaling.{csv,md}.
"""
import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from local_cluster import LocalCluster
from bench import common

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def allreduce_probe(level, agent_name, iters, out_path):
    """Runs inside each mpirun rank: times the gradient allreduce of one update."""
    # Imported here: only the ranks need Horovod (and its TensorFlow), not the script running the clusters.
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from impala import agent as agent_lib
    hvd.init()
    agent, _, _ = agent_lib.build_agent(level, agent_name, 20)
    grads = [tf.random.normal(v.shape) for v in agent.trainable_variables]

    @tf.function
    def reduce(gs):
        return [hvd.allreduce(g, op=hvd.Average) for g in gs]
    for _ in range(5):
        reduce(grads)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = reduce(grads)
        _ = out[-1].numpy()
        times.append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        n = sum(int(np.prod(v.shape)) for v in agent.trainable_variables)
        with open(out_path, "w") as f:
            json.dump({"ms_median": 1000 * float(np.median(times)), "params": n,
                       "ms_min": 1000 * float(np.min(times)), "ms_max": 1000 * float(np.max(times))}, f)


def run_training(k, a, flags, base_port):
    logdir = tempfile.mkdtemp(prefix="scaling_%d_" % k)
    cluster = LocalCluster(a.actors, base_port, flags, logdir, num_learners=k)
    cluster.start()
    try:
        time.sleep(a.seconds)
    finally:
        cluster.stop()
    rows, _, log = common.finished_run(logdir)
    fps = sorted(float(r["fps"]) for r in rows if float(r["time_s"]) >= 20)
    if not fps:
        raise RuntimeError("K=%d: no progress lines after 20 s; learner log tail:\n%s" % (k, log[-3000:]))
    return fps[len(fps) // 2], fps[0], fps[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--agent", default="SimpleConvNetAgent")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    common.cluster_args(p, actors=4, envs_per_actor=4, batch_size=16, unroll_length=20)
    p.add_argument("--seconds", type=float, default=90)
    p.add_argument("--base_port", type=int, default=18900)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--allreduce_probe", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.allreduce_probe:
        allreduce_probe(a.level, a.agent, 50, a.allreduce_probe)
        return 0
    flags = ["--level_name=" + a.level, "--agent_name=" + a.agent] + common.cluster_flags(a) + [
             "--queue_capacity=%d" % (2 * a.batch_size), "--total_environment_frames=1000000000", "--log_every_s=5"]
    frames_per_step = 4 if "NoFrameskip" in a.level or a.level.startswith("ALE/") else 1
    results = []
    for k in a.ranks:
        fps, lo, hi = run_training(k, a, flags, a.base_port)
        probe = {"ms_median": 0.0, "ms_min": 0.0, "ms_max": 0.0, "params": ""}
        if k > 1:
            out = tempfile.mktemp(suffix=".json")
            subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(k), "--bind-to",
                            "none", "-x", "TF_CPP_MIN_LOG_LEVEL=2", sys.executable, os.path.abspath(__file__),
                            "--allreduce_probe=" + out, "--level=" + a.level, "--agent=" + a.agent],
                           check=True, cwd=ROOT, capture_output=True)
            probe = json.load(open(out))
            os.remove(out)
        results.append({"ranks": k, "frames_per_s": fps, "fps_min": lo, "fps_max": hi,
                        "samples_per_s": fps / frames_per_step, "allreduce_ms_median": probe["ms_median"],
                        "allreduce_ms_min": probe["ms_min"], "allreduce_ms_max": probe["ms_max"]})
        print("K=%d: %.0f frames/s (%.0f-%.0f), allreduce %.1f ms/update"
              % (k, fps, lo, hi, probe["ms_median"]), flush=True)
    base = results[0]["frames_per_s"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "learner_scaling.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]) + ["ratio_to_first"])
        w.writeheader()
        for r in results:
            w.writerow(dict(r, ratio_to_first=r["frames_per_s"] / base))
    lines = ["# Learner scaling, %s (%s), %d actors x %d envs, batch %d x unroll %d per rank" % (
                 a.level, a.agent, a.actors, a.envs_per_actor, a.batch_size, a.unroll_length), "",
             "Machine: %s, %d cores. One run of %.0f s per K; median of rank 0's 5-second frames/s "
             "after 20 s (min-max in brackets)." % (platform.processor() or platform.machine(),
                                                    os.cpu_count(), a.seconds), "",
             "| learner ranks | frames/s | learner samples/s | ratio to K=%d | allreduce ms/update |" % a.ranks[0],
             "|---|---|---|---|---|"]
    for r in results:
        lines.append("| %d | %.0f (%.0f-%.0f) | %.0f | %.2f | %s |" % (
            r["ranks"], r["frames_per_s"], r["fps_min"], r["fps_max"], r["samples_per_s"],
            r["frames_per_s"] / base, "%.1f (%.1f-%.1f)" % (r["allreduce_ms_median"], r["allreduce_ms_min"],
                                                            r["allreduce_ms_max"]) if r["ranks"] > 1 else "-"))
    lines += ["", "Command: `.venv/bin/python bench/learner_scaling.py --ranks %s --actors %d --seconds %g`"
              % (" ".join(map(str, a.ranks)), a.actors, a.seconds)]
    common.write_lines(os.path.join(a.out, "learner_scaling.md"), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
