"""Learning curves from any run folder: mean over runs, min-max band.

    python tools/plotcurve.py -x steps -i results/ppo_HalfCheetah-v5_1700000000 -o fig.png
    python tools/plotcurve.py -x time -i 'results/PongNoFrameskip-v4_*' -o pong.png
    python tools/plotcurve.py --source eval -x frames -i results/CartPole-v1_1700000000 -o eval.png

-i takes run folders, folders of run folders, glob patterns of either, or CSV files. A run
folder is read by the file it holds (--source auto): WALL-E's progress.csv, else the IMPALA
learner's metrics.csv; --source eval reads the IMPALA evaluator's eval.csv instead. -x and -y
take a column of that file or a name that means the same thing in every kind of file:

    name     progress.csv (PPO)   metrics.csv (IMPALA)   eval.csv (IMPALA evaluator)
    steps    steps                frames                 frames of policy_version (1)
    frames   steps                frames                 frames of policy_version (1)
    time     time                 time_s (2)             time, from its first row (3)
    return   return_mean          mean_return_20         mean_return

IMPALA counts env frames after action repeats (4 per agent step on Atari); PPO counts env steps.
time is wall-clock seconds since the PPO loop or the IMPALA learner's training loop started.
(1) eval.csv has no frame count; its policy_version is the learner's update count, which the
    metrics.csv beside it logs (updates) next to frames: the frames are interpolated between
    those rows, evaluations outside them are left out; without a metrics.csv: an error.
(2) A run resumed into its folder restarts time_s from 0; each restart is continued from the
    last time before it, so the pause is left out.
(3) eval.csv's time is a Unix time: seconds since the first evaluation, pauses included.
Empty and 'nan' cells (no episode had ended) are skipped. With several runs, each curve is
interpolated onto a common x grid over the range all runs cover.
"""
import argparse
import csv
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tools.digits import int_arg  # noqa: E402
from tools.runlog import is_missing  # noqa: E402

DEFAULT_Y = "return"
GRID_POINTS = 200
FILES = {"progress": "progress.csv", "metrics": "metrics.csv", "eval": "eval.csv"}
# generic name -> column, per kind of file (None: the file has no such figure)
ALIASES = {
    "progress": {"steps": "steps", "frames": "steps", "time": "time", "return": "return_mean"},
    "metrics": {"steps": "frames", "frames": "frames", "time": "time_s", "return": "mean_return_20"},
    "eval": {"steps": None, "frames": None, "time": "time", "return": "mean_return"},
}
RELATIVE_TIME = {"eval"}  # kinds whose time column is a Unix time: plotted from the first row


class PlotError(ValueError):
    """Bad input: a missing run folder, an unknown column."""


# Columns only one kind of file has: a copy kept under another name (the Atari suite keeps each
# run's metrics.csv as atari_<Game>_seed<N>_metrics.csv) is still read as what it is.
SIGNATURES = {"metrics": {"time_s", "frames", "updates"}, "eval": {"policy_version"}}


def kind_of(path, columns=()):
    """progress / metrics / eval, from the CSV file's name, else from its `columns`; any other CSV is
    read as progress."""
    name = os.path.basename(path)
    by_name = next((k for k, f in FILES.items() if f == name), None)
    by_columns = next((k for k, need in SIGNATURES.items() if need <= set(columns)), None)
    return by_name or by_columns or "progress"


def _run_file(folder, source):
    """The CSV a run folder is read by, or None when it holds none of the kind asked for."""
    names = [FILES[source]] if source != "auto" else [FILES["progress"], FILES["metrics"]]
    return next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)


