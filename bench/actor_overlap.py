"""How fast can one actor process step Pong and run its policy? Each actor-side lever measured
alone (no learner, no transport), round-robin, in fresh processes:

  python       envs/factory.py's gymnasium envs stepped one by one in Python, then inference (the Python backend)
  native       ale-py's C++ vector env, stepped and then inferred, alternately
  groups2      native, the envs in 2 groups: one group steps in C++ threads while the other infers
               (Sample Factory's double-buffered sampling); through actor.fill_unroll, as the actor runs it
  async_half   native in EnvPool's async mode: a pool of E envs, recv() returns the first E/2 that
               finished, inference on those, send() them back (no unroll bookkeeping: an upper bound)

  .venv/bin/python bench/actor_overlap.py --seconds 15 --rounds 2

Prints frames/s (4 per agent step) per variant and thread count, and writes
bench/results/<machine>/actor_overlap.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

import gymnasium as gym
import numpy as np
from ale_py.vector_env import AtariVectorEnv

from bench import common
from bench import run as harness

VARIANTS = ["python", "native", "groups2", "async_half"]


def measure(variant, envs_per_actor, env_threads, seconds, size):
    """Runs in a fresh process: frames/s of one variant."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    # Imported here, after the line above: TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, at import.
    import tensorflow as tf
    from impala import actor
    from impala import agent as agent_lib
    from impala.timings import Timings
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    level, T = "PongNoFrameskip-v4", 20
    agent, spec, env_spec = agent_lib.build_agent(level, "SimpleConvNetAgent", T, (size, size))
    step = tf.function(lambda o, f, s: agent(o, f, s))
    if variant == "async_half":
        return _async_half(agent, step, level, envs_per_actor, env_threads, seconds, size)
    flags = types.SimpleNamespace(envs_per_actor=envs_per_actor, env_groups=2 if variant == "groups2" else 1,
                                  env_backend="python" if variant == "python" else "native",
                                  env_threads=env_threads, level_name=level, seed=1, width=size, height=size)
    groups = actor.make_groups(flags, 0, agent, env_spec)
    buf = {f.name: np.zeros((envs_per_actor,) + f.shape, f.dtype) for f in spec.fields}
    timing = Timings(*actor.PHASES)
    actor.fill_unroll(groups, buf, step, T, timing)  # warm-up (traces the step)
    timing.reset()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        actor.fill_unroll(groups, buf, step, T, timing)
        steps += T * envs_per_actor
    dt = time.perf_counter() - t0
    for g in groups:
        g.batch.close()
    return {"fps": 4 * steps / dt, "env_s": timing["env"] / dt, "inference_s": timing["inference"] / dt}


def _async_half(agent, step, level, E, threads, seconds, size):
    import tensorflow as tf  # imported by measure() already, as TF_ENABLE_ONEDNN_OPTS says
    half = E // 2
    env = AtariVectorEnv(gym.spec(level).kwargs["game"], E, batch_size=half, num_threads=threads,
                         img_height=size, img_width=size, reward_clipping=False,
                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env.reset(seed=1)  # async mode: reset sends; the first recv returns the first half to finish
    obs_hwc = np.zeros((half, size, size, 4), np.uint8)
    first = tf.zeros([half], tf.bool)
    state = agent.initial_state(half)
    t_inf, steps, t0 = 0.0, 0, None
    while t0 is None or time.perf_counter() - t0 < seconds:
        obs, _, _, _, info = env.recv()
        for c in range(4):
            obs_hwc[..., c] = obs[:, c]
        t1 = time.perf_counter()
        out, _ = step(tf.constant(obs_hwc), first, state)
        actions = out.action.numpy()
        t_inf += time.perf_counter() - t1
        env.send(actions.astype(np.int32))  # to the env ids recv() returned (ALE keeps them)
        if t0 is None:
            t0, t_inf = time.perf_counter(), 0.0
        else:
            steps += half
    dt = time.perf_counter() - t0
    env.close()
    return {"fps": 4 * steps / dt, "env_s": float("nan"), "inference_s": t_inf / dt}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--envs", type=int, default=32)
    p.add_argument("--size", type=int, default=84)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--_one", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._one:
        variant, threads = a._one.split(":")
        print(json.dumps(measure(variant, a.envs, int(threads), a.seconds, a.size)))
        return 0
    configs = [(v, t) for v in a.variants for t in (a.threads if v != "python" else [1])]
    res = {c: [] for c in configs}
    for r in range(a.rounds):
        for v, t in configs:
            out = subprocess.run([sys.executable, __file__, "--_one", "%s:%d" % (v, t), "--seconds", str(a.seconds),
                                  "--envs", str(a.envs), "--size", str(a.size)], capture_output=True, text=True)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if not line:
                raise RuntimeError("%s:%d failed: %s" % (v, t, out.stderr[-1500:]))
            res[(v, t)].append(json.loads(line[-1]))
            print("round %d %-10s threads %d: %s" % (r + 1, v, t, res[(v, t)][-1]), flush=True)
    out_dir, info = harness.results_dir()
    base = statistics.median(x["fps"] for x in res[("python", 1)]) if ("python", 1) in res else None
    lines = ["# One actor process: Pong frames/s of env stepping + policy inference, no learner",
             "", "%d envs, %dx%d frames, SimpleConvNetAgent inference on 1 TensorFlow thread, %d round(s) of "
             "%.0f s, each variant in a fresh process, round-robin; median (min-max)." % (
                 a.envs, a.size, a.size, a.rounds, a.seconds), "",
             "| variant | env threads | frames/s | vs python | inference share of wall time |", "|---|---|---|---|---|"]
    for (v, t), xs in res.items():
        fps = [x["fps"] for x in xs]
        med = statistics.median(fps)
        lines.append("| %s | %s | %.0f (%.0f-%.0f) | %s | %.0f%% |" % (
            v, t if v != "python" else "-", med, min(fps), max(fps), "%.2fx" % (med / base) if base else "-",
            100 * statistics.median(x["inference_s"] for x in xs)))
    lines += ["", "Command: `.venv/bin/python bench/actor_overlap.py --seconds %g --rounds %d --envs %d --size %d`"
              % (a.seconds, a.rounds, a.envs, a.size), "", harness.machine_line(info)]
    common.write_lines(os.path.join(out_dir, "actor_overlap%s.md" % ("" if a.size == 84 else "_%d" % a.size)), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
