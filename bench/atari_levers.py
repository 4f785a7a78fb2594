"""The Atari recipe's levers, learning on: frames/s and the early score of configs/atari.flags with
one setting changed at a time, on one game and the same cores.

    .venv/bin/python bench/atari_levers.py --game BreakoutNoFrameskip-v4 --frames 1000000
    .venv/bin/python bench/atari_levers.py --variants recipe sgd2 size42 --frames 3000000 --seeds 1 2
    .venv/bin/python bench/atari_levers.py --game SeaquestNoFrameskip-v4 --frames 400000 --table replay_levers \
        --extra=--learning_rate_decay=none --variants recipe replay_uniform replay_uniform_recent \
        replay_uniform_clip_mu replay_uniform_sgd1

The replay_* variants add bench/atari_replay.py's replay (half of each batch from a buffer) with one
setting changed, to find which part of the recipe makes uniform replay's entropy collapse there
(docs/replay.md#measured); the table's entropy column is the policy's at the run's end. --extra adds
flags to every variant, after the recipe's and the variant's: a short run's rate would otherwise
decay to 0 at --frames instead of at a real run's budget.

Each variant is one local cluster (1 learner + --actors actors x the recipe's 32 envs) run to --frames;
the variants take turns within each seed (interleaved), so a slow spell of the machine hits all alike.
frames/s is the median of the learner's progress rows after the first fifth of the run (start-up and
tracing left out); the score is the mean of the last 100 whole games at the end (at a short budget
an early sign only). Writes <out>/<--table>.md and .csv.
"""
import argparse
import copy
import csv
import json
import os
import re
import sys
import tempfile

import numpy as np

from bench import atari_replay, common
from bench import run as bench_run
from local_cluster import LocalCluster, obey_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def replay(kind, capacity=None):
    """--replay_parameters of bench/atari_replay.py's `kind` variant, its buffer resized to `capacity`."""
    spec = copy.deepcopy(atari_replay.VARIANTS[kind][1])
    if capacity is not None:
        spec[-1]["capacity"] = capacity
    return ["--replay_parameters=" + json.dumps(spec)]


UNIFORM = "uniform replay, half of each batch from 1,000 unrolls (bench/atari_replay.py's)"
VARIANTS = {  # name: (what it changes, the flags after the recipe's)
    "recipe": ("configs/atari.flags as it is: 84x84, 4 passes x 4 minibatches, batch 32 x 32, bfloat16", []),
    "sgd2": ("2 passes over each batch", ["--num_sgd_iter=2"]),
    "sgd1": ("1 pass (plain IMPALA with PPO's clip)", ["--num_sgd_iter=1"]),
    "minibatch2": ("2 minibatches per pass", ["--num_minibatches=2"]),
    "size42": ("42x42 frames (Pong's recipe size)", ["--width=42", "--height=42"]),
    "size42_sgd2": ("42x42 frames, 2 passes", ["--width=42", "--height=42", "--num_sgd_iter=2"]),
    "float32": ("float32 compute", ["--compute_dtype=float32"]),
    "bfloat16": ("bfloat16 compute (the recipe's own setting, for a run that compares dtypes)",
                 ["--compute_dtype=bfloat16"]),
    "float32_sgd2": ("float32 compute, 2 passes", ["--compute_dtype=float32", "--num_sgd_iter=2"]),
    "nature": ("DQN's Nature net (32-64-64 convs, FC 512), the published PPO tables' net",
               ["--agent_name=NatureConvNetAgent"]),
    "nature_sgd2": ("the Nature net, 2 passes", ["--agent_name=NatureConvNetAgent", "--num_sgd_iter=2"]),
    "batch64": ("batch 64 unrolls", ["--batch_size=64", "--queue_capacity=128"]),
    # The policy lag's levers: how many batches old the weights are that the actors act on.
    "lag_defaults": ("queue of two batches, actors send ahead (the defaults)",
                     ["--queue_capacity=64", "--actor_send_ahead"]),
    "lag_prefetch0": ("no batch dequeued ahead of the update", ["--prefetch_batches=0"]),
    "lag_one_actor": ("1 actor process of 32 envs instead of 2", []),
    # Replay's levers: which part of the recipe makes uniform replay collapse.
    "replay_uniform": (UNIFORM, replay("standard")),
    "replay_elite": ("elite replay, half of each batch (bench/atari_replay.py's)", replay("elite")),
    "replay_uniform_recent": ("uniform replay from the newest 100 unrolls (about 6 batches old at most)",
                              replay("standard", 100)),
    "replay_uniform_sgd1": (UNIFORM + ", 1 pass", replay("standard") + ["--num_sgd_iter=1"]),
    "replay_uniform_clip_mu": (UNIFORM + ", PPO's ratio against the actors' policy mu (--clip_ratio_to=behaviour)",
                               replay("standard") + ["--clip_ratio_to=behaviour"]),
    "replay_uniform_fresh_clip": (UNIFORM + ", PPO's ratio against pi_old on the queue's unrolls and against mu on "
                                  "replayed ones (--clip_ratio_to=fresh_batch_start)",
                                  replay("standard") + ["--clip_ratio_to=fresh_batch_start"]),
    "replay_uniform_noadvnorm": (UNIFORM + ", advantages not standardised", replay("standard") +
                                 ["--nonormalize_advantages"]),
}
ACTORS = {"lag_one_actor": 1}  # variants that change the actor processes rather than a flag


