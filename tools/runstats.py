"""The logged figures of runs side by side, as a Markdown table: the score each run had reached at
some frame counts, and the median of its diagnostics over a window of frames. It answers "what do
the logged figures say about why this run fell behind that one" without a notebook.

    python tools/runstats.py -i 'bench/results/*/atari_SpaceInvaders_seed*_metrics.csv'
    python tools/runstats.py -i results/run_a results/run_b --at 3M 5M 10M --window 1M: --window 5M:10M
    python tools/runstats.py -i 'results/Pong*' --columns entropy policy_lag -o pong_stats.md

-i takes what tools/plotcurve.py takes (run folders, folders of runs, glob patterns, CSV files).
The score at N frames is the -y column of the last row at or before N, as the Atari suite reads
its milestones, and "-" where the run did not reach N. A diagnostic column a run did not log
(an older run, another kind of trainer) is "-" in its row; one no run logged is an error.
"""
import argparse
import os
import re
import sys

import numpy as np

from tools import plotcurve
from tools.digits import odd_char

DEFAULT_COLUMNS = ("entropy", "grad_norm", "policy_lag", "mean_rho", "baseline_loss")
DEFAULT_AT = ("10M", "20M", "40M")
DEFAULT_WINDOW = "1M:"  # the first frames are the normalisers' and the optimiser's warm-up
SCORE_COLUMNS = ("mean_return_100", "return")  # the first one a file has, unless -y names one


def frame_count(text, flag):
    """'10M' / '2.5M' / '600K' / '40000000' -> frames; a clear error naming the flag otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text, re.ASCII)  # else \d takes '٣' too
    if not m:
        raise plotcurve.PlotError(f"{flag} {text!r}: not a frame count (write e.g. 10M, 600K or 40000000 in "
                                  f"ASCII digits){odd_char(text)}")
    return int(round(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6}[m.group(2).lower()]))


def window(text):
    """'START:END' (either side may be empty: from the first row / to the last) -> (start, end)."""
    if text.count(":") != 1:
        raise plotcurve.PlotError(f"--window {text!r}: write START:END in frames, e.g. 1M: or 5M:10M")
    lo, hi = text.split(":")
    start = frame_count(lo, "--window") if lo.strip() else 0
    end = frame_count(hi, "--window") if hi.strip() else float("inf")
    if end <= start:
        raise plotcurve.PlotError(f"--window {text!r}: its end is not after its start")
    return start, end


def human(frames):
    return "%.4gM" % (frames / 1e6) if frames >= 1e6 else "%.4gK" % (frames / 1e3)


def window_name(w):
    start, end = w
    return "%s-%s" % (human(start), "end" if end == float("inf") else human(end))


def run_stats(path, y_name, at, windows, columns):
    """One run's row: frames reached, score at each of `at`, median of each column per window
    (None where the run has no such column or no row in the window)."""
    header, rows = plotcurve.read_csv(path)
    kind = plotcurve.kind_of(path, header)
    frames = plotcurve.x_values(path, kind, "frames", header, rows)
    y_col = y_name or next((c for c in SCORE_COLUMNS if c in header), None) or \
        plotcurve.column(path, kind, "return", "-y", header)
    score = plotcurve.numbers(path, rows, plotcurve.column(path, kind, y_col, "-y", header))
    ok = np.isfinite(frames)
    reached = float(frames[ok].max()) if ok.any() else float("nan")
    medians = {}
    for col in columns:
        values = plotcurve.numbers(path, rows, col) if col in header else None
        for w in windows:
            inside = None if values is None else values[ok & (frames >= w[0]) & (frames <= w[1]) & np.isfinite(values)]
            medians[col, w] = float(np.median(inside)) if inside is not None and inside.size else None
    return {"path": path, "y": y_col, "frames": reached, "at": [plotcurve.score_at(frames, score, n) for n in at],
            "medians": medians, "columns": header}


def label(path):
    """A run's name in the table: its folder for a run folder's own CSV, else the file's path."""
    if os.path.basename(path) in plotcurve.FILES.values():
        return os.path.relpath(os.path.dirname(path))
    return os.path.relpath(path)


def cell(x):
    if x is None or not np.isfinite(x):
        return "-"
    return "%.0f" % x if abs(x) >= 100 else "%.3g" % x


def table(stats, at, windows, columns):
    """Markdown lines: one row per run."""
    head = ["run", "frames", "score"] + ["at %s" % human(n) for n in at] + \
        ["%s %s" % (c, window_name(w)) if len(windows) > 1 else "%s (median, %s)" % (c, window_name(w))
         for c in columns for w in windows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in stats:
        row = [label(s["path"]), human(s["frames"]) if np.isfinite(s["frames"]) else "-", s["y"]] + \
            [cell(x) for x in s["at"]] + [cell(s["medians"][c, w]) for c in columns for w in windows]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--input", nargs="+", required=True, help="run folders, folders of runs, globs, CSVs")
    parser.add_argument("--source", choices=["auto"] + sorted(plotcurve.FILES), default="auto",
                        help="which CSV a run folder is read by (as tools/plotcurve.py)")
    parser.add_argument("-y", default=None, help="the score column (default: mean_return_100 where a file has "
                        "it, else the file's return)")
    parser.add_argument("--at", nargs="+", default=list(DEFAULT_AT), help="frame counts to read the score at")
    parser.add_argument("--window", action="append", default=None,
                        help="START:END frames the medians are taken over (repeatable; default %s)" % DEFAULT_WINDOW)
    parser.add_argument("--columns", nargs="+", default=list(DEFAULT_COLUMNS), help="diagnostic columns")
    parser.add_argument("-o", "--output", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    try:
        at = [frame_count(n, "--at") for n in args.at]
        windows = [window(w) for w in (args.window or [DEFAULT_WINDOW])]
        paths = plotcurve.find_runs(args.input, args.source)
        stats = [run_stats(p, args.y, at, windows, args.columns) for p in paths]
        headers = {c for s in stats for c in s["columns"]}
        missing = [c for c in args.columns if c not in headers]
        if missing:
            raise plotcurve.PlotError("--columns %s: no run logged %s; the runs' columns are: %s" % (
                " ".join(args.columns), ", ".join(missing), ", ".join(sorted(headers))))
    except plotcurve.PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = "\n".join(table(stats, at, windows, args.columns)) + "\n"
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
