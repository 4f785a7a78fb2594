"""TensorFlow's oneDNN CPU kernels on or off: learner update and actor inference times.

  .venv/bin/python bench/onednn.py --rounds 2

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it is imported, so each setting runs in
its own process; the settings alternate for --rounds rounds and the table gives, per
workload, the median time of each and the ratio off/on measured in this invocation (> 1:
oneDNN faster). Workloads: the Pong learner update (SimpleConvNetAgent at 84x84, batch
32 x unroll 20, RMSProp) and actor step (32 envs), and CartPole's (MLPAgent, batch 16 x
unroll 16, Adam, 8 passes; actor step with 16 envs). Writes bench/results/<machine>/onednn.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = {
    "pong": ["--level_name=PongNoFrameskip-v4", "--agent_name=SimpleConvNetAgent", "--batch_size=32",
             "--unroll_length=20", "--envs_per_actor=32"],
    "cartpole": ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=16", "--unroll_length=16",
                 "--envs_per_actor=16", "--optimizer=adam", "--num_sgd_iter=8", "--clip_param=0.2"],
}


def measure(workload, reps):
    """In this process (oneDNN as the environment says): seconds per update and per actor step."""
    sys.path.insert(0, ROOT)
    import numpy as np
    import tensorflow as tf
    from absl import flags
    import experiment  # noqa: F401  (defines the flags)
    import learner as learner_lib
    fl = flags.FLAGS
    fl(["onednn"] + WORKLOADS[workload])
    lrn = learner_lib.Learner(fl, os.path.join("/tmp", "onednn_bench_%d" % os.getpid()), 0, 1)
    rng = np.random.default_rng(0)
    batch = lrn.zero_batch()
    obs = batch["observation"]
    batch["observation"] = (rng.integers(0, 255, obs.shape) if obs.dtype == np.uint8
                            else rng.standard_normal(obs.shape)).astype(obs.dtype)
    batch = {k: tf.constant(v) for k, v in batch.items()}
    frames = tf.constant(1, tf.int64)
    lrn._train_step(batch, frames)  # trace
    E = fl.envs_per_actor
    step = tf.function(lambda o, f, s: lrn.agent(o, f, s))
    o = tf.constant(batch["observation"][0, :E])
    first = tf.zeros([E], tf.bool)
    state = lrn.agent.initial_state(E)
    step(o, first, state)

    def timed(fn, n):
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            ts.append((time.perf_counter() - t) / n)
        return statistics.median(ts)
    update = timed(lambda: lrn._train_step(batch, frames)["grad_norm"].numpy(), 5)
    infer = timed(lambda: step(o, first, state)[0].action.numpy(), 50)
    return {"update_s": update, "step_s": infer}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.reps)), flush=True)
        return 0
    sys.path.insert(0, HERE)
    import run as harness
    res = {(w, s): [] for w in WORKLOADS for s in ("0", "1")}
    for r in range(a.rounds):
        for w in WORKLOADS:
            for setting in ("0", "1"):
                env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting, TF_CPP_MIN_LOG_LEVEL="2")
                proc = subprocess.run([sys.executable, __file__, "--child", w, "--reps", str(a.reps)],
                                      env=env, capture_output=True, text=True, timeout=900)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode != 0 or not lines:
                    raise SystemExit("bench/onednn.py: the %s run with oneDNN=%s failed:\n%s"
                                     % (w, setting, proc.stderr[-2000:]))
                res[(w, setting)].append(json.loads(lines[-1]))
                print("round %d %s oneDNN=%s %s" % (r + 1, w, setting, lines[-1]), flush=True)
    out = harness.machine_dir()
    os.makedirs(out, exist_ok=True)
    info = harness.write_machine(out)
    lines = ["# TensorFlow oneDNN kernels on / off (TF_ENABLE_ONEDNN_OPTS), %d cores, %s" % (
        info["cores"], info["cpu"]), "",
        "Median of %d round(s), each setting in its own process, alternating; %d timings of each figure "
        "per process." % (a.rounds, a.reps), "",
        "| workload | oneDNN off | oneDNN on | off / on (> 1: on is faster) |", "|---|---|---|---|"]
    for w in WORKLOADS:
        for key, label in (("update_s", "learner update"), ("step_s", "actor step")):
            off = statistics.median(x[key] for x in res[(w, "0")])
            on = statistics.median(x[key] for x in res[(w, "1")])
            lines.append("| %s %s | %.2f ms | %.2f ms | **%.2f** |" % (w, label, 1e3 * off, 1e3 * on, off / on))
    lines += ["", "experiment.py turns oneDNN on unless given --noonednn.", "",
              "Command: `.venv/bin/python bench/onednn.py --rounds %d`" % a.rounds, "", harness.machine_line(info)]
    path = os.path.join(out, "onednn.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines) + "\n\nwrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