def find_runs(patterns, source="auto"):
    """CSV paths for run folders / folders of runs / glob patterns / CSV files."""
    paths = []
    for pattern in patterns:
        for m in sorted(glob.glob(pattern)) or [pattern]:
            if os.path.isfile(m) and m.endswith(".csv"):
                paths.append(m)
            elif _run_file(m, source):
                paths.append(_run_file(m, source))
            elif os.path.isdir(m):
                paths += [f for f in (_run_file(d, source) for d in sorted(glob.glob(os.path.join(m, "*")))) if f]
    if not paths:
        wanted = FILES[source] if source != "auto" else "progress.csv or metrics.csv"
        raise PlotError(f"no {wanted} found under {' '.join(patterns)!r} (give run folders, folders of runs, "
                        f"glob patterns or CSV files; --source eval reads eval.csv)")
    return sorted(set(paths))


def column(path, kind, name, flag, columns):
    """The column `name` (a generic name or a raw column) stands for in this file."""
    if name in ALIASES[kind]:
        resolved = ALIASES[kind][name]
        if resolved is None:
            raise PlotError(f"{path}: {kind}.csv has no {name!r} ({flag}); use one of: "
                            f"{', '.join(n for n, c in ALIASES[kind].items() if c)}, or a column: {', '.join(columns)}")
        name = resolved
    if name not in columns:
        raise PlotError(f"{path}: no column {name!r} (from {flag}); columns are: {', '.join(columns)}")
    return name


def read_csv(path):
    """(header, rows as dicts) of one CSV file."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames or [], list(reader)


def numbers(path, rows, col):
    """One column as floats, NaN where the cell is missing (empty or 'nan', as runlog writes it)."""
    try:
        return np.array([np.nan if is_missing(r[col]) else float(r[col]) for r in rows], np.float64)
    except ValueError as e:
        raise PlotError(f"{path}: column {col!r} is not numeric ({e})") from None


def stitched(t):
    """time_s restarted at 0 by each resume into the same folder (metrics.csv is appended to):
    every restart continues from the last time before it, so the curve does not run backwards
    and the time the run was stopped is left out."""
    out, ok = t.copy(), np.isfinite(t)
    v = t[ok]
    restarts = np.r_[False, np.diff(v) < 0]
    out[ok] = v + np.cumsum(np.where(restarts, np.r_[0.0, v[:-1]], 0.0))
    return out


def score_at(frames, score, n):
    """The score of the last row at or before `n` frames that has one, as a published table's "at
    N frames" column reads a curve (a run's row just past N has trained on frames the table's runs
    had not); nan where the run did not reach `n`."""
    ok = np.isfinite(frames)
    before = ok & (frames <= n) & np.isfinite(score)
    reached = ok.any() and frames[ok].max() >= n
    return float(score[before][-1]) if reached and before.any() else float("nan")


def eval_frames(path, columns, rows):
    """The frames each eval.csv row's policy had trained on. The evaluator logs policy_version,
    which is the learner's update count; the learner's metrics.csv beside it logs that count
    (updates) next to frames, so the frames are interpolated between its rows. Evaluations
    outside the updates it logged are left out (NaN) rather than extrapolated."""
    metrics = os.path.join(os.path.dirname(path), FILES["metrics"])
    if not os.path.isfile(metrics):
        raise PlotError(f"{path}: eval.csv has no frame count, and there is no metrics.csv beside it to map its "
                        f"policy_version to frames; use -x time, -x policy_version or a column: {', '.join(columns)}")
    version = numbers(path, rows, column(path, "eval", "policy_version", "-x", columns))
    m_columns, m_rows = read_csv(metrics)
    updates, frames = (numbers(metrics, m_rows, column(metrics, "metrics", c, "-x", m_columns))
                       for c in ("updates", "frames"))
    ok = np.isfinite(updates) & np.isfinite(frames)
    if not ok.any():
        raise PlotError(f"{metrics}: no rows with both 'updates' and 'frames' set to map eval.csv's policy_version")
    # A resume from an earlier checkpoint logs some update counts twice, with the same frames
    # (both are restored together): sorting keeps np.interp's x increasing.
    order = np.argsort(updates[ok], kind="stable")
    u, f = updates[ok][order], frames[ok][order]
    inside = (version >= u[0]) & (version <= u[-1])
    return np.where(inside, np.interp(version, u, f), np.nan)


def x_values(path, kind, name, columns, rows):
    """The x of every row: the column `name` stands for, made comparable across runs."""
    if kind == "eval" and name in ("steps", "frames"):
        return eval_frames(path, columns, rows)
    col = column(path, kind, name, "-x", columns)
    x = numbers(path, rows, col)
    if kind in RELATIVE_TIME and col == "time":
        x = x - x[np.isfinite(x)][0] if np.isfinite(x).any() else x
    elif kind == "metrics" and name == "time":
        x = stitched(x)
    return x


def load_curve(path, x_name, y_name, smooth=1):
    """(x, y) float arrays from one run's CSV, rows with a missing x or y dropped."""
    columns, rows = read_csv(path)
    kind = kind_of(path, columns)
    y_col = column(path, kind, y_name, "-y", columns)
    x, y = x_values(path, kind, x_name, columns, rows), numbers(path, rows, y_col)
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.any():
        raise PlotError(f"{path}: no rows with both {x_name!r} and {y_col!r} set")
    x, y = x[keep], y[keep]
    if smooth > 1 and len(y) >= smooth:  # trailing moving average
        y = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
        x = x[smooth - 1:]
    return x, y


