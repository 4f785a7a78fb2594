"""Does a WALL-E PPO run stopped with Ctrl-C and resumed learn as one that was never stopped?

    .venv/bin/python bench/ppo_resume.py                       # zoo variant, seeds 1 2 3, 300k steps
    .venv/bin/python bench/ppo_resume.py --seeds 1 2 3 4 --budget 300000 --stop_at 100000

For each seed, interleaved: one uninterrupted HalfCheetah-v5 run, then one that gets SIGINT (what
Ctrl-C sends to the terminal's process group) once it has collected --stop_at env steps, and is
continued with --mode=train_w_load to the same budget. The question is whether the resumed curves
stay inside the uninterrupted runs' seed-to-seed spread: at every --grid steps, each resumed run's
score (return_last10) against the [min, max] of the uninterrupted seeds there.

Before the stop a resumed run is its seed's uninterrupted run step for step (a run is deterministic
for a seed); after it the samplers start new episodes with moved seeds, so the two part ways the way
two seeds do. Writes <out>/ppo_resume.md, .csv (every run's curve) and .png.
"""
import argparse
import csv
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from bench import common
from bench import ppo_halfcheetah as hc
from bench import run as bench_run
from tools import plotcurve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(a, seed, logdir):
    return [sys.executable, os.path.join(ROOT, "ppo_parallel_main.py"), "HalfCheetah-v5", "-it", "1000000",
            "--max_steps", str(a.budget), "-n", str(hc.VARIANT_SAMPLERS.get(a.variant, 1)), "--seed", str(seed),
            "--logdir", logdir, "--quiet", "--eval_episodes", str(a.eval_episodes)] + hc.VARIANTS[a.variant]


def steps_so_far(logdir):
    rows = hc.read_rows(logdir)
    return int(rows[-1]["steps"]) if rows else 0


def run_stopped_and_resumed(a, seed, logdir):
    """SIGINT at --stop_at steps, then train_w_load to the budget: (exit codes, steps at the stop,
    seconds from the signal to the exit)."""
    proc = subprocess.Popen(command(a, seed, logdir), cwd=ROOT, start_new_session=True)
    while proc.poll() is None and steps_so_far(logdir) < a.stop_at:
        time.sleep(0.5)
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    first = proc.wait(timeout=120)
    stopped_s, at = time.time() - t0, steps_so_far(logdir)
    second = subprocess.call([sys.executable, os.path.join(ROOT, "ppo_parallel_main.py"), "--mode=train_w_load",
                              "--load_model_url=" + logdir], cwd=ROOT)
    return (first, second), at, stopped_s


def score_at(rows, steps):
    """The score of the last row at or before `steps` (NaN before the first episode's end)."""
    scored = [r for r in rows if r[hc.SCORE] != "" and int(r["steps"]) <= steps]
    return float(scored[-1][hc.SCORE]) if scored else float("nan")


def compare(a, plain, resumed):
    """Markdown lines: per resumed run, at each grid point, whether its score lies in the band."""
    grid = list(range(a.grid, a.budget + 1, a.grid))
    band = np.array([[score_at(rows, s) for s in grid] for rows in plain.values()])
    lo, hi = band.min(axis=0), band.max(axis=0)
    lines = ["| steps | " + " | ".join(str(s) for s in grid) + " |", "|---|" + "---|" * len(grid),
             "| uninterrupted min .. max | " + " | ".join(f"{x:.0f} .. {y:.0f}" for x, y in zip(lo, hi)) + " |"]
    inside = 0
    for seed, rows in resumed.items():
        cells = []
        for k, s in enumerate(grid):
            x = score_at(rows, s)
            ok = lo[k] <= x <= hi[k]
            inside += ok
            cells.append(f"{x:.0f}" if ok else f"**{x:.0f}**")
        lines.append(f"| resumed seed {seed} | " + " | ".join(cells) + " |")
    for kind, runs in (("uninterrupted", plain), ("resumed", resumed)):
        means = [np.mean([score_at(rows, s) for rows in runs.values()]) for s in grid]
        lines.append(f"| {kind}, mean over seeds | " + " | ".join(f"{x:.0f}" for x in means) + " |")
    lines += ["", "Mean score over each run's rows after the stop (the area under its curve there): "
              + "; ".join(f"{kind} " + ", ".join(f"seed {seed} {after_stop(rows, a.stop_at):.0f}"
                                                  for seed, rows in runs.items())
                          for kind, runs in (("uninterrupted", plain), ("resumed", resumed)))]
    total = len(grid) * len(resumed)
    return lines, inside, total


