"""How close the learner's update comes to the cores' peak arithmetic, and where the rest of it goes.

  .venv/bin/python bench/learner_efficiency.py --rounds 1
  .venv/bin/python bench/learner_efficiency.py --quick          # tiny shapes, 1 round: a smoke test

In one invocation, on this machine:
1. Peak: a 2048^3 matmul and a conv2d (batch 64, 84x84x32 -> 64 channels, 3x3, SAME) through
   TensorFlow in float32 and bfloat16 (2 warm-up calls, then the median of --reps timings), as
   GFLOP/s from the shapes (2*M*N*K; 2*N*Ho*Wo*Cout*Kh*Kw*Cin); at least 5 timings whatever --reps.
2. Per net (the conv nets on Atari 84x84x4 frames, MLPAgent on CartPole), the learner update of the
   Atari recipe (configs/atari.flags: batch 32 x unroll 32, 4 passes x 4 minibatches), built as
   bench/kernels.py builds it (kernels.make_learner, kernels.random_batch); its FLOPs counted by
   TensorFlow's profiler on the traced graphs (count_flops: what it does and does not count), the
   achieved GFLOP/s and that as a share of the float32 matmul peak of step 1.
3. A breakdown of the update: the batch start (a forward unroll of the batch, V-trace's targets,
   the statistics), V-trace alone, one gradient step's forward+backward and its optimizer apply (each
   times the update's steps), the input copy (numpy -> tensors) and the rest (the update minus those
   parts: clipping and norms, minibatch gathers, the graph loop, Python dispatch).
4. ResNetLSTMAgent's learner samples/s over ResNetAgent's (same batch, unroll, frame size).
Each measurement (the peak, each net) runs in its own process; the contenders alternate for
--rounds rounds and the tables give medians. Writes bench/results/<machine>/learner_efficiency.md.
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import kernels  # noqa: E402  (the standard library only at its top, as here)

CARTPOLE = ["--level_name=CartPole-v1"]  # the Atari recipe's learning settings on CartPole frames
NETS = [("SimpleConvNetAgent", []), ("NatureConvNetAgent", []), ("ResNetAgent", []),
        ("ResNetLSTMAgent", []), ("MLPAgent", CARTPOLE)]
QUICK_NETS = [("SimpleConvNetAgent", []), ("MLPAgent", CARTPOLE)]
QUICK = ["--batch_size=4", "--unroll_length=4", "--num_sgd_iter=1", "--num_minibatches=2", "--width=42", "--height=42"]
PEAK_SHAPES = {"full": (2048, (64, 84, 84, 32, 64, 3)), "quick": (256, (4, 21, 21, 8, 16, 3))}
PARTS = [("copy_s", "input copy"), ("batch_start_s", "batch start"), ("vtrace_s", "of it V-trace"),
         ("fwd_bwd_s", "fwd+bwd"), ("apply_s", "optimizer apply"), ("rest_s", "rest")]


# ------------------------------------------------------------------ counting
def count_flops(graph):
    """TensorFlow's profiler's float-operation count of `graph` (a concrete function's graph).
    It counts the ops with registered flops statistics: Conv2D, MatMul, their gradients (MatMul,
    Conv2DBackpropInput/Filter, the latter two over the input's spatial size, so a VALID conv's
    gradients count a little over) and elementwise ops at one per element. It does not count ops
    inside nested functions: a tf.while_loop's or tf.scan's body (the LSTM's time loop, V-trace's
    scan, the update's loop over gradient steps), hence lstm_core_flops and gradient steps counted
    one by one. Needs static shapes."""
    from tensorflow.compat.v1 import profiler
    opts = profiler.ProfileOptionBuilder(profiler.ProfileOptionBuilder.float_operation()).with_empty_output().build()
    return int(profiler.profile(graph, cmd="scope", options=opts).total_float_ops)


def loops_in(graph):
    """The number of While ops in `graph`: bodies count_flops does not see."""
    return sum(op.type in ("While", "StatelessWhile") for op in graph.get_operations())


def lstm_core_flops(agent, frames):
    """The FLOPs of an LSTM core the profiler misses (it runs in snt.dynamic_unroll's while loop):
    2 per weight of its matrices per frame forward, 3x that forward+backward. 0 for a net with no core."""
    core = getattr(agent, "_core", None)
    if core is None:
        return 0
    weights = sum(int(v.shape.num_elements()) for v in core.trainable_variables if len(v.shape) == 2)
    return 2 * weights * frames


def matmul_flops(m, n, k):
    return 2 * m * n * k


def conv_flops(n, ho, wo, cout, kh, kw, cin):
    return 2 * n * ho * wo * cout * kh * kw * cin


# ------------------------------------------------------------------ peak
def peak(size, reps):
    """{"<op> <dtype>": GFLOP/s} of a size^3 matmul and PEAK_SHAPES' conv, float32 and bfloat16."""
    import tensorflow as tf
    s, (n, h, w, cin, cout, k) = PEAK_SHAPES[size]
    out = {}
    for dtype in (tf.float32, tf.bfloat16):
        a, b = tf.random.normal([s, s], dtype=dtype), tf.random.normal([s, s], dtype=dtype)
        x, f = tf.random.normal([n, h, w, cin], dtype=dtype), tf.random.normal([k, k, cin, cout], dtype=dtype)
        mm = tf.function(lambda: tf.matmul(a, b)[0, 0])
        cv = tf.function(lambda: tf.nn.conv2d(x, f, 1, "SAME")[0, 0, 0, 0])
        ops = (("matmul", mm, matmul_flops(s, s, s)), ("conv2d", cv, conv_flops(n, h, w, cout, k, k, cin)))
        for name, fn, flops in ops:
            fn(), fn()  # warm-up (trace, oneDNN's primitive)
            out["%s %s" % (name, dtype.name)] = flops / kernels.timed(lambda: fn().numpy(), 1, max(5, reps)) / 1e9
    return out


# ------------------------------------------------------------------ one net
def parts_fns(lrn):
    """The update's parts as tf.functions: batch start, V-trace, one gradient step's forward+backward, apply."""
    import tensorflow as tf
    from impala import loss as loss_lib
    fn = lambda f: tf.function(f, autograph=False)  # noqa: E731

    def fwd_bwd(mb, value_scale):
        with tf.GradientTape() as tape:
            out, _ = lrn.agent.unroll(mb["observation"], mb["first"], lrn._core_state(mb))
            loss, _ = loss_lib.compute_losses(out, mb, lrn.flags, value_scale, lrn.action_bounds())
        return tape.gradient(loss, lrn.variables)

    def unroll(b):
        return lrn.agent.unroll(b["observation"], b["first"], lrn._core_state(b))[0]
    return (fn(lrn._batch_start), fn(lambda out, b: loss_lib.vtrace_targets(out, b, lrn.flags).vs), fn(unroll),
            fn(fwd_bwd), fn(lambda g: lrn.optimizer.apply(g, lrn.variables)))


def first(x):
    """Waits for a tf.function's result: the numpy value of its first tensor."""
    import tensorflow as tf
    return tf.nest.flatten(x)[0].numpy()


def net_times(lrn, batch, reps):
    """{part: seconds per update} of the learner's update and its parts, and the graphs counted."""
    import tensorflow as tf
    steps = lrn.flags.num_sgd_iter * lrn.flags.num_minibatches
    start, vtrace, unroll, fwd_bwd, apply = parts_fns(lrn)
    frames, arrays = tf.constant(1, tf.int64), {k: v.numpy() for k, v in batch.items()}
    t = lambda f: kernels.timed(f, 1, reps)  # noqa: E731
    lrn._train_step(batch, frames)  # trace
    res = {"update_s": t(lambda: lrn._train_step(batch, frames)["grad_norm"].numpy()),
           "copy_s": t(lambda: [tf.constant(v) for v in arrays.values()][-1].numpy())}
    prepared, scale = start(batch)
    mb = lrn._minibatches(prepared, lrn.flags.num_sgd_iter, lrn.flags.num_minibatches)(tf.constant(0))
    grads = fwd_bwd(mb, scale)
    apply(grads)
    vt_input = batch if lrn.flags.vtrace_targets == "batch_start" else mb
    vt_out = unroll(vt_input)  # V-trace alone: on the agent's output computed beforehand
    vtrace(vt_out, vt_input)
    res["batch_start_s"] = t(lambda: first(start(batch)))
    res["vtrace_s"] = (steps if vt_input is mb else 1) * t(lambda: first(vtrace(vt_out, vt_input)))
    res["fwd_bwd_s"] = steps * t(lambda: first(fwd_bwd(mb, scale)))
    res["apply_s"] = steps * t(lambda: apply(grads) and None)
    res["rest_s"] = res["update_s"] - res["batch_start_s"] - res["fwd_bwd_s"] - res["apply_s"]
    graphs = (start.get_concrete_function(batch).graph, fwd_bwd.get_concrete_function(mb, scale).graph)
    return res, graphs, int(mb["action"].shape[0] * mb["action"].shape[1])


def measure_net(agent, argv, reps):
    """In this process: one net's update times, FLOPs per update (counted) and samples/s."""
    lrn = kernels.make_learner(argv + ["--agent_name=" + agent], "learner_efficiency")
    batch = kernels.random_batch(lrn)
    res, (start_graph, step_graph), mb_frames = net_times(lrn, batch, reps)
    steps = lrn.flags.num_sgd_iter * lrn.flags.num_minibatches
    batch_frames = lrn.flags.batch_size * (lrn.flags.unroll_length + 1)
    flops = count_flops(start_graph) + steps * count_flops(step_graph)
    core = lstm_core_flops(lrn.agent, batch_frames) + steps * 3 * lstm_core_flops(lrn.agent, mb_frames)
    res.update(flops=flops + core, lstm_core_flops=core, uncounted_loops=loops_in(start_graph) + loops_in(step_graph),
               samples=lrn.flags.batch_size * lrn.flags.unroll_length, steps=steps,
               compute_dtype=lrn.agent.compute_dtype.name if hasattr(lrn.agent.compute_dtype, "name")
               else str(lrn.agent.compute_dtype))
    return res


# ------------------------------------------------------------------ the invocation
def child_main(a, argv):
    if a.child == "peak":
        return peak("quick" if a.quick else "full", a.reps)
    return measure_net(a.child, argv + ["--compute_dtype=" + a.compute_dtype], a.reps)


def run_rounds(a, argv):
    """{"peak": [figures per round], net: [figures per round]}, the contenders alternating."""
    nets = QUICK_NETS if a.quick else NETS
    base = ["--compute_dtype=" + a.compute_dtype] + kernels.WORKLOADS["atari"] + (QUICK if a.quick else []) + argv
    res = {}
    for r in range(a.rounds):
        for name, extra in [("peak", [])] + nets:
            args = ["--child", name, "--reps", str(a.reps)] + (["--quick"] if a.quick else []) + base + extra
            got = kernels.child_json(__file__, args, {}, name)
            res.setdefault(name, []).append(got)
            print("round %d %s: %s" % (r + 1, name, json.dumps(got)), flush=True)
    return res


def med(rounds, key):
    return statistics.median(r[key] for r in rounds)


def peak_lines(peaks):
    lines = ["## Peak arithmetic through TensorFlow", "", "| op | GFLOP/s |", "|---|---|"]
    return lines + ["| %s | %.0f |" % (k, med(peaks, k)) for k in peaks[0]] + [""]


def efficiency_lines(res, nets, peak32):
    lines = ["## The update: FLOPs counted, achieved", "",
             "| net | dtype | update | samples/s | GFLOP/update | GFLOP/s | of f32 matmul peak "
             "| of it LSTM core (added) |",
             "|---|---|---|---|---|---|---|---|"]
    for n in nets:
        r, t = res[n], med(res[n], "update_s")
        lines.append("| %s | %s | %.0f ms | %.0f | %.2f | %.1f | %.1f%% | %.2f GFLOP |" % (
            n, r[0]["compute_dtype"], 1e3 * t, r[0]["samples"] / t, r[0]["flops"] / 1e9, r[0]["flops"] / t / 1e9,
            100 * r[0]["flops"] / t / 1e9 / peak32, r[0]["lstm_core_flops"] / 1e9))
    return lines + [""]


def breakdown_lines(res, nets):
    lines = ["## Where the update goes (ms per update; share of update + copy)", "",
             "| net | update + copy | " + " | ".join(label for _, label in PARTS) + " |",
             "|---" * (len(PARTS) + 2) + "|"]
    for n in nets:
        total = med(res[n], "update_s") + med(res[n], "copy_s")
        cells = ["%.0f (%.0f%%)" % (1e3 * med(res[n], k), 100 * med(res[n], k) / total) for k, _ in PARTS]
        lines.append("| %s | %.0f | %s |" % (n, 1e3 * total, " | ".join(cells)))
    return lines + [""]


def ratio_lines(res):
    if "ResNetLSTMAgent" not in res or "ResNetAgent" not in res:
        return []
    x = med(res["ResNetAgent"], "update_s") / med(res["ResNetLSTMAgent"], "update_s")
    return ["## ResNetLSTMAgent against ResNetAgent", "",
            "Learner samples/s of ResNetLSTMAgent / ResNetAgent, same batch, unroll and frames: **%.2f** "
            "(target >= 0.8: %s)." % (x, "met" if x >= 0.8 else "not met"), ""]


def notes(res, nets):
    loops = ", ".join("%s %d" % (n, res[n][0]["uncounted_loops"]) for n in nets)
    return ["FLOPs: TensorFlow's profiler (tf.compat.v1.profiler, float_operation) on the traced graphs of the "
            "batch start and of one gradient step's forward+backward, the latter times the update's gradient steps; "
            "it counts Conv2D, MatMul and their gradient ops and elementwise ops, not what runs in while-loop bodies "
            "(While ops per net: %s): the LSTM core's FLOPs are added from its weights (2 per weight per frame, x3 "
            "with the backward), V-trace's scan and the optimizer's elementwise work are not counted (small). "
            "Timings: the parts each in a tf.function of their own, a gradient step's times the update's steps; "
            "V-trace alone on the agent's output computed beforehand (once per batch with "
            "--vtrace_targets=batch_start, "
            "inside the batch start; else per step, inside fwd+bwd); rest = update - batch start - fwd+bwd - apply: "
            "clipping, norms, minibatch gathers, the graph loop and dispatch, negative where the parts timed alone "
            "take longer than inside the whole update's graph (noise on shared cores, the gradients returned)." % loops]


def report(a, argv, res):
    from bench import common, run as harness  # not at the top: see bench/kernels.py's note on the imports
    nets = [n for n, _ in (QUICK_NETS if a.quick else NETS)]
    out, info = harness.results_dir(a.out)
    cmd = ".venv/bin/python bench/learner_efficiency.py --rounds %d%s%s%s" % (
        a.rounds, " --quick" if a.quick else "", " --reps %d" % a.reps if a.reps != 3 else "",
        "".join(" " + x for x in argv))
    lines = (["# Learner efficiency: %d cores, %s" % (info["cores"], info["cpu"]), "",
              "Median of %d round(s), the peak and each net in its own process, alternating; the update is "
              "the Atari recipe's (configs/atari.flags%s, --compute_dtype=%s)." % (
                  a.rounds, " with " + " ".join(QUICK) if a.quick else "", a.compute_dtype), ""]
             + peak_lines(res["peak"]) + efficiency_lines(res, nets, med(res["peak"], "matmul float32"))
             + breakdown_lines(res, nets) + ratio_lines(res) + notes(res, nets)
             + ["", "Command: `%s`" % cmd, "", harness.machine_line(info)])
    path = os.path.join(out, "learner_efficiency%s.md" % ("_quick" if a.quick else ""))
    common.write_lines(path, lines)
    print("\n".join(lines) + "\n\nwrote " + path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny shapes and nets, for a smoke test")
    p.add_argument("--compute_dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    p.add_argument("--out", default=None, help="the results folder (default bench/results/<machine>/)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a, argv = p.parse_known_args()  # further experiment.py flags, after the recipe's
    if a.child:
        print(json.dumps(child_main(a, argv)), flush=True)
        return 0
    report(a, argv, run_rounds(a, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
