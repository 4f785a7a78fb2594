"""Kernel-level levers, one setting against another: learner update and actor step times.

  .venv/bin/python bench/kernels.py onednn --rounds 2
  .venv/bin/python bench/kernels.py compute_dtype --rounds 3
  .venv/bin/python bench/kernels.py net --workloads atari --rounds 3 --compute_dtype=float32
  .venv/bin/python bench/kernels.py optimizer --workloads pong42 --rounds 3
  .venv/bin/python bench/kernels.py passes --workloads pong42 atari --rounds 2

Levers: `onednn` (TensorFlow's oneDNN CPU kernels, TF_ENABLE_ONEDNN_OPTS=0/1, which
TensorFlow reads once at import), `compute_dtype` (--compute_dtype=float32/bfloat16, the
agent's torso), `xla` (the update and the actor step compiled by XLA, tf.function's
jit_compile=True, against TensorFlow's graph executor: tried, not kept) and `optimizer`
(Sonnet's Adam against the learner's fused one, impala/optimizers.py; the actor step does not
use it, so its ratio there is noise) and `passes` (the recipes' 16 gradient steps per batch as 4
passes x 4 minibatches against 1 pass x 16 smaller ones; the actor step does not use them either).
Each setting runs in
its own process; the settings alternate for --rounds rounds and the table gives, per workload, the median time of each and the ratio of the
first setting's time to the second's measured in this invocation (> 1: the second is faster).
The learner update runs with TensorFlow's default threads (all cores), as the learner does;
the actor step in a process of its own with 1 thread, as actors run (--actor_threads=1).
Workloads: Pong at 84x84 (SimpleConvNetAgent, batch 32 x unroll 20, RMSProp, 1 pass; actor
step with 32 envs), the Pong recipe at 42x42 (configs/pong.flags: batch 32 x unroll 32, Adam,
4 passes x 4 minibatches, clip 0.1 to the batch start; actor step with 32 envs), CartPole
(MLPAgent, batch 16 x unroll 16, Adam, 8 passes; 16 envs) and, asked for by name, the Atari recipe
(configs/atari.flags on Breakout: 84x84, batch 32 x unroll 32, 4 passes x 4 minibatches). The table
also gives each learner update's frames/s: the most that learner could train on all cores with no
actor beside it, so a run's frames/s target above it cannot be met on these cores whatever the actors do.
Writes bench/results/<machine>/<lever>.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Nothing but the standard library at the top: TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, at
# import, so each child imports it under its own setting; and bench/startup.py, which imports
# this module, times a learner's imports from a bare process.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKLOADS = {
    "pong": ["--level_name=PongNoFrameskip-v4", "--agent_name=SimpleConvNetAgent", "--batch_size=32",
             "--unroll_length=20", "--envs_per_actor=32"],
    "pong42": ["--flagfile=" + os.path.join(ROOT, "configs", "pong.flags")],  # the Pong recipe
    "atari": ["--flagfile=" + os.path.join(ROOT, "configs", "atari.flags"), "--level_name=BreakoutNoFrameskip-v4"],
    "cartpole": ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=16", "--unroll_length=16",
                 "--envs_per_actor=16", "--optimizer=adam", "--num_sgd_iter=8", "--clip_param=0.2"],
}
DEFAULT_WORKLOADS = ["pong", "pong42", "cartpole"]  # the Atari recipe's update takes seconds: asked for by name
# lever -> its two settings: (label, environment, experiment.py flags)
LEVERS = {
    "onednn": [("oneDNN off", {"TF_ENABLE_ONEDNN_OPTS": "0"}, []),
               ("oneDNN on", {"TF_ENABLE_ONEDNN_OPTS": "1"}, [])],
    "compute_dtype": [("float32", {}, ["--compute_dtype=float32"]),
                      ("bfloat16", {}, ["--compute_dtype=bfloat16"])],
    "xla": [("graph", {}, []), ("XLA", {"BENCH_JIT_COMPILE": "1"}, [])],  # jit_compile of the measured function
    "net": [("shallow", {}, ["--agent_name=SimpleConvNetAgent"]), ("Nature", {}, ["--agent_name=NatureConvNetAgent"])],
    # --optimizer=adam's update: Sonnet's own ops against impala/optimizers.py's fused kernel (the learner's)
    "optimizer": [("Sonnet Adam", {"BENCH_SONNET_ADAM": "1"}, []), ("fused Adam", {}, [])],
    # the recipes' 16 gradient steps per batch: 4 passes over 4 minibatches against 1 pass over 16
    "passes": [("4 x 4", {}, ["--num_sgd_iter=4", "--num_minibatches=4"]),
               ("1 x 16", {}, ["--num_sgd_iter=1", "--num_minibatches=16"])],
}
PARTS = {"update_s": "learner update", "step_s": "actor step"}


def timed(fn, n, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t) / n)
    return statistics.median(ts)


def make_learner(argv, tag):
    """A Learner (rank 0 of 1) from experiment.py flags `argv`, in this process."""
    from absl import flags
    import experiment  # defines the flags
    from impala import learner as learner_lib
    flags.FLAGS([tag] + argv)
    experiment.resolve_reward_clipping()  # auto -> abs_one or none, as main() does at start-up
    return learner_lib.Learner(flags.FLAGS, os.path.join("/tmp", "%s_bench_%d" % (tag, os.getpid())), 0, 1)


def random_batch(lrn):
    """A batch of the learner's shapes as its loop passes it: random frames and actions."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    batch = lrn.zero_batch()
    obs = batch["observation"]
    batch["observation"] = (rng.integers(0, 255, obs.shape) if obs.dtype == np.uint8
                            else rng.standard_normal(obs.shape)).astype(obs.dtype)
    batch["action"] = rng.integers(0, lrn.env_spec.num_actions, batch["action"].shape).astype(batch["action"].dtype)
    return {k: tf.constant(v) for k, v in batch.items()}


