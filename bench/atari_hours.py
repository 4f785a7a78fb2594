"""Score per hour of training: long Atari runs of one game that differ in one lever, compared at
equal training time and at equal frames, to tell which lever gets the best score per hour (a
short run's score cannot: bench/atari_levers.py measures speed and only an early sign of score).

    .venv/bin/python bench/atari_hours.py --game Breakout \
        --run "recipe=bench/results/<machine>/atari_Breakout_seed1_metrics.csv" \
        --run "sgd2=bench/results/<machine>/atari_sgd2/atari_Breakout_seed1_metrics.csv"

Each --run is NAME=PATH, PATH a run folder (its metrics.csv) or a copy of one's metrics.csv (the
Atari suite keeps one beside its table). The runs should come from the same machine kind with
nothing else on the cores, since time is what is compared: the script cannot check that, so the
table says which files it read. Training time is the learner's, with the stops of resumed runs
left out (tools/plotcurve.stitched). A score is the mean of the last 100 whole games, read only
where the learner had 100 games behind it since its (re)start, since a resumed run's first
means are over a handful of games. Writes <out>/<--table>_<game>.md and .png.
"""
import argparse
import os
import sys

import numpy as np

from bench import atari
from bench import common
from bench import run as bench_run

WINDOW = 100  # games in metrics.csv's mean_return_100


def read_run(path):
    """(frames, training seconds, score) of a run folder or metrics CSV; score is NaN where fewer
    than WINDOW games had ended since the learner's (re)start."""
    csv_path = os.path.join(path, "metrics.csv") if os.path.isdir(path) else path
    rows = common.read_csv(csv_path)
    if not rows:
        raise SystemExit("--run %s: no metrics rows in %s" % (path, csv_path))
    missing = {"time_s", "frames", "episodes", "mean_return_100"} - set(rows[0])
    if missing:
        raise SystemExit("--run %s: %s lacks the column(s) %s; is it a learner's metrics.csv?"
                         % (path, csv_path, ", ".join(sorted(missing))))
    frames, times, score = atari.curve(rows)
    # episodes counts from each (re)start of the learner, as time_s does.
    episodes = np.array([float(r["episodes"]) for r in rows])
    score[episodes < WINDOW] = np.nan
    return frames, times, score


def at(xs, score, x):
    """The last full-window score at or before x, or NaN where the run had not reached x."""
    if xs[-1] < x:
        return float("nan")
    ok = np.flatnonzero((xs <= x) & np.isfinite(score))
    return float(score[ok[-1]]) if len(ok) else float("nan")


def first_reach(xs, score, target):
    """The first x at which the score reached target, or NaN."""
    hit = np.flatnonzero(np.isfinite(score) & (score >= target))
    return float(xs[hit[0]]) if len(hit) else float("nan")


