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

from bench import run as harness

LEVEL = "PongNoFrameskip-v4"


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
    on, off = statistics.median(fps["on"]), statistics.median(fps["off"])
    pairs = [x / y for x, y in zip(fps["on"], fps["off"])]
    out, machine = harness.results_dir(a.out)
    lines = ["# What the telemetry costs: Pong, %d actors x %d envs (the throughput suite's configuration)" % (actors, envs),
             "", "| telemetry | frames/s per repeat | median |", "|---|---|---|",
             "| on (`--telemetry`, the default) | %s | %.0f |" % (", ".join("%.0f" % x for x in fps["on"]), on),
             "| off (`--notelemetry`) | %s | %.0f |" % (", ".join("%.0f" % x for x in fps["off"]), off), "",
             "On / off: median %.3f (%+.1f %%); per repeat %s." % (on / off, 100 * (on / off - 1),
                                                                ", ".join("%.3f" % r for r in pairs)),
             "Runs alternate (on first in odd repeats); %g s measured after 20 s of warm-up each." % a.seconds]
    harness.write_table(out, "telemetry_cost", lines, machine)


if __name__ == "__main__":
    main()
