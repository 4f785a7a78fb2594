"""What --checkpoint_replay costs on Atari: the size on disk and the seconds to write and read
one rank's replay file (impala/replay_files.py) for buffers of real Pong unrolls.

    .venv/bin/python bench/replay_checkpoint_cost.py                 # 1000 and 4000 unrolls
    .venv/bin/python bench/replay_checkpoint_cost.py --capacities 500 2000 --repeats 3

The unrolls are what the learner stores from the native backend (frames sent newest-first,
T = 20, 84x84): random play of PongNoFrameskip-v4 in 32 envs, so the frames compress as real
ones do. Each capacity is measured with the buffer's `compress` off and on; save and load are
repeated, the median kept. Writes <out>/replay_checkpoint_cost.md.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from bench import run as bench_run
from envs import batch as env_batch
from impala import replay, replay_files, transport

T, ENVS, LEVEL = 20, 32, "PongNoFrameskip-v4"


def pong_unrolls(n, seed=0):
    """n unroll dicts of the newest-frames spec, from random play (32 envs at a time)."""
    batch = env_batch.make_batch("native", LEVEL, ENVS, seed)
    spec = transport.make_unroll_spec((84, 84, 4), np.uint8, batch.num_actions, T, [], 1, newest_frames=True)
    obs, rng, out = np.zeros((ENVS, 84, 84, 4), np.uint8), np.random.default_rng(seed), []
    batch.reset(obs)
    while len(out) < n:
        frames = [obs[..., c].copy() for c in range(4)]
        for _ in range(T):
            batch.send(rng.integers(0, batch.num_actions, ENVS).astype(np.int32))
            batch.recv(obs)
            frames.append(obs[..., -1].copy())
        stacked = np.stack(frames, axis=1)  # [E, T + 4, 84, 84]
        for e in range(ENVS):
            item = {f.name: np.zeros(f.shape, f.dtype) for f in spec.fields}
            item["frames"] = stacked[e]
            out.append(item)
    batch.close()
    return out[:n]


def measure(items, capacity, compress, repeats, work):
    specs = replay.parse_replay_parameters(
        '[{"type":"queue","capacity":1,"sample_ratio":0.5},'
        '{"type":"standard","capacity":%d,"sample_ratio":0.5,"compress":%s}]' % (capacity, str(compress).lower()))
    mixer = replay.ReplayMixer(specs, 32)
    mixer.add(items[:capacity])
    for name in os.listdir(work):  # the files of the measurement before, which pruning would mix in
        os.remove(os.path.join(work, name))
    saves, loads, size = [], [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        path = replay_files.save(mixer, work, r + 1, 0, contents=True, keep=1, log=lambda *_: None)
        saves.append(time.perf_counter() - t0)
        size = os.path.getsize(path)
        fresh = replay.ReplayMixer(specs, 32)
        t0 = time.perf_counter()
        assert replay_files.load(fresh, os.path.join(work, "ckpt-%d" % (r + 1)), 0, log=lambda *_: None)
        loads.append(time.perf_counter() - t0)
        assert replay_files.digest(fresh) == replay_files.digest(mixer)
    return {"capacity": capacity, "compress": compress, "memory_mb": mixer.nbytes() / 1e6, "disk_mb": size / 1e6,
            "save_s": float(np.median(saves)), "load_s": float(np.median(loads))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacities", type=int, nargs="+", default=[1000, 4000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    a = p.parse_args()
    out, machine = bench_run.results_dir(a.out)
    items = pong_unrolls(max(a.capacities))
    work = tempfile.mkdtemp(prefix="replay_cost_")
    rows = []
    try:
        for capacity in a.capacities:
            for compress in (False, True):
                rows.append(measure(items, capacity, compress, a.repeats, work))
                print(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = ["# --checkpoint_replay on Pong: one rank's replay file (T = %d, 84x84, newest frames)\n" % T,
             "| unrolls stored | buffer compress | in memory (MB) | on disk (MB) | write (s) | read (s) |",
             "|---|---|---|---|---|---|"]
    lines += ["| %d | %s | %.0f | %.0f | %.2f | %.2f |" % (r["capacity"], "on" if r["compress"] else "off",
                                                          r["memory_mb"], r["disk_mb"], r["save_s"], r["load_s"])
              for r in rows]
    lines += ["", "Median of %d writes and reads each (the file is lz4 over a pickle)." % a.repeats]
    bench_run.write_table(out, "replay_checkpoint_cost", lines, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