def measure(part, argv, reps):
    """In this process (the setting as the environment and argv say): {part: seconds} per update
    (part update_s, with the frames each update trains) or per actor step (part step_s, 1
    TensorFlow thread)."""
    import tensorflow as tf
    if part == "step_s":
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    lrn = make_learner(argv, "kernels")
    if os.environ.get("BENCH_SONNET_ADAM") == "1":  # before the update is traced: it reads lrn.optimizer then
        lrn.optimizer = sonnet_adam(lrn)
    batch = random_batch(lrn)
    jit = os.environ.get("BENCH_JIT_COMPILE") == "1"
    if part == "update_s":
        frames = tf.constant(1, tf.int64)
        update = tf.function(lrn._step, autograph=False, jit_compile=True) if jit else lrn._train_step
        update(batch, frames)  # trace
        return {part: timed(lambda: update(batch, frames)["grad_norm"].numpy(), 5, reps),
                "frames_per_update": lrn.live_frames_per_update}
    E = lrn.flags.envs_per_actor
    step = tf.function(lambda o, f, s: lrn.agent(o, f, s), jit_compile=jit)
    o = tf.constant(batch["observation"][0, :E])
    first = tf.zeros([E], tf.bool)
    state = lrn.agent.initial_state(E)
    step(o, first, state)
    return {part: timed(lambda: step(o, first, state)[0].action.numpy(), 50, reps)}


def sonnet_adam(lrn):
    """snt.optimizers.Adam for the learner `lrn`, made as the learner makes its fused one."""
    import sonnet as snt
    from impala import learner as learner_lib
    return learner_lib.make_optimizer(lrn.flags, lrn.learning_rate, lrn.variables, adam=snt.optimizers.Adam)


def child_json(script, args, env, what):
    """Runs `script args` in a fresh process; its last JSON line (SystemExit naming `what` on failure)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    proc = subprocess.run([sys.executable, script] + args, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit("%s: %s failed:\n%s" % (os.path.relpath(script, ROOT), what, proc.stderr[-2000:]))
    return json.loads(lines[-1])


def run_child(lever, setting, workload, part, reps, extra=()):
    """The child's figures: {part: seconds} and, for an update, its frames_per_update. `extra`
    flags go after the workload's and before the setting's, so the lever's own setting wins."""
    label, env, argv = setting
    return child_json(__file__, [lever, "--child", part, "--reps", str(reps)] + WORKLOADS[workload] + list(extra)
                      + argv, env, "%s %s (%s)" % (workload, part, label))


def table(lever, res, rounds, info, workloads):
    (a, _, _), (b, _, _) = LEVERS[lever]
    lines = ["# %s: %s against %s, %d cores, %s" % (lever, a, b, info["cores"], info["cpu"]), "",
             "Median of %d round(s), each setting and figure in its own process, alternating; the learner "
             "update with all cores, the actor step with 1 thread." % rounds, "",
             "| workload | %s | %s | %s / %s (> 1: %s is faster) |" % (a, b, a, b, b), "|---|---|---|---|"]
    for w in workloads:
        for part, label in PARTS.items():
            x, y = (statistics.median(res[(w, part, s)]) for s in (a, b))
            cells = ["%.2f ms" % (1e3 * t) + learner_alone(res, w, part, s, t) for s, t in ((a, x), (b, y))]
            lines.append("| %s %s | %s | %s | **%.2f** |" % (w, label, cells[0], cells[1], x / y))
    return lines + ["", "An update's frames/s in brackets: the frames each update trains over its time, the most "
                    "that learner trains on all cores with no actor beside it."]


def learner_alone(res, workload, part, setting, seconds):
    frames = res.get((workload, "frames_per_update", setting)) if part == "update_s" else None
    return " (%.0f frames/s)" % (frames / seconds) if frames else ""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("lever", choices=sorted(LEVERS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS, choices=list(WORKLOADS))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a, argv = p.parse_known_args()  # the child's experiment.py flags
    if a.child:
        print(json.dumps(measure(a.child, argv, a.reps)), flush=True)
        return 0
    from bench import common, run as harness  # not at the top: see the note on the imports
    res = {}
    for r in range(a.rounds):
        for w in a.workloads:
            for part in PARTS:
                for setting in LEVERS[a.lever]:
                    got = run_child(a.lever, setting, w, part, a.reps, argv)
                    t = got[part]
                    res.setdefault((w, part, setting[0]), []).append(t)
                    if "frames_per_update" in got:
                        res[(w, "frames_per_update", setting[0])] = got["frames_per_update"]
                    print("round %d %s %s %s: %.2f ms" % (r + 1, w, part, setting[0], 1e3 * t), flush=True)
    out, info = harness.results_dir()
    chosen = "" if a.workloads == DEFAULT_WORKLOADS else " --workloads " + " ".join(a.workloads)
    chosen += (" --reps %d" % a.reps if a.reps != 5 else "") + "".join(" " + x for x in argv)
    lines = table(a.lever, res, a.rounds, info, a.workloads) + [
        "", "Command: `.venv/bin/python bench/kernels.py %s --rounds %d%s`" % (a.lever, a.rounds, chosen), "",
        harness.machine_line(info)]
    path = os.path.join(out, a.lever + ".md")
    common.write_lines(path, lines)
    print("\n".join(lines) + "\n\nwrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
