"""What the per-worker telemetry costs the throughput suite's run: our Pong configuration
(bench/run.py's OURS: 3 actors x 64 envs, bfloat16, 1 learner thread) with --telemetry and with
--notelemetry, alternating, on the same cores.

  .venv/bin/python bench/telemetry_cost.py --seconds 60 --repeats 3

Each run is bench/run.py's impala_fps (median end-to-end frames/s of the progress lines after 20 s
of warm-up); the order alternates between repeats so a drift of the machine hits both. The unroll
fields travel either way (44 bytes per unroll next to 4 x 84 x 84 frames): the flag switches the
actors' CPU and memory probe and the learner's table. Writes bench/results/<machine>/telemetry_cost.md.
"""
import argparse
import statistics
import tempfile
import time

import numpy as np

from bench import run as harness
from impala import telemetry
from impala.timings import Timings

LEVEL = "PongNoFrameskip-v4"


def per_call_us(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def component_costs():
    """Each piece of the telemetry timed alone, in microseconds per call: the actor's probe (once per
    unroll), the learner's add_batch (once per batch of 32 unrolls from 3 actors) and its table
    (TensorBoard, CSV and JSON, once per log period)."""
    with tempfile.TemporaryDirectory(prefix="bench_telemetry_") as folder:
        return _time_pieces(telemetry.Telemetry(folder, 0, 80, 640, 5))


def _time_pieces(table):
    probe = telemetry.ProcessProbe()
    n = 32
    batch = {"actor_id": np.arange(n) % 3, "actor_host": np.tile(telemetry.encode_host("host-a"), (n, 1)),
             "actor_cpu": np.ones(n, np.float32), "actor_rss_mb": np.ones(n, np.float32),
             "actor_timing": np.ones((n, 3), np.float32)}
    timings, frames = Timings("wait", "learn", "publish"), [0]

    def write():
        frames[0] += 1000
        table.write(time.time(), frames[0], frames[0] // 1000, timings, 0.5)
    costs = {"probe": per_call_us(probe.sample, 2000), "add_batch": per_call_us(lambda: table.add_batch(batch), 2000),
             "write": per_call_us(write, 50)}
    table.close()
    return costs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60, help="measuring time per run")
    p.add_argument("--repeats", type=int, default=3, help="pairs of runs")
    p.add_argument("--base_port", type=int, default=19400)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    a = p.parse_args()
    actors, envs, extra = harness.OURS
    fps = {"on": [], "off": []}
    for rep in range(a.repeats):
        order = ("on", "off") if rep % 2 == 0 else ("off", "on")
        for variant in order:
            flags = list(extra) + ([] if variant == "on" else ["--notelemetry"])
            got, _ = harness.impala_fps(LEVEL, "SimpleConvNetAgent", actors, envs, a.seconds, a.base_port, flags)
            fps[variant].append(got)
            print("repeat %d, telemetry %s: %.0f frames/s" % (rep + 1, variant, got), flush=True)
    costs = component_costs()
    on, off = statistics.median(fps["on"]), statistics.median(fps["off"])
    pairs = [x / y for x, y in zip(fps["on"], fps["off"])]
    out, machine = harness.results_dir(a.out)
    lines = ["# What the telemetry costs: Pong, %d actors x %d envs (the throughput suite's configuration)" % (actors, envs),
             "", "| telemetry | frames/s per repeat | median |", "|---|---|---|",
             "| on (`--telemetry`, the default) | %s | %.0f |" % (", ".join("%.0f" % x for x in fps["on"]), on),
             "| off (`--notelemetry`) | %s | %.0f |" % (", ".join("%.0f" % x for x in fps["off"]), off), "",
             "On / off: median %.3f (%+.1f %%); per repeat %s." % (on / off, 100 * (on / off - 1),
                                                                ", ".join("%.3f" % r for r in pairs)),
             "Runs alternate (on first in odd repeats); %g s measured after 20 s of warm-up each." % a.seconds,
             "", "Each piece alone, per call: the actor's probe %.0f us (once per unroll of %d envs x 20 steps), the "
             "learner's add_batch %.0f us (once per batch), its table %.1f ms (TensorBoard, CSV, JSON; once per log "
             "period, 5 s here). At the median rate with telemetry (%.0f frames/s: %.1f batches/s of 32 x 20 x 4 "
             "frames) the learner's share is %.2f %% of its time; the actors' %.3f %%."
             % (costs["probe"], envs, costs["add_batch"], costs["write"] / 1e3, on, on / 2560,
                100 * (costs["add_batch"] * on / 2560 + costs["write"] / 5) / 1e6,
                100 * costs["probe"] * (on / actors / (envs * 20 * 4)) / 1e6)]
    harness.write_table(out, "telemetry_cost", lines, machine)


if __name__ == "__main__":
    main()