def band(curves):
    """Mean, min and max over runs on a common grid: (grid, mean, lo, hi)."""
    if len(curves) == 1:
        x, y = curves[0]
        return x, y, y, y
    start, stop = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    if start >= stop:
        raise PlotError("the runs' x ranges do not overlap; plot them separately")
    grid = np.linspace(start, stop, GRID_POINTS)
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def plot_runs(ax, paths, x_name, y_name, label, color=None, smooth=1):
    curves = [load_curve(p, x_name, y_name, smooth) for p in paths]
    if len(curves) > 1:  # np.interp needs an increasing x, and would silently misread one that is not
        for path, (x, _) in zip(paths, curves):
            if np.any(np.diff(x) < 0):
                raise PlotError(f"{path}: {x_name!r} goes back (a run resumed from an earlier checkpoint?), so "
                                f"it cannot be averaged with other runs on a common x; plot it alone")
    grid, mean, lo, hi = band(curves)
    line, = ax.plot(grid, mean, color=color, label=f"{label} ({len(curves)} run{'s' * (len(curves) > 1)})")
    if len(curves) > 1:
        ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.25, linewidth=0)
    return grid, mean


def add_common_arguments(parser):
    parser.add_argument("-x", "--x", default="steps",
                        help="x: frames or steps (IMPALA: env frames, counted after action repeats; PPO: env "
                             "steps; eval.csv: via the metrics.csv beside it), time (wall-clock seconds since "
                             "the training loop started; eval.csv: since its first evaluation), or a column "
                             "(default steps)")
    parser.add_argument("-y", "--y", default=DEFAULT_Y,
                        help=f"y: return (progress.csv return_mean, metrics.csv mean_return_20, eval.csv "
                             f"mean_return) or a column (default {DEFAULT_Y})")
    parser.add_argument("-i", "--input", nargs="+", required=True, help="run folders / globs / CSV files")
    parser.add_argument("--source", choices=("auto",) + tuple(FILES), default="auto",
                        help="which file of a run folder: auto (progress.csv, else metrics.csv), or one kind")
    parser.add_argument("-o", "--output", default="fig.png", help="PNG file to write")
    parser.add_argument("--smooth", type=int_arg, default=1, help="moving-average window over rows")
    parser.add_argument("--title", default="")


def finish(fig, ax, args):
    ax.set_xlabel(args.x)
    ax.set_ylabel(args.y)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    if args.title:
        ax.set_title(args.title)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    plt.close(fig)
    print(f"wrote {args.output}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--label", default="", help="legend label (default: the -i folder name)")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth must be >= 1, got {args.smooth}")
    try:
        paths = find_runs(args.input, args.source)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        label = args.label or os.path.basename(os.path.dirname(os.path.abspath(paths[0])))
        plot_runs(ax, paths, args.x, args.y, label, smooth=args.smooth)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finish(fig, ax, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
