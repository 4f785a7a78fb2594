"""Where a learner's start-up goes: imports, building the learner, tracing the update, the
first update (TensorFlow optimises the graph on its first run) and a steady update.

  .venv/bin/python bench/startup.py cartpole pong42

Each workload (bench/kernels.py's WORKLOADS) runs in a fresh process, as a learner starts.
Writes bench/results/<machine>/startup.md.
"""
import json
import os
import sys
import time

from bench import kernels  # stdlib only at import; the learner pieces come in the child


def phases(argv):
    """Seconds of each start-up phase, in this process (whose imports are what is timed first)."""
    t0 = time.perf_counter()
    import tensorflow as tf
    import experiment  # noqa: F401  (defines the flags)
    from impala import learner  # noqa: F401
    t1 = time.perf_counter()
    lrn = kernels.make_learner(argv, "startup")
    t2 = time.perf_counter()
    lrn.warm_up()
    t3 = time.perf_counter()
    batch = kernels.random_batch(lrn)  # test data, not start-up: not timed
    frames = tf.constant(1, tf.int64)
    t3b = time.perf_counter()
    lrn._train_step(batch, frames)["grad_norm"].numpy()
    t4 = time.perf_counter()
    lrn._train_step(batch, frames)["grad_norm"].numpy()
    t5 = time.perf_counter()
    return {"imports": t1 - t0, "build": t2 - t1, "trace": t3 - t2, "first update": t4 - t3b,
            "steady update": t5 - t4}


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(phases(sys.argv[2:])), flush=True)
        return 0
    from bench import common, run as harness  # not at the top: the child times its imports from a bare process
    names = sys.argv[1:] or ["cartpole", "pong42"]
    lines = ["| workload | " + " | ".join(["imports", "build", "trace", "first update", "steady update"]) + " |",
             "|---|---|---|---|---|---|"]
    for name in names:
        t = kernels.child_json(__file__, ["--child"] + kernels.WORKLOADS[name], {"CUDA_VISIBLE_DEVICES": ""}, name)
        lines.append("| %s | %s |" % (name, " | ".join("%.2f s" % t[k] for k in
                                                     ("imports", "build", "trace", "first update", "steady update"))))
        print(lines[-1], flush=True)
    out, info = harness.results_dir()
    text = ["# Learner start-up, one fresh process per workload, %d cores, %s" % (info["cores"], info["cpu"]), ""]
    text += lines + ["", "Command: `.venv/bin/python bench/startup.py %s`" % " ".join(names), "",
                     harness.machine_line(info)]
    path = os.path.join(out, "startup.md")
    common.write_lines(path, text)
    print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
