"""Learning curve from one or several PPO runs: mean over runs, min-max band.

    python tools/plotcurve.py -x steps -i results/ppo_HalfCheetah-v5_1700000000 -o fig.png
    python tools/plotcurve.py -x time -i 'results/ppo_HalfCheetah-v5_*' -y return_last10 -o fig.png

-i takes run folders (each with a progress.csv, as ppo.py writes), folders of
run folders, or glob patterns of either. Rows where y is empty (an iteration
in which no episode finished) are skipped. With several runs, each curve is
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

DEFAULT_Y = "return_mean"
GRID_POINTS = 200


class PlotError(ValueError):
    """Bad input: a missing run folder, an unknown column."""


def find_runs(patterns):
    """progress.csv paths for run folders / folders of runs / glob patterns."""
    paths = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) or [pattern]
        for m in matches:
            if os.path.isfile(m) and m.endswith(".csv"):
                paths.append(m)
            elif os.path.isfile(os.path.join(m, "progress.csv")):
                paths.append(os.path.join(m, "progress.csv"))
            elif os.path.isdir(m):
                paths += sorted(glob.glob(os.path.join(m, "*", "progress.csv")))
    if not paths:
        raise PlotError(f"no progress.csv found under {' '.join(patterns)!r} (give run folders, "
                        f"folders of runs, or glob patterns)")
    return sorted(set(paths))


def load_curve(path, x_name, y_name, smooth=1):
    """(x, y) float arrays from one progress.csv, rows with an empty x or y dropped."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for name, flag in ((x_name, "-x"), (y_name, "-y")):
            if name not in columns:
                raise PlotError(f"{path}: no column {name!r} (from {flag}); columns are: {', '.join(columns)}")
        rows = [(r[x_name], r[y_name]) for r in reader if r[x_name] != "" and r[y_name] != ""]
    if not rows:
        raise PlotError(f"{path}: no rows with both {x_name!r} and {y_name!r} set")
    x, y = np.array(rows, np.float64).T
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
    grid, mean, lo, hi = band(curves)
    line, = ax.plot(grid, mean, color=color, label=f"{label} ({len(curves)} run{'s' * (len(curves) > 1)})")
    if len(curves) > 1:
        ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.25, linewidth=0)
    return grid, mean


def add_common_arguments(parser):
    parser.add_argument("-x", "--x", default="steps", help="x column: steps, iteration, time, ...")
    parser.add_argument("-y", "--y", default=DEFAULT_Y, help=f"y column (default {DEFAULT_Y})")
    parser.add_argument("-i", "--input", nargs="+", required=True, help="run folders / globs")
    parser.add_argument("-o", "--output", default="fig.png", help="PNG file to write")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window over rows")
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--label", default="", help="legend label (default: the -i folder name)")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth must be >= 1, got {args.smooth}")
    try:
        paths = find_runs(args.input)
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