def after_stop(rows, stop_at):
    return float(np.mean([float(r[hc.SCORE]) for r in rows if r[hc.SCORE] != "" and int(r["steps"]) > stop_at]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="zoo", choices=sorted(hc.VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--budget", type=int, default=300_000, help="env steps per run")
    p.add_argument("--stop_at", type=int, default=100_000, help="env steps before the SIGINT")
    p.add_argument("--grid", type=int, default=50_000, help="steps between the compared points")
    p.add_argument("--eval_episodes", type=int, default=10)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    a = p.parse_args()
    if not 0 < a.stop_at < a.budget or len(a.seeds) < 2:
        p.error("need 0 < --stop_at < --budget and at least 2 --seeds (the spread)")
    out, machine = bench_run.results_dir(a.out)
    runs_dir = os.path.join(out, "ppo_resume_runs")
    shutil.rmtree(runs_dir, ignore_errors=True)
    plain, resumed, summary = {}, {}, []
    for seed in a.seeds:  # interleaved: a slow spell of the machine hits both kinds alike
        logdir = os.path.join(runs_dir, f"plain_s{seed}")
        t0 = time.time()
        code = subprocess.call(command(a, seed, logdir), cwd=ROOT)
        plain[seed] = hc.read_rows(logdir)
        summary.append(("uninterrupted", seed, (code,), None, None, plain[seed], hc.read_eval(logdir), time.time() - t0))
        logdir = os.path.join(runs_dir, f"resumed_s{seed}")
        t0 = time.time()
        codes, at, stopped_s = run_stopped_and_resumed(a, seed, logdir)
        resumed[seed] = hc.read_rows(logdir)
        summary.append(("stopped + resumed", seed, codes, at, stopped_s, resumed[seed], hc.read_eval(logdir),
                        time.time() - t0))
    write_report(a, out, machine, plain, resumed, summary)
    plot(a, out, runs_dir)
    return 0


def write_report(a, out, machine, plain, resumed, summary):
    with open(os.path.join(out, "ppo_resume.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seed", "iteration", "steps", "time", hc.SCORE])
        for kind, runs in (("uninterrupted", plain), ("resumed", resumed)):
            for seed, rows in runs.items():
                w.writerows([kind, seed, r["iteration"], r["steps"], r["time"], r[hc.SCORE]] for r in rows)
    table, inside, total = compare(a, plain, resumed)
    lines = [f"# WALL-E PPO ({a.variant}) on HalfCheetah-v5: stopped with SIGINT at {a.stop_at} steps and "
             f"resumed, vs uninterrupted, {a.budget} steps\n",
             "| run | seed | exit codes | stopped at (steps) | signal to exit (s) | steps | final | eval | wall (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, seed, codes, at, stopped_s, rows, ev, wall in summary:
        lines.append(f"| {kind} | {seed} | {', '.join(map(str, codes))} | {at if at is not None else '-'} | "
                     f"{'-' if stopped_s is None else f'{stopped_s:.1f}'} | {rows[-1]['steps'] if rows else 0} | "
                     f"{score_at(rows, a.budget):.0f} | {ev:.0f} | {wall:.0f} |")
    lines += ["", f"{hc.SCORE} every {a.grid} steps; **bold**: outside the uninterrupted seeds' range there.", ""]
    lines += table + ["", f"Inside the range: {inside} of {total} points."]
    bench_run.write_table(out, "ppo_resume", lines, machine)


def plot(a, out, runs_dir):
    fig, axes = common.subplots(1, 1, figsize=(7, 4.5))
    ax = axes
    for i, kind in enumerate(("plain", "resumed")):
        paths = [os.path.join(runs_dir, f"{kind}_s{s}", "progress.csv") for s in a.seeds]
        plotcurve.plot_runs(ax, [x for x in paths if os.path.exists(x)], "steps", hc.SCORE,
                            "uninterrupted" if kind == "plain" else "stopped + resumed", color=f"C{i}")
    ax.axvline(a.stop_at, color="gray", ls="--", alpha=0.6, label=f"SIGINT at {a.stop_at} steps")
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"{hc.SCORE} (mean of last 10 episodes)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.suptitle(f"HalfCheetah-v5, WALL-E PPO ({a.variant}): resume vs no stop, seeds {a.seeds}")
    common.save_figure(fig, os.path.join(out, "ppo_resume.png"))


if __name__ == "__main__":
    sys.exit(main())