def grid(top, step):
    return [step * k for k in range(1, int(top // step) + 1)]


def cell(x, fmt="{:,.0f}"):
    return fmt.format(x) if np.isfinite(x) else "-"


def header(first, names):
    """A table's two header lines: `first`, then one column per run."""
    return ["| %s | %s |" % (first, " | ".join(names)), "|---" * (len(names) + 1) + "|"]


def runs_table(runs):
    lines = ["| run | file | frames | training minutes | frames/s | score at its end |", "|---" * 6 + "|"]
    for name, (path, (f, t, s)) in runs.items():
        lines.append("| %s | `%s` | %s | %.0f | %s | %s |" % (
            name, path, cell(f[-1]), t[-1] / 60, cell(f[-1] / t[-1]), cell(at(f, s, f[-1]))))
    return lines


def at_minutes(runs, step):
    """Score at every `step` training minutes, with the frames each run had reached then."""
    curves = [curve for _, curve in runs.values()]
    lines = ["", "Score at equal training time (frames reached in brackets):", ""] + header("minutes", list(runs))
    for m in grid(max(t[-1] for _, t, _ in curves) / 60, step):
        cells = []
        for f, t, s in curves:
            i = np.searchsorted(t, m * 60, side="right") - 1
            cells.append("%s (%sM)" % (cell(at(t, s, m * 60)), cell(f[i] / 1e6, "{:.1f}")) if t[-1] >= m * 60
                         else "-")
        lines.append("| %d | %s |" % (m, " | ".join(cells)))
    return lines


def at_frames(runs, step):
    """Score at every `step` frames, with the training minutes each run took to reach them."""
    curves = [curve for _, curve in runs.values()]
    lines = ["", "Score at equal frames (training minutes in brackets):", ""] + header("frames", list(runs))
    for x in grid(max(f[-1] for f, _, _ in curves), step):
        cells = []
        for f, t, s in curves:
            i = np.searchsorted(f, x, side="left")
            cells.append("%s (%.0f min)" % (cell(at(f, s, x)), t[i] / 60) if f[-1] >= x else "-")
        lines.append("| %sM | %s |" % (cell(x / 1e6, "{:g}"), " | ".join(cells)))
    return lines


def to_shares(runs):
    """Training minutes until each run's score first reached shares of the best final score."""
    curves = [curve for _, curve in runs.values()]
    best = max(at(f, s, f[-1]) for f, _, s in curves)
    lines = ["", "Training minutes until the score first reached a share of the best final score (%s):"
             % cell(best), ""] + header("share", list(runs))
    for share in (0.5, 0.75, 0.9):
        lines.append("| %d %% (%s) | %s |" % (share * 100, cell(share * best), " | ".join(
            cell(first_reach(t, s, share * best) / 60) for _, t, s in curves)))
    return lines


def tables(runs, minutes_step, frames_step):
    """The Markdown lines: the runs, score at equal minutes, score and minutes at equal frames,
    and minutes to reach shares of the best final score."""
    return runs_table(runs) + at_minutes(runs, minutes_step) + at_frames(runs, frames_step) + to_shares(runs)


def plot(game, runs, path):
    fig, (by_time, by_frames) = common.subplots(1, 2, figsize=(11, 4))
    for name, (_, (f, t, s)) in runs.items():
        by_time.plot(t / 60, s, label=name)
        by_frames.plot(f / 1e6, s, label=name)
    for ax, xlabel in ((by_time, "training minutes"), (by_frames, "frames (M)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean of the last 100 games")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(game)
    common.save_figure(fig, path)


def parse_run(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path or any(c.isspace() for c in name):
        raise argparse.ArgumentTypeError("%r: give NAME=PATH, NAME without spaces, PATH a run folder or a "
                                         "metrics CSV" % text)
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError("%r: %s does not exist" % (text, path))
    return name, path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", required=True, help="the game's short name, for the titles and file names")
    p.add_argument("--run", type=parse_run, action="append", required=True,
                   help="NAME=PATH, twice or more; NAME without spaces, as the table's Command line is not quoted")
    p.add_argument("--minutes_step", type=float, default=30)
    p.add_argument("--frames_step", type=float, default=10e6)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    p.add_argument("--table", default="atari_hours")
    a = p.parse_args(argv)
    if len(a.run) < 2 or len({name for name, _ in a.run}) != len(a.run):
        p.error("--run: give two or more runs, each under its own NAME")
    runs = {name: (path, read_run(path)) for name, path in a.run}
    out, machine = bench_run.results_dir(a.out)
    stem = "%s_%s" % (a.table, a.game)
    lines = ["# %s: %s, by training time and by frames" % (a.game, " against ".join(runs)), ""]
    lines += tables(runs, a.minutes_step, a.frames_step)
    lines += ["", "Curves: [%s.png](%s.png)" % (stem, stem)]
    plot(a.game, runs, os.path.join(out, stem + ".png"))
    bench_run.write_table(out, stem, lines, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
