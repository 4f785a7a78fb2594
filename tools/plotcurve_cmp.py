"""Two sets of runs on one figure: -i (e.g. N samplers) over -b (the baseline, e.g. one
process). Each set: mean over its runs, min-max band. The sets may be of different kinds (an
IMPALA set against a PPO set by time or frames).

    python tools/plotcurve_cmp.py -x time -i 'results/n10_*' -b 'results/n1_*' -o cmp.png

Same inputs, names and columns as plotcurve.py.
"""
import argparse
import sys

import matplotlib.pyplot as plt

from tools import plotcurve


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    plotcurve.add_common_arguments(parser)
    parser.add_argument("-b", "--baseline", nargs="+", required=True, help="baseline run folders / globs")
    parser.add_argument("--label", default="runs", help="legend label of -i")
    parser.add_argument("--baseline_label", default="baseline", help="legend label of -b")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth must be >= 1, got {args.smooth}")
    try:
        runs = plotcurve.find_runs(args.input, args.source)
        baseline = plotcurve.find_runs(args.baseline, args.source)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        plotcurve.plot_runs(ax, runs, args.x, args.y, args.label, color="C0", smooth=args.smooth)
        plotcurve.plot_runs(ax, baseline, args.x, args.y, args.baseline_label, color="C1", smooth=args.smooth)
    except plotcurve.PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plotcurve.finish(fig, ax, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
