"""Runs a list of experiments one after another, each on a local cluster.

    .venv/bin/python multi_train.py --experiments=exps.json [--num_actors=2] [-- --seed=3 ...]

exps.json is a JSON list, one object per run (or {"common": {...}, "runs": [...]}):

    {"common": {"level_name": "CartPole-v1", "agent_name": "MLPAgent",
                "total_environment_frames": 300000, "batch_size": 16, "unroll_length": 20},
     "runs": [{"name": "no_replay"},
              {"name": "elite", "replay_parameters": [{"type": "queue", "capacity": 1,
                                                       "sample_ratio": 0.5},
                                                      {"type": "custom", "capacity": 500,
                                                       "sample_ratio": 0.5,
                                                       "sample_strategy": "elite_sampling"}]}]}

Keys are experiment.py flag names (values: numbers, strings, booleans, lists; a
list/object value is passed as JSON). Precedence, as in the V-trace platform: flags
after `--` on this command line > the run's overrides > "common" > experiment.py's
defaults (and, with mode train_w_load, the options saved with the checkpoint).
Every run gets <out>/<name>/ (a normal run folder); <out>/multi_train.csv lists each
run's outcome from its summary.json. Everything is checked before the first run
starts; Ctrl-C stops the current run cleanly (checkpoint) and skips the rest.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

from tools.digits import int_arg

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ExperimentsError(ValueError):
    pass


def load_experiments(path):
    """[(name, {flag: value})] from the experiments file; ExperimentsError names what is wrong."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ExperimentsError("--experiments=%s: cannot read it (%s)" % (path, e.strerror))
    except ValueError as e:
        raise ExperimentsError("--experiments=%s is not valid JSON: %s" % (path, e))
    common = {}
    if isinstance(data, dict):
        unknown = set(data) - {"common", "runs"}
        if unknown:
            raise ExperimentsError('%s: unknown top-level key(s) %s; expected "common" and "runs"'
                                   % (path, ", ".join(sorted(unknown))))
        common, data = data.get("common", {}), data.get("runs")
        if not isinstance(common, dict):
            raise ExperimentsError('%s: "common" must be an object of flag: value' % path)
    if not isinstance(data, list) or not data:
        raise ExperimentsError("%s: expected a non-empty list of runs (objects of flag: value)" % path)
    runs, names = [], set()
    for i, run in enumerate(data):
        if not isinstance(run, dict):
            raise ExperimentsError("%s: run %d is a %s, expected an object of flag: value"
                                   % (path, i, type(run).__name__))
        run = dict(run)
        name = str(run.pop("name", "run%d" % i))
        if not NAME.match(name) or name in names:
            raise ExperimentsError("%s: run %d has name %r; names must be unique and use only "
                                   "letters, digits, '_', '-', '.'" % (path, i, name))
        names.add(name)
        for key in ("logdir", "job_name", "learner_hosts", "learner_host", "actor_hosts", "task"):
            if key in run or key in common:
                raise ExperimentsError("%s: run %d (%s) sets %r, which multi_train.py chooses itself"
                                       % (path, i, name, key))
        runs.append((name, dict(common, **run)))
    return runs


def to_flags(overrides):
    out = []
    for key, value in overrides.items():
        if not re.match(r"^[a-z_][a-z0-9_]*$", str(key)):
            raise ExperimentsError("flag name %r is not a flag name (lowercase, digits, '_')" % key)
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, dict)):
            value = json.dumps(value)
        out.append("--%s=%s" % (key, value))
    return out


def merged_flags(run_overrides, cli_flags):
    """The run's flags with the command line's taking precedence (last one wins in absl,
    but we drop the overridden ones so the command line read in the logs is clear)."""
    cli_names = {f.split("=", 1)[0] for f in cli_flags}
    return [f for f in to_flags(run_overrides) if f.split("=", 1)[0] not in cli_names] + list(cli_flags)


def check_flags(python, flags):
    """Asks experiment.py (argument parsing and validation only) whether the flags are valid."""
    code = ("import sys; sys.argv=['experiment.py']+%r; import experiment; from absl import flags as f;"
            "f.FLAGS(sys.argv); experiment.validate_run()" % (flags,))
    proc = subprocess.run([python, "-c", code], cwd=HERE, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else "experiment.py rejected the flags"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", required=True, help="JSON file with the runs")
    parser.add_argument("--num_actors", type=int_arg, default=2)
    parser.add_argument("--base_port", type=int_arg, default=8001)
    parser.add_argument("--out", default=None, help="folder for the runs (default results/multi_<ts>)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then flags for every run")
    args = parser.parse_args(argv)
    cli = [f for f in args.flags if f != "--"]
    try:
        runs = load_experiments(args.experiments)
        plans = [(name, merged_flags(over, cli)) for name, over in runs]
    except ExperimentsError as e:
        print("multi_train.py: error: %s" % e, file=sys.stderr)
        return 2
    bad = [(name, check_flags(sys.executable, fl)) for name, fl in plans]
    bad = [(n, m) for n, m in bad if m]
    if bad:
        for name, msg in bad:
            print("multi_train.py: error: run %s: %s" % (name, msg), file=sys.stderr)
        return 2
    out = args.out or os.path.join("results", "multi_%d" % int(time.time()))
    os.makedirs(out, exist_ok=True)
    summary_path = os.path.join(out, "multi_train.csv")
    stopping = {"flag": False}
    current = {"proc": None}

    def handle(signum, frame):
        stopping["flag"] = True
        if current["proc"] is not None and current["proc"].poll() is None:
            current["proc"].send_signal(signal.SIGINT)
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)

    with open(summary_path, "w") as summary:
        summary.write("name,exit_code,reason,frames,elapsed_s,mean_return_20,logdir,flags\n")
        for i, (name, fl) in enumerate(plans):
            if stopping["flag"]:
                print("[multi_train] stopped; skipping %s" % name, flush=True)
                continue
            logdir = os.path.join(out, name)
            print("[multi_train] run %d/%d: %s -> %s" % (i + 1, len(plans), name, logdir), flush=True)
            cmd = [sys.executable, os.path.join(HERE, "local_cluster.py"), "--num_actors=%d" % args.num_actors,
                   "--base_port=%d" % args.base_port, "--logdir=" + logdir, "--"] + fl
            current["proc"] = subprocess.Popen(cmd)
            code = current["proc"].wait()
            info = {}
            if os.path.exists(os.path.join(logdir, "summary.json")):
                with open(os.path.join(logdir, "summary.json")) as f:
                    info = json.load(f)
            summary.write("%s,%d,%s,%s,%s,%s,%s,%s\n" % (
                name, code, json.dumps(info.get("reason", "")), info.get("frames", ""),
                info.get("elapsed_s", ""), info.get("mean_return_20", ""), logdir,
                json.dumps(" ".join(fl))))
            summary.flush()
    print("[multi_train] done; outcomes in %s" % summary_path, flush=True)
    return 130 if stopping["flag"] else 0


if __name__ == "__main__":
    sys.exit(main())
