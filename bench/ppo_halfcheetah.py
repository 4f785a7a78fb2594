"""HalfCheetah-v5 learning curve of WALL-E's PPO within a budget of env steps.

    .venv/bin/python bench/ppo_halfcheetah.py                          # kl variant, seed 0, 1M steps
    .venv/bin/python bench/ppo_halfcheetah.py --variants kl clip --seeds 0 1 --budget 1000000
    .venv/bin/python bench/ppo_halfcheetah.py --variants zoo --seeds 1 2 3 --target 5000
    nice -n 10 .venv/bin/python bench/ppo_halfcheetah.py ... &         # on a shared machine

Each (variant, seed) is one `ppo_parallel_main.py` run, stopped at --budget env
steps (its logs under bench/results/ppo_halfcheetah_runs/). Variants:

    kl         WALL-E: adaptive KL penalty + hinge, KL target 0.003, -b 1000 (its parallel command)
    kl_b10000  the same with -b 10000 (its one-process command)
    clip       clipped surrogate, -b 2048, 10 epochs of minibatch 64, lr 3e-4
    zoo        rl-baselines3-zoo's tuned SB3 PPO for HalfCheetah (hyperparams/ppo.yml,
               HalfCheetah-v3/v4; about 5,800 there at 1M steps): n_steps 512 x 1 env
               = -b 512 over -n 2 samplers, minibatch 64, 20 epochs, gamma 0.98,
               lambda 0.92, lr 2.0633e-5, ent_coef 0.000401762, clip 0.1,
               max_grad_norm 0.8, vf_coef 0.58096, Adam eps 1e-5 (SB3's), the joint
               update, reward normalisation, obs clip 10, pi/vf [256, 256] relu nets
               with torch-default init and log_std_init -2

-n defaults to each variant's own (2 for zoo, 1 for the others). Score = return_last10, the mean return of the last 10 finished episodes. Writes
bench/results/ppo_halfcheetah.csv (every run's curve), .png (score vs steps and
vs wall time, mean and min-max band over seeds) and .md (one row per run:
final and best score, steps and time to --target).
"""
import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata

from tools import plotcurve
from bench import common

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

VARIANTS = {
    "kl": ["--loss", "kl", "-b", "1000"],
    "kl_b10000": ["--loss", "kl", "-b", "10000"],
    "clip": ["--loss", "clip", "-b", "2048", "--clip_epochs", "10", "--clip_minibatch", "64"],
    # rl-zoo's recipe is the file the README's WALL-E command runs, so the two cannot drift apart
    "zoo": ["@" + os.path.join(ROOT, "configs", "ppo_halfcheetah.args")],
}
VARIANT_SAMPLERS = {"zoo": 2}  # -n when not given; 1 otherwise
CURVE_FIELDS = ["variant", "seed", "iteration", "steps", "time", "return_mean", "return_last10",
                "collect_time", "learn_time", "kl", "entropy"]
SCORE = "return_last10"


