"""What the bench scripts share: a local cluster's shape as arguments and as experiment.py flags,
reading back what its run left in its folder, writing a results table (also when Ctrl-C cuts runs
that resume), and figures (matplotlib without a display) saved next to their table."""
import csv
import json
import os
import platform
import shutil
import time

import matplotlib

matplotlib.use("Agg")  # before pyplot: the benches run on machines with no display
import matplotlib.pyplot as plt  # noqa: E402


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name as /proc/cpuinfo gives it, with " without AVX-512" where its flags lack
    avx512f (what names a machine's results folder). Virtual machines give one name to CPUs of
    different generations: an "AMD EPYC" with AVX512_BF16 ran the Pong recipe's update 1.5x faster
    in bfloat16, one without AVX-512 4.8x slower (bench/results/<machine>/compute_dtype.md)."""
    name, flags = None, None
    try:
        for line in open(cpuinfo):
            if line.startswith("model name") and name is None:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and flags is None:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    return name + (" without AVX-512" if flags is not None and "avx512f" not in flags else "")


def cluster_args(p, actors, envs_per_actor, batch_size, unroll_length):
    """Adds a local cluster's shape to the argument parser `p`, with the script's defaults."""
    for name, default in (("--actors", actors), ("--envs_per_actor", envs_per_actor),
                          ("--batch_size", batch_size), ("--unroll_length", unroll_length)):
        p.add_argument(name, type=int, default=default)


def cluster_flags(a):
    """experiment.py's flags for cluster_args' arguments (--actors is LocalCluster's count, not a flag)."""
    return ["--batch_size=%d" % a.batch_size, "--unroll_length=%d" % a.unroll_length,
            "--envs_per_actor=%d" % a.envs_per_actor]


def read_csv(path):
    """The rows of a CSV file as dicts; [] where the file is not there (yet)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def read_json(path, default=None):
    """A JSON file's content; `default` where the file is not there (yet)."""
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def log_text(logdir, name="learner.log"):
    """The text of a run folder's log `name` (the learner's by default), "" where there is none."""
    path = os.path.join(logdir, "logs", name)
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def finished_run(logdir, keep=False):
    """What a stopped run left in `logdir`: metrics.csv's rows, summary.json (None where the
    learner wrote none) and the learner's log ("" where there is none); then removes `logdir`,
    since the benches keep only their own tables, unless `keep` (a run to go on with later)."""
    rows = read_csv(os.path.join(logdir, "metrics.csv"))
    summary, log = read_json(os.path.join(logdir, "summary.json")), log_text(logdir)
    if not keep:
        shutil.rmtree(logdir, ignore_errors=True)
    return rows, summary, log


class Stopped(KeyboardInterrupt):
    """Ctrl-C during a suite whose runs resume where they were cut (bench/atari.py): it carries the
    suite's table of where the runs stood, for bench/run.py to write before it exits."""

    def __init__(self, lines):
        super().__init__()
        self.lines = lines


def train_then_table(train, table):
    """train(), then table()'s lines. A run cut by Ctrl-C has checkpointed and is resumed by the
    next invocation, so where it stood is a result: Ctrl-C during train() raises Stopped carrying
    table()'s lines, marked as taken at the stop. A second Ctrl-C while the table is made stops
    that too."""
    try:
        train()
    except KeyboardInterrupt:
        print("\n[stopped] Ctrl-C: writing the table of where the runs stood", flush=True)
        lines = table()
        lines[2:2] = ["Stopped by Ctrl-C on %s UTC: a run short of its budget stands where it was cut; the same "
                      "command resumes it." % time.strftime("%Y-%m-%d %H:%M", time.gmtime()), ""]  # under the title
        raise Stopped(lines)
    return table()


def write_lines(path, lines):
    """A results table (or any text) as a file, one line of `lines` a line."""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def subplots(*args, **kwargs):
    """plt.subplots on the Agg backend."""
    return plt.subplots(*args, **kwargs)


def save_figure(fig, path):
    """Writes the figure as a PNG (100 dpi, tight layout) and frees it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
