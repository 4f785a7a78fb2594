"""The physical limit: the fastest these cores step an Atari game, random actions, no learning.

Measured two ways, each in fresh processes:
  python  N processes, each stepping one envs/factory.py env (gymnasium wrappers in Python)
  native  one process with ale-py's C++ vector env, threads = cores (preprocessing in C++),
          at 32 and 64 envs; its figure is the faster of the two

Frames = 4 x agent steps (frame skip 4). End-to-end figures are reported as a fraction of
the higher of the two ceilings.

  .venv/bin/python bench/ceiling.py --seconds 20
"""
import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time

import numpy as np

import envs
from envs import batch as env_batch


def _python_env(level, seconds, seed, screen, out):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the measurement
    env = envs.make_env(level, seed=seed, training=True, frame_size=screen)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    n = env.action_space.n
    steps, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        _, _, term, trunc, _ = env.step(int(rng.integers(n)))
        if term or trunc:
            env.reset()
        steps += 1
    out.put(steps / (time.time() - t0))


def _native_env(level, seconds, num_envs, threads, screen, out):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as _python_env
    batch = env_batch.make_batch("native", level, num_envs, seed=1, frame_size=screen, threads=threads)
    w, h = screen
    obs = np.zeros((num_envs, h, w, 4), np.uint8)
    batch.reset(obs)
    actions = np.random.default_rng(0).integers(0, batch.num_actions, (256, num_envs))
    steps, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        batch.send(actions[steps % 256])
        batch.recv(obs)
        steps += 1
    out.put(steps * num_envs / (time.time() - t0))
    batch.close()


def _in_processes(target, args_list, seconds):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=target, args=args + (q,)) for args in args_list]
    for p in ps:
        p.start()
    try:
        rates = [q.get(timeout=seconds + 120) for _ in ps]
    except BaseException:  # Ctrl-C or a process that never reported: no stepper outlives the measurement
        for p in ps:
            p.terminate()
        raise
    finally:
        for p in ps:
            p.join()
    return sum(rates)


def python_fps(level, processes, seconds, screen=(84, 84)):
    """Frames/s of `processes` processes stepping one envs/factory.py env each."""
    return 4 * _in_processes(_python_env, [(level, seconds, i, screen) for i in range(processes)], seconds)


def native_fps(level, threads, seconds, screen=(84, 84), env_counts=(32, 64)):
    """Frames/s of ale-py's vector env with `threads` C++ threads: the best of env_counts."""
    return max(4 * _in_processes(_native_env, [(level, seconds, n, threads, screen)], seconds) for n in env_counts)


def physical_limit(level, cores, seconds, screen=(84, 84)):
    """{'python': fps, 'native': fps, 'limit': the higher}, measured now."""
    py, native = python_fps(level, cores, seconds, screen), native_fps(level, cores, seconds, screen)
    return {"python": py, "native": native, "limit": max(py, native)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--size", type=int, default=84)
    a = p.parse_args()
    print(json.dumps(physical_limit(a.level, os.cpu_count(), a.seconds, (a.size, a.size))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