def run_variant(a, name, seed):
    logdir = tempfile.mkdtemp(prefix="atari_lever_")
    flags = ["--flagfile=" + os.path.join(ROOT, "configs", "atari.flags"), "--level_name=" + a.game,
             "--seed=%d" % seed, "--total_environment_frames=%d" % a.frames, "--log_every_s=10"]
    flags += VARIANTS[name][1] + a.extra.split()
    print("[levers] %s seed %d" % (name, seed), flush=True)
    with LocalCluster(ACTORS.get(name, a.actors), a.base_port, flags, logdir) as cluster:
        code = cluster.wait()
    rows, summary, log = common.finished_run(logdir)
    if code != 0 or summary is None:
        return {"variant": name, "seed": seed, "error": "exit %s: %s" % (code, log.splitlines()[-1:] if log else "")}
    late = [float(r["fps"]) for r in rows if int(r["frames"]) > a.frames / 5] or [float(r["fps"]) for r in rows]
    last = rows[-1]
    lags = [float(x) for x in re.findall(r"\| lag ([0-9.]+) \|", log)]
    return {"variant": name, "seed": seed, "fps": float(np.median(late)), "frames": summary["frames"],
            "elapsed_s": summary["elapsed_s"], "lag": float(np.median(lags)) if lags else float("nan"),
            "score": float(last.get("mean_return_100") or last["mean_return_20"]), "entropy": float(last["entropy"]),
            "bottleneck": summary["time_breakdown"]["bottleneck"], "error": ""}


def main():
    obey_ctrl_c()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="BreakoutNoFrameskip-v4")
    p.add_argument("--variants", nargs="+", default=["recipe", "sgd2", "sgd1", "minibatch2", "size42", "size42_sgd2"],
                   choices=sorted(VARIANTS))
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--base_port", type=int, default=19800)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    p.add_argument("--extra", default="", help="flags added to every variant, e.g. --extra=--learning_rate_decay=none")
    p.add_argument("--table", default="atari_levers", help="the results' file name, without .md or .csv")
    a = p.parse_args()
    out, machine = bench_run.results_dir(a.out)
    results = [run_variant(a, name, seed) for seed in a.seeds for name in a.variants]
    with open(os.path.join(out, a.table + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["variant", "seed", "fps", "frames", "elapsed_s", "lag", "score", "entropy", "bottleneck",
                               "error"])
        w.writeheader()
        w.writerows(results)
    # Each row is compared with the recipe's run of its own seed (interleaved with it), or, where the
    # recipe was not asked for, with the first variant's: a run that asks for no recipe row still has ratios.
    base_name = "recipe" if "recipe" in a.variants else a.variants[0]
    base = {r["seed"]: r["fps"] for r in results if r["variant"] == base_name and not r["error"]}
    lines = ["# %s, configs/atari.flags%s with one lever changed, %s frames per run, learning on\n" % (
        a.game, " " + a.extra if a.extra else "", "{:,}".format(a.frames)),
             "| variant | what it changes | seed | frames/s | vs %s (same seed) | policy lag (batches) | "
             "score (last 100 games) at the end | entropy at the end | bottleneck |" % base_name, "|---" * 9 + "|"]
    for r in results:
        if r["error"]:
            lines.append("| %s | %s | %d | failed: %s | | | | | |" % (
                r["variant"], VARIANTS[r["variant"]][0], r["seed"], r["error"]))
            continue
        lines.append("| %s | %s | %d | %.0f | %.2fx | %.1f | %.1f | %.2f | %s |" % (
            r["variant"], VARIANTS[r["variant"]][0], r["seed"], r["fps"], r["fps"] / base.get(r["seed"], np.nan),
            r["lag"], r["score"], r["entropy"], r["bottleneck"]))
    bench_run.write_table(out, a.table, lines, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
