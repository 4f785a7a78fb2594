"""Replay variants for an equal budget of environment frames: queue only (no replay),
queue + standard replay, queue + elite replay (the PyTorch V-trace platform's setting: half of every batch
replayed). Same seed, same flags otherwise, run one after another in one invocation.

  .venv/bin/python bench/replay_compare.py --level PongNoFrameskip-v4 --frames 1500000
  .venv/bin/python bench/replay_compare.py --level CartPole-v1 --frames 300000

Reports per variant: final and best mean return (last 20 episodes), learner samples/s
(unrolls trained per second x unroll length: replay makes the learner train on more
samples than the actors produce), env frames/s, and the replay memory. Writes
bench/results/replay_<level>.{csv,md,png}.
"""
import argparse
import csv
import json
import os
import sys
import tempfile
import time

from local_cluster import LocalCluster, obey_ctrl_c
from bench import common

HERE = os.path.dirname(os.path.abspath(__file__))
UNROLL = 20  # both settings' --unroll_length, which learner samples/s counts


def variants(capacity):
    q = {"type": "queue", "capacity": 1, "sample_ratio": 0.5}
    return {
        "queue": [{"type": "queue", "capacity": 1, "sample_ratio": 1}],
        "queue+standard": [q, {"type": "standard", "capacity": capacity, "sample_ratio": 0.5, "compress": True}],
        "queue+elite": [q, {"type": "custom", "capacity": capacity, "sample_ratio": 0.5, "compress": True,
                            "sample_strategy": "elite_sampling", "dist_function": "kl_div",
                            "lambda_batch_multiplier": 4, "elite_sampling_strategy": 2,
                            "alfa_annealing_factor": 1.0}],
    }


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--frames", type=int, default=1_500_000)
    p.add_argument("--capacity", type=int, default=2000, help="replay capacity in unrolls")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--base_port", type=int, default=19900)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    return p.parse_args()


def base_flags(a, atari):
    """experiment.py's flags shared by every variant: Pong's settings for Atari, CartPole's otherwise."""
    if atari:
        flags = ["--agent_name=SimpleConvNetAgent", "--batch_size=32", "--unroll_length=%d" % UNROLL,
                 "--envs_per_actor=32", "--queue_capacity=64", "--entropy_cost=0.0006", "--learning_rate=0.0006",
                 "--gradients_clipping=40"]
    else:
        flags = ["--agent_name=MLPAgent", "--batch_size=16", "--unroll_length=%d" % UNROLL, "--envs_per_actor=8",
                 "--queue_capacity=32", "--entropy_cost=0.01", "--learning_rate=0.001"]
    return flags + ["--level_name=" + a.level, "--total_environment_frames=%d" % a.frames, "--log_every_s=5",
                    "--seed=%d" % a.seed]


def run_variant(a, flags, name, spec, batch):
    """Trains one variant to the budget: its table row and its curve's points."""
    logdir = tempfile.mkdtemp(prefix="replay_bench_")
    t0 = time.time()
    with LocalCluster(a.actors, a.base_port, flags + ["--replay_parameters=" + json.dumps(spec)],
                      logdir) as cluster:
        code = cluster.wait()
    wall = time.time() - t0
    rows, summary, log = common.finished_run(logdir)
    if summary is None:
        raise SystemExit("%s: the learner (exit %s) wrote no summary; its log ends:\n%s" % (
            name, code, "\n".join(log.splitlines()[-25:])))
    if code != 0:
        print("%s: learner exit code %s" % (name, code))
    updates = int(rows[-1]["updates"]) if rows else 0
    rets = [float(r["mean_return_20"]) for r in rows if r["mean_return_20"] != "nan"]
    replay = summary.get("replay", {})
    mem = sum(v.get("nbytes", 0) for k, v in replay.items() if isinstance(v, dict))
    elapsed = max(summary["elapsed_s"], 1e-9)
    result = {"variant": name, "frames": summary["frames"], "seconds": round(summary["elapsed_s"], 1),
              "final_mean_return_20": summary["mean_return_20"],
              # the final figure (at the stop) can come after the last progress line
              "best_mean_return_20": max((x for x in rets + [summary["mean_return_20"]] if x == x),
                                         default=float("nan")),
              "env_frames_per_s": summary["frames"] / elapsed,
              "learner_samples_per_s": updates * batch * UNROLL / elapsed, "updates": updates,
              "replay_memory_mb": mem / 2 ** 20, "wall_s": wall}
    curve = [dict(variant=name, frames=r["frames"], time_s=r["time_s"], mean_return_20=r["mean_return_20"])
             for r in rows]
    return result, curve


def table(a, results):
    base = results[0]
    lines = ["# Replay on %s: equal budget of %d env frames, seed %d, 1 learner + %d actors (%d cores)" % (
                 a.level, a.frames, a.seed, a.actors, os.cpu_count()), "",
             "Replay variants take half of each batch from a %d-unroll buffer (lz4-compressed); elite = "
             "kl_div distance, lambda 4, strategy 2." % a.capacity, "",
             "| variant | final mean-20 | best mean-20 | env frames/s | learner samples/s | samples/s ratio to queue "
             "| replay MB | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append("| %s | %.2f | %.2f | %.0f | %.0f | %.2f | %.1f | %.0f |" % (
            r["variant"], r["final_mean_return_20"], r["best_mean_return_20"], r["env_frames_per_s"],
            r["learner_samples_per_s"], r["learner_samples_per_s"] / base["learner_samples_per_s"],
            r["replay_memory_mb"], r["seconds"]))
    return lines + ["", "One seed per variant: differences in return smaller than the episode-to-episode spread "
                    "are noise.", "", "Command: `.venv/bin/python bench/replay_compare.py --level %s --frames %d`"
                    % (a.level, a.frames)]


def plot(path, level, results, curves):
    fig, ax = common.subplots(figsize=(6, 4))
    for r in results:
        xs = [int(c["frames"]) / 1e6 for c in curves if c["variant"] == r["variant"]]
        ys = [float(c["mean_return_20"]) for c in curves if c["variant"] == r["variant"]]
        ax.plot(xs, ys, label=r["variant"])
    ax.set_xlabel("env frames (M)")
    ax.set_ylabel("mean return, last 20 episodes")
    ax.set_title("Replay variants, %s" % level)
    ax.legend()
    common.save_figure(fig, path)


def main():
    obey_ctrl_c()
    a = parse_args()
    atari = "NoFrameskip" in a.level or a.level.startswith("ALE/")
    flags = base_flags(a, atari)
    results, curves = [], []
    for name, spec in variants(a.capacity).items():
        result, curve = run_variant(a, flags, name, spec, batch=32 if atari else 16)
        results.append(result)
        curves += curve
        print(json.dumps(result), flush=True)
    tag = "replay_" + a.level.replace("/", "-")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, tag + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["variant", "frames", "time_s", "mean_return_20"])
        w.writeheader()
        w.writerows(curves)
    lines = table(a, results)
    common.write_lines(os.path.join(a.out, tag + ".md"), lines)
    plot(os.path.join(a.out, tag + ".png"), a.level, results, curves)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
