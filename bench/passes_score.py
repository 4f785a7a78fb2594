"""Time to Pong +18 with a recipe's 16 gradient steps per batch taken as 4 passes x 4 minibatches
(the recipes' setting) or as 1 pass x 16 smaller minibatches, seeds interleaved on the same cores.

  .venv/bin/python bench/passes_score.py --recipe atari --seeds 1 2 3
  .venv/bin/python bench/passes_score.py --recipe pong --seeds 2 3

One pass trains each sample once instead of four times, so the learner's update takes about half
the time (bench/kernels.py passes); whether the score per frame holds is what this measures. Each
run is bench/pong_impala.py stopping at a mean of +18 over the last 20 games (or at --frames); for
each seed the variants run one after the other, nothing else on the cores. The table gives each
run's time and frames to +18 and frames/s, and per variant the medians and their ratios to the
recipe's. Writes bench/results/<machine>/passes_score_<recipe>.md and each run's pong_impala files
(passes_score_<recipe>_<variant>_seed<N>.*) beside it; the table holds every saved run of the
seeds asked for, so they can run in separate invocations (--table_only runs nothing).
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench import common  # noqa: E402
from bench.kernels import LEVERS  # noqa: E402
from bench.run import PONG_SHAPE, machine_dir, machine_line, write_machine  # noqa: E402
from local_cluster import obey_ctrl_c  # noqa: E402

RECIPES = {"pong": "configs/pong.flags", "atari": "configs/atari.flags"}
VARIANTS = {"4x4": [], "1x16": LEVERS["passes"][1][2]}  # 4 x 4: the recipes' own; 1 x 16 as kernels.py times it


def tag_of(recipe, variant, seed):
    return "passes_score_%s_%s_seed%d" % (recipe, variant, seed)


def run_one(a, out, variant, seed):
    """One pong_impala run, its report (tag_of's .md, .json, .csv, .png) written in `out`."""
    tag = tag_of(a.recipe, variant, seed)
    cmd = [sys.executable, os.path.join(HERE, "pong_impala.py"), "--frames", str(a.frames), "--seed", str(seed),
           "--stop_at_return", "18"] + PONG_SHAPE + ["--ceiling_s", str(a.ceiling_s), "--base_port", str(a.base_port),
           "--out", out, "--tag", tag, "--extra=--flagfile=" + os.path.join(ROOT, RECIPES[a.recipe])]
    cmd += ["--extra=" + f for f in VARIANTS[variant]]
    print("[passes_score] %s seed %d: %s" % (variant, seed, " ".join(cmd[1:])), flush=True)
    child = subprocess.Popen(cmd, cwd=ROOT)
    try:
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGINT to this process alone: the run reports and stops too
        child.send_signal(signal.SIGINT)
        child.wait()
        raise
    if code != 0:
        print("[passes_score] %s seed %d failed" % (variant, seed), flush=True)


def table(a, runs):
    """The Markdown lines: a row per run, then each variant's medians against the recipe's."""
    lines = ["# Pong to +18, %s's 16 gradient steps per batch as 4 x 4 or 1 x 16, %d cores, %s" % (
        RECIPES[a.recipe], os.cpu_count(), common.cpu_model()), "",
        "| variant | seed | time to +18 (training s) | frames to +18 | frames/s, median | env ceiling | bottleneck |",
        "|---|---|---|---|---|---|---|"]
    for (variant, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], list(VARIANTS).index(kv[0][0]))):
        lines.append("| %s | %d | %s | %s | %.0f | %.0f | %s |" % (
            variant, seed, "%.0f" % r["time_to_threshold_s"] if r["reached"] else "not reached",
            "%.2fM" % (r["frames_to_threshold"] / 1e6) if r["reached"] else "(%.2fM run)" % (r["frames"] / 1e6),
            r["median_fps"], r["ceiling_fps"], r["bottleneck"]))
    lines += ["", "| variant | reached | median time to +18 | median frames to +18 | median frames/s | "
              "time / recipe's | frames/s / recipe's |", "|---|---|---|---|---|---|---|"]
    medians = {v: variant_medians([r for (w, _), r in runs.items() if w == v]) for v in VARIANTS}
    base = medians["4x4"]
    for v, m in medians.items():
        if m is None:
            continue
        ratio = (lambda k: "%.2f" % (m[k] / base[k]) if base and base[k] and m[k] != float("inf") else "-")
        lines.append("| %s | %d of %d | %s | %s | %.0f | %s | %s |" % (
            v, m["reached"], m["runs"], "%.0f s" % m["time"] if m["time"] != float("inf") else "not reached",
            "%.2fM" % (m["frames"] / 1e6) if m["frames"] != float("inf") else "-", m["fps"],
            ratio("time"), ratio("fps")))
    return lines + ["", "A seed that did not reach +18 counts as slower than any that did.", "",
                    "Command: `.venv/bin/python bench/passes_score.py --recipe %s --seeds %s --frames %d`" % (
                        a.recipe, " ".join(map(str, a.seeds)), a.frames)]


def variant_medians(rs):
    """Median time, frames and frames/s of a variant's runs (a run short of +18 counts as infinite)."""
    if not rs:
        return None
    inf = float("inf")
    return {"runs": len(rs), "reached": sum(r["reached"] for r in rs),
            "time": statistics.median(r["time_to_threshold_s"] if r["reached"] else inf for r in rs),
            "frames": statistics.median(r["frames_to_threshold"] if r["reached"] else inf for r in rs),
            "fps": statistics.median(r["median_fps"] for r in rs)}


def main():
    obey_ctrl_c()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="atari")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--frames", type=int, default=5_000_000, help="each run's budget if it does not reach +18")
    p.add_argument("--ceiling_s", type=float, default=5.0, help="pong_impala.py's env-ceiling measurement, seconds")
    p.add_argument("--base_port", type=int, default=18900)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    p.add_argument("--table_only", action="store_true", help="run nothing: the table of the seeds' saved runs")
    a = p.parse_args()
    out = a.out or machine_dir()
    os.makedirs(out, exist_ok=True)
    try:
        for seed in a.seeds if not a.table_only else ():
            for variant in a.variants:
                run_one(a, out, variant, seed)
    except KeyboardInterrupt:
        print("[passes_score] stopped by Ctrl-C; the table holds the runs saved so far", flush=True)
    # every saved run of these seeds, so seeds can run in separate invocations (or be cut short)
    runs = {(v, seed): common.read_json(os.path.join(out, tag_of(a.recipe, v, seed) + ".json"))
            for seed in a.seeds for v in VARIANTS}
    runs = {k: r for k, r in runs.items() if r is not None and not r.get("interrupted")}  # cut short: no figure
    lines = table(a, runs) + ["", machine_line(write_machine(out))]
    path = os.path.join(out, "passes_score_%s.md" % a.recipe)
    common.write_lines(path, lines)
    print("\n".join(lines) + "\n\nwrote " + path)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
