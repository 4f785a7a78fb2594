"""Frames/s against the number of actor processes on one machine with many cores: the two env
ceilings of all its cores, then our IMPALA end to end (1 learner on the CPU, native env backend)
for each actor count, with where the CPU went in each run. For a 16-core host, or
any host bigger than the 2-core development one.

  .venv/bin/python bench/many_cores.py --actor_counts 1 2 4 8 14 --seconds 30
  .venv/bin/python bench/many_cores.py --flagfile configs/atari.flags --level BreakoutNoFrameskip-v4 \
      --actor_counts 4 8 14

Without --flagfile it measures Pong's throughput settings (one pass over each batch); with one, that
recipe's own learning settings (configs/atari.flags: 4 passes x 4 minibatches), what a user of the
recipe waits for. Writes <out>/many_cores.md, or many_cores_<recipe>.md with --flagfile (default
out: bench/results/<machine>/), one row per actor count as it finishes, so a run cut short keeps
what it measured.
"""
import argparse
import os
import sys
import time

from bench import ceiling
from bench import common
from bench import cpu_split
from bench import run as harness

THROUGHPUT_SETTINGS = "1 learner (CPU; batch 32 x unroll 20, one pass)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--flagfile", default=None,
                   help="a recipe (e.g. configs/atari.flags) whose learning settings replace the throughput ones")
    p.add_argument("--actor_counts", type=int, nargs="+", default=[1, 2, 4, 8, 14])
    p.add_argument("--envs_per_actor", type=int, default=32)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--extra", action="append", default=["--compute_dtype=auto"],
                   help="one more experiment.py flag (repeatable); the torso's precision timed per process by default")
    p.add_argument("--base_port", type=int, default=24500)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.flagfile and not os.path.isfile(a.flagfile):
        p.error("--flagfile=%s: no such file (a recipe such as configs/atari.flags)" % a.flagfile)
    out, info = harness.results_dir(a.out)
    cores, game = os.cpu_count(), a.level.replace("NoFrameskip-v4", "")
    recipe = os.path.splitext(os.path.basename(a.flagfile))[0] if a.flagfile else None
    # The recipe goes first so that --extra still overrides it; progress every 5 s, not the recipe's 30 s,
    # so that the measured window has rows to take the median of.
    extra = (["--flagfile=" + os.path.abspath(a.flagfile), "--log_every_s=5"] if a.flagfile else []) + a.extra
    settings = ("1 learner (CPU) with %s's learning settings" % a.flagfile) if a.flagfile else THROUGHPUT_SETTINGS
    py = ceiling.python_fps(a.level, cores, 20)
    native = ceiling.native_fps(a.level, cores, 20, env_counts=(64, 128))
    limit = max(py, native)
    head = ["# Many cores: %s frames/s against actor processes, %d cores, %s%s" % (
                game, cores, info["cpu"], ", recipe " + recipe if recipe else ""), "",
            "84x84 frames, frame skip 4, %s + N actors x %d envs, %s; %.0f s measured after 20 s of warm-up, "
            "one run each, in the order given." % (settings, a.envs_per_actor, " ".join(a.extra), a.seconds), "",
            "Env ceilings of all %d cores: %d Python processes %.0f frames/s; ale-py's native vector env "
            "(%d threads, 64 or 128 envs) %.0f frames/s: the limit is %.0f." % (cores, cores, py, cores, native, limit),
            "", "| actors | frames/s | of the limit | learner waited for data | where the CPU went |",
            "|---|---|---|---|---|"]
    tail = ["", "Command: `%s`" % " ".join(["bench/many_cores.py"] + sys.argv[1:]), "", harness.machine_line(info),
            "Date: %s" % info["date"]]
    rows, path = [], os.path.join(out, "many_cores_%s.md" % recipe if recipe else "many_cores.md")
    for n in a.actor_counts:
        t0 = time.time()
        fps, tb = harness.impala_fps(a.level, "SimpleConvNetAgent", n, a.envs_per_actor, a.seconds, a.base_port,
                                     extra)
        waited = 100 * tb.get("learner_wait_s", 0) / max(tb.get("elapsed_s", 1), 1e-9)
        rows.append("| %d | %.0f | %.2f | %.0f %% | %s |" % (n, fps, fps / limit, waited,
                                                            cpu_split.report(tb.get("cpu", {}))))
        print("%s (%.0f s)" % (rows[-1], time.time() - t0), flush=True)
        common.write_lines(path, head + rows + tail)
    print("\n".join(head + rows + tail))
    return 0


if __name__ == "__main__":
    sys.exit(main())
