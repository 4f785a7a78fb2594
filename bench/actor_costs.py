"""The actor's and learner's per-step costs outside the emulator, each lever against what it replaced.

  .venv/bin/python bench/actor_costs.py --rounds 3

One process, TensorFlow on 1 thread (as actors run). Each pair alternates for --rounds rounds;
the table gives the median time per call and the ratio (before / after: > 1, the lever is faster).
  interleave   16 envs' 4 frames into [16, 84, 84, 4]: numpy channel by channel from ale-py's
               [16, 4, 84, 84] against envs.merge_frames from the slot-major ring
               [4, 16, 84, 84] that NativeAtariBatch keeps
  stack        the learner's stacks of a batch of 32 unrolls of 20 steps sent as newest frames:
               numpy channel by channel against transport.stack_frames (one OpenCV merge per unroll)
  ale_stack    ale-py stepping 32 Pong envs on 2 threads, random actions: its own 4-frame stack
               against stack_num=1 (NativeAtariBatch keeps the stacks), frames/s
  dispatch     one inference call of SimpleConvNetAgent in bfloat16 on 16 frames: the tf.function
               against its concrete function called directly (actor.py)
Writes bench/results/<machine>/actor_costs.md.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

import envs
import nets
from envs import batch as env_batch
from impala import agent as agent_lib
from impala import devices
from impala import transport
from bench import common
from bench import run as harness


def per_call(fn, seconds=2.0):
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def interleave_pair():
    chw = np.random.default_rng(0).integers(0, 256, (16, 4, 84, 84), np.uint8)  # ale-py's own stacks
    ring = np.ascontiguousarray(np.swapaxes(chw, 0, 1))  # NativeAtariBatch's slot-major ring
    out = np.zeros((16, 84, 84, 4), np.uint8)

    def numpy_channels():
        for c in range(4):
            out[..., c] = chw[:, c]
    return numpy_channels, lambda: envs.merge_frames(list(ring), out)


def stack_pair():
    frames = np.random.default_rng(0).integers(0, 256, (32, 24, 84, 84), np.uint8)
    reset = np.zeros((32, 21), bool)

    def numpy_channels():
        obs = np.empty((21, 32, 84, 84, 4), np.uint8)
        by_time = np.swapaxes(frames, 0, 1)
        for k in range(4):
            obs[..., k] = by_time[k:k + 21]
    return numpy_channels, lambda: transport.stack_frames(frames, reset)


def ale_fps(stack_num, seconds=8.0):
    env = env_batch.ale_vector_env("PongNoFrameskip-v4", 32, threads=2, stack_num=stack_num)
    env.reset(seed=1)
    rng, steps, t0 = np.random.default_rng(0), 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.send(rng.integers(0, 6, 32).astype(np.int32))
        env.recv()
        steps += 32
    fps = 4 * steps / (time.perf_counter() - t0)
    env.close()
    return fps


def dispatch_pair():
    devices.set_threads(1)
    agent, _, _ = agent_lib.build_agent("PongNoFrameskip-v4", "SimpleConvNetAgent", 20, 84, "bfloat16")
    nets.freeze_casts(agent)()  # as actor.run reads the weights
    fn = tf.function(lambda o, f, s: agent(o, f, s), autograph=False)
    obs, first = np.zeros((16, 84, 84, 4), np.uint8), np.zeros(16, bool)
    concrete = fn.get_concrete_function(tf.TensorSpec(obs.shape, tf.uint8), tf.TensorSpec([16], tf.bool), ())

    def call(f):
        out, _ = f(tf.constant(obs), tf.constant(first), ())
        out.action.numpy()
    return lambda: call(fn), lambda: call(concrete)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    pairs = {"interleave": interleave_pair(), "stack": stack_pair(), "dispatch": dispatch_pair()}
    times = {k: ([], []) for k in list(pairs) + ["ale_stack"]}
    for r in range(a.rounds):
        for k, (before, after) in pairs.items():
            times[k][0].append(per_call(before))
            times[k][1].append(per_call(after))
        times["ale_stack"][0].append(ale_fps(4))
        times["ale_stack"][1].append(ale_fps(1))
        print("round %d: %s" % (r + 1, {k: (v[0][-1], v[1][-1]) for k, v in times.items()}), flush=True)
    labels = {"interleave": ("numpy, channel by channel", "OpenCV merge (envs.merge_frames)", "us", 1e6),
              "stack": ("numpy, channel by channel", "OpenCV merge per unroll (stack_frames)", "ms", 1e3),
              "dispatch": ("tf.function", "its concrete function", "ms", 1e3),
              "ale_stack": ("ale-py's 4-frame stack", "stack_num=1", "frames/s", 1)}

    def fmt(xs, unit, scale):
        f = "%.0f" if unit == "frames/s" else "%.3g"
        return (f + " (" + f + "-" + f + ") %s") % (statistics.median(xs) * scale, min(xs) * scale,
                                                     max(xs) * scale, unit)
    lines = ["# Per-step costs outside the emulator: each lever against what it replaced", "",
             "%d round(s), alternating; median (min-max); one process, TensorFlow on 1 thread." % a.rounds, "",
             "| cost | before | after | before | after | gain |", "|---|---|---|---|---|---|"]
    for k, (b, f) in times.items():
        name_b, name_a, unit, scale = labels[k]
        mb, ma = statistics.median(b), statistics.median(f)
        gain = ma / mb if k == "ale_stack" else mb / ma  # frames/s: after / before; times: before / after
        lines.append("| %s | %s | %s | %s | %s | **%.2fx** |" % (k, name_b, name_a, fmt(b, unit, scale),
                                                                   fmt(f, unit, scale), gain))
    lines += ["", "Command: `.venv/bin/python bench/actor_costs.py --rounds %d`" % a.rounds]
    out, info = harness.results_dir()
    lines += ["", harness.machine_line(info)]
    common.write_lines(os.path.join(out, "actor_costs.md"), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