def read_rows(logdir):
    path = os.path.join(logdir, "progress.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_eval(logdir):
    """The deterministic evaluation's mean return (ppo.py --eval_episodes), NaN without one."""
    path = os.path.join(logdir, "eval.json")
    if not os.path.exists(path):
        return float("nan")
    with open(path) as f:
        return float(json.load(f)["return_mean"])


def summarise(variant, seed, num_samplers, rows, target, wall_s, status, eval_score=float("nan")):
    scored = [r for r in rows if r[SCORE] != ""]
    hit = next((r for r in scored if float(r[SCORE]) >= target), None)
    return {"variant": variant, "seed": seed, "num_samplers": num_samplers, "exit_status": status,
            "steps": int(rows[-1]["steps"]) if rows else 0,
            "final_score": float(scored[-1][SCORE]) if scored else float("nan"),
            "best_score": max((float(r[SCORE]) for r in scored), default=float("nan")),
            "steps_to_target": int(hit["steps"]) if hit else -1,
            "time_to_target_s": float(hit["time"]) if hit else float("nan"),
            "wall_s": wall_s, "eval_score": eval_score}


def over_seeds(summaries, target):
    """Markdown lines: per variant, the final training score and the deterministic evaluation,
    mean and min over its seeds, and whether every seed reached the target."""
    lines = ["", "| variant | seeds | final: mean / min | every seed >= target | eval: mean / min | every seed >= target |",
             "|---|---|---|---|---|---|"]
    for variant in dict.fromkeys(s["variant"] for s in summaries):
        runs = [s for s in summaries if s["variant"] == variant]
        cells = []
        for key in ("final_score", "eval_score"):
            xs = [s[key] for s in runs]
            cells += [f"{sum(xs) / len(xs):.0f} / {min(xs):.0f}", "yes" if min(xs) >= target else "**no**"]
        lines.append(f"| {variant} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def run_one(a, variant, seed, runs_dir):
    """One ppo_parallel_main.py run; (its summary, its curve rows)."""
    logdir = os.path.join(runs_dir, f"{variant}_s{seed}")
    if os.path.isdir(logdir) and not a.keep:
        shutil.rmtree(logdir)
    n = a.num_samplers or VARIANT_SAMPLERS.get(variant, 1)
    # the variant's flags first: a recipe file's own budget gives way to --budget
    cmd = [sys.executable, os.path.join(ROOT, "ppo_parallel_main.py"), "HalfCheetah-v5"] + VARIANTS[variant] + [
        "-it", "1000000", "--max_steps", str(a.budget), "-n", str(n), "--seed", str(seed), "--logdir", logdir,
        "--quiet", "--eval_episodes", str(a.eval_episodes)]
    print(f"[{variant} seed {seed}] {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    status = subprocess.call(cmd, cwd=ROOT)  # Ctrl-C reaches it too: it stops its samplers
    rows = read_rows(logdir)
    s = summarise(variant, seed, n, rows, a.target, time.time() - t0, status, read_eval(logdir))
    print(f"[{variant} seed {seed}] exit {status}: {s['steps']} steps, final {s['final_score']:.0f}, "
          f"eval {s['eval_score']:.0f}, best {s['best_score']:.0f}, steps to {a.target:.0f}: "
          f"{s['steps_to_target']}, wall {s['wall_s']:.0f} s", flush=True)
    return s, [dict({k: r[k] for k in CURVE_FIELDS[2:]}, variant=variant, seed=seed) for r in rows]


def report(a, summaries):
    """The Markdown table of ppo_halfcheetah.md: one row per run, then per variant over seeds."""
    lines = [f"# HalfCheetah-v5, WALL-E PPO, {a.budget} env steps per run, target {a.target:.0f} ({SCORE})\n",
             f"final: {SCORE}, the mean training return of the last 10 episodes (exploration noise on); eval: "
             f"the final policy's mean action, mean return of {a.eval_episodes} episodes (as rl-zoo's "
             f"deterministic evaluation).\n",
             "| variant | seed | -n | steps | final | eval | best | steps to target | time to target (s) | wall (s) | exit |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        reached = s["steps_to_target"] if s["steps_to_target"] >= 0 else "not reached"
        lines.append(f"| {s['variant']} | {s['seed']} | {s['num_samplers']} | {s['steps']} | {s['final_score']:.0f} "
                     f"| {s['eval_score']:.0f} | {s['best_score']:.0f} | {reached} "
                     f"| {s['time_to_target_s']:.0f} | {s['wall_s']:.0f} | {s['exit_status']} |")
    versions = ", ".join("%s %s" % (n, metadata.version(n)) for n in ("tensorflow-cpu", "mujoco", "gymnasium"))
    return lines + over_seeds(summaries, a.target) + [
        "", "Command: `.venv/bin/python bench/ppo_halfcheetah.py %s`" % " ".join(sys.argv[1:]), "",
        "Machine: %d cores, %s; %s." % (os.cpu_count(), platform.processor() or platform.machine(), versions),
        "Date: %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())]


def plot(a, runs_dir):
    fig, axes = common.subplots(1, 2, figsize=(12, 4.5))
    for i, variant in enumerate(a.variants):
        paths = [os.path.join(runs_dir, f"{variant}_s{seed}", "progress.csv") for seed in a.seeds]
        paths = [x for x in paths if read_rows(os.path.dirname(x))]
        for ax, x in zip(axes, ("steps", "time")):
            if paths:
                plotcurve.plot_runs(ax, paths, x, SCORE, variant, color=f"C{i}")
    for ax, x in zip(axes, ("env steps", "wall time (s)")):
        ax.axhline(a.target, color="gray", ls="--", alpha=0.6, label=f"target {a.target:.0f}")
        ax.set_xlabel(x)
        ax.set_ylabel(f"{SCORE} (mean of last 10 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle("HalfCheetah-v5, WALL-E PPO")
    common.save_figure(fig, os.path.join(a.out, "ppo_halfcheetah.png"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["kl"], choices=sorted(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--budget", type=int, default=1_000_000, help="env steps per run")
    p.add_argument("--target", type=float, default=3000.0, help="score to reach within the budget")
    p.add_argument("-n", "--num_samplers", type=int, default=None,
                   help="sampler processes per run (default: the variant's own, 2 for zoo, else 1)")
    p.add_argument("--eval_episodes", type=int, default=10,
                   help="episodes of the final policy's mean action after each run (the eval column)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--keep", action="store_true", help="keep earlier runs' folders (default: start afresh)")
    a = p.parse_args()
    if a.budget < 1 or (a.num_samplers is not None and a.num_samplers < 1):
        p.error("--budget and -n/--num_samplers must be >= 1")
    runs_dir = os.path.join(a.out, "ppo_halfcheetah_runs")
    os.makedirs(runs_dir, exist_ok=True)
    summaries, curves = [], []
    for variant in a.variants:
        for seed in a.seeds:
            summary, rows = run_one(a, variant, seed, runs_dir)
            summaries.append(summary)
            curves += rows
            if summary["exit_status"] == 130:
                break
    with open(os.path.join(a.out, "ppo_halfcheetah.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, CURVE_FIELDS)
        w.writeheader()
        w.writerows(curves)
    lines = report(a, summaries)
    common.write_lines(os.path.join(a.out, "ppo_halfcheetah.md"), lines)
    print("\n".join(lines))
    plot(a, runs_dir)
    print(f"wrote {a.out}/ppo_halfcheetah.csv, .md, .png")
    return 0 if all(s["exit_status"] == 0 for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
