"""The MuJoCo suite (`bench/run.py mujoco`): HalfCheetah-v5 (and Hopper-v5 with --levels) through
our IMPALA actors beside WALL-E's PPO and Stable-Baselines3's PPO on the same cores. HalfCheetah: all
three with rl-baselines3-zoo's PPO choices (IMPALA: configs/mujoco.flags). Hopper: IMPALA and WALL-E
with CleanRL's (configs/hopper.flags, configs/ppo_hopper.args), SB3 with zoo's, whose gamma of 0.999
stands still on the alive bonus.

    .venv/bin/python bench/run.py mujoco --seeds 1 2 3 --frames 3000000 --peer_steps 1000000
    .venv/bin/python bench/run.py mujoco --seeds 1 2 3 --contenders walle sb3   # the others' runs are read
    .venv/bin/python bench/run.py mujoco --levels Hopper-v5 --seeds 1 2 3
    .venv/bin/python bench/run.py mujoco --levels HalfCheetah-v5 Hopper-v5 --seeds   # only rebuild the table

The runs interleave: seed 1 of every contender, then seed 2's, and so on, one task after the other.
Each lives in <out>/mujoco_runs/<level>/<contender>_s<seed>/; a finished one is read, not run again,
so an invocation cut off part way goes on where it stopped (an unfinished run starts afresh: its
clock would not be one run's; one that failed is kept with its exit code: move its folder aside to
run it again). IMPALA runs to --frames env steps; the PPOs to --peer_steps or --peer_budget_s.

Score: the mean training return (exploration noise on) over a window of the newest finished
episodes: 20 for IMPALA, whose 16 envs end their 1,000-step episodes together, and 10 for the PPOs
(1-2 envs; WALL-E's return_last10); IMPALA's mean of 100 is shown as well. Time to the target
(--target, or the task's own: TASKS): seconds of training until the score first reaches it (each
system's own clock from its training loop's start; the wall column includes start-up). Writes one
section per task to <out>/mujoco.md, every run to mujoco.csv and every curve to mujoco_curves.csv
(with a level column), and one figure per task, mujoco_<task>.png.

Run folders are not committed, so a fresh checkout has the results folder without them. A run whose
folder is not here keeps its row and curve, read back from mujoco.csv and mujoco_curves.csv, instead
of dropping out of the tables the next invocation writes (a run in a folder here replaces its kept row),
and is not run again when asked for.
"""
import collections
import csv
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from bench import common
from bench import ppo_halfcheetah
from bench import peers
from local_cluster import LocalCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One actor of the recipe's 8 envs: the learner is the bottleneck on 2 cores, and a second actor only
# doubles the actors' policy lag (configs/mujoco.flags says why that matters).
IMPALA_ACTORS = 1
CONTENDERS = ("impala", "walle", "sb3")
LABELS = {"impala": "IMPALA (ours, the task's flag file, %d actor(s) x 8 envs)" % IMPALA_ACTORS,
          "walle": "WALL-E PPO (ours, the task's recipe, 2 samplers)",
          "sb3": "SB3 PPO (rl-zoo recipe, 1 env)"}
WINDOW = {"impala": 20, "walle": 10, "sb3": 10}
# CleanRL's ppo_continuous_action settings, as docs/results.md's Hopper runs took them (from the
# repository root, where the suite runs WALL-E).
WALLE_HOPPER = ["@" + os.path.join("configs", "ppo_hopper.args")]
# Per task: its short name (for the figure), IMPALA's flag file (from the repository root, where the
# suite runs: hopper.flags includes mujoco.flags by that path), the default target (a training
# return, exploration noise on; rl-zoo's PPO evaluates deterministically to 5,819 on HalfCheetah-v3
# and 2,410 on Hopper-v3 at 1M steps, its benchmark.md), WALL-E's flags and bench/peers/sb3_ppo.py's
# suite.
Task = collections.namedtuple("Task", ["short", "recipe", "target", "walle_flags", "sb3_suite"])
TASKS = {"HalfCheetah-v5": Task("HalfCheetah", "configs/mujoco.flags", 5000.0, ppo_halfcheetah.VARIANTS["zoo"],
                                "halfcheetah"),
         "Hopper-v5": Task("Hopper", "configs/hopper.flags", 2000.0, WALLE_HOPPER, "hopper")}
CSV_FIELDS = ["level", "contender", "seed", "steps", "score", "score_window", "mean_return_100", "best", "steps_to_target",
              "time_to_target_s", "steps_per_s", "train_s", "wall_s", "exit", "command"]
# Columns of mujoco.csv that hold whole numbers; the other numbers are read as floats, the rest as text.
INT_FIELDS = ("seed", "steps", "score_window", "steps_to_target", "exit")
TEXT_FIELDS = ("level", "contender", "command")


def runs_dir(out, level):
    return os.path.join(out, "mujoco_runs", level)


def run_dir(out, level, contender, seed):
    return os.path.join(runs_dir(out, level), "%s_s%d" % (contender, seed))


def run_one(a, level, contender, seed, logdir, sb3_py):
    """Runs one contender for one seed of a task in a fresh `logdir` and records how it ended in
    logdir/done.json (what makes the run finished); Ctrl-C stops it and propagates."""
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    print("[mujoco] %s %s seed %d: starting" % (level, contender, seed), flush=True)
    t0 = time.time()
    task = TASKS[level]
    if contender == "impala":
        flags = ["--flagfile=" + os.path.join(ROOT, task.recipe), "--level_name=" + level, "--seed=%d" % seed,
                 "--total_environment_frames=%d" % a.frames]
        with LocalCluster(IMPALA_ACTORS, a.base_port, flags, logdir) as cluster:
            code = cluster.wait()
        command = "local_cluster.py --num_actors=%d -- " % IMPALA_ACTORS + " ".join(flags).replace(ROOT + os.sep, "")
    elif contender == "walle":
        cmd = [sys.executable, os.path.join(ROOT, "ppo_parallel_main.py"), level] + task.walle_flags + [
            "-it", "1000000", "--max_steps", str(a.peer_steps), "-n", "2", "--seed", str(seed), "--logdir", logdir,
            "--quiet", "--eval_episodes", "0"]
        code = subprocess.call(cmd, cwd=ROOT)
        command = " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[1:])
    else:
        args = [task.sb3_suite, "--seed=%d" % seed, "--total_steps=%d" % a.peer_steps,
                "--budget_s=%g" % a.peer_budget_s, "--curve=" + os.path.join(logdir, "episodes.csv")]
        code = subprocess.call([sb3_py, os.path.join(ROOT, "bench", "peers", "sb3_ppo.py")] + args, cwd=ROOT)
        command = ".peer-venv-sb3/bin/python bench/peers/sb3_ppo.py " + " ".join(args)
    with open(os.path.join(logdir, "done.json"), "w") as f:
        json.dump({"exit": code, "wall_s": time.time() - t0, "command": command}, f)


def curve(contender, logdir):
    """(steps, training seconds, score over the contender's window, mean of the last 100 or None)."""
    if contender == "impala":
        rows = common.read_csv(os.path.join(logdir, "metrics.csv"))
        col = lambda k: np.array([float(r[k]) for r in rows])
        return col("frames"), col("time_s"), col("mean_return_20"), col("mean_return_100")
    if contender == "walle":
        rows = [r for r in ppo_halfcheetah.read_rows(logdir) if r["return_last10"] != ""]
        col = lambda k: np.array([float(r[k]) for r in rows])
        return col("steps"), col("time"), col("return_last10"), None
    rows = common.read_csv(os.path.join(logdir, "episodes.csv"))
    returns = np.array([float(r["return"]) for r in rows])
    mean_of = lambda n: np.array([returns[max(0, i + 1 - n):i + 1].mean() for i in range(len(returns))])
    return (np.array([float(r["steps"]) for r in rows]), np.array([float(r["time_s"]) for r in rows]),
            mean_of(WINDOW["sb3"]), mean_of(100))


def summarise(level, contender, seed, logdir, target):
    done = common.read_json(os.path.join(logdir, "done.json"))
    if done is None:
        return None
    steps, secs, score, last100 = curve(contender, logdir)
    if not len(steps):
        return dict(level=level, contender=contender, seed=seed, steps=0, exit=done["exit"], wall_s=done["wall_s"],
                    command=done["command"], curve=None)
    return {"level": level, "contender": contender, "seed": seed, "steps": int(steps[-1]), "score": float(score[-1]),
            "score_window": WINDOW[contender], "mean_return_100": float(last100[-1]) if last100 is not None else "",
            "best": float(score.max()), **to_target(steps, secs, score, target),
            "steps_per_s": float(steps[-1] / secs[-1]) if secs[-1] > 0 else "", "train_s": float(secs[-1]),
            "wall_s": done["wall_s"], "exit": done["exit"], "command": done["command"], "curve": (steps, secs, score)}


def to_target(steps, secs, score, target):
    """Steps and training seconds at the curve's first score at or above `target` ("" where none is)."""
    hit = np.flatnonzero(score >= target)
    return {"steps_to_target": int(steps[hit[0]]) if len(hit) else "",
            "time_to_target_s": float(secs[hit[0]]) if len(hit) else ""}


def target_of(a, level):
    return TASKS[level].target if a.target is None else a.target


def table(runs, a, level):
    target = target_of(a, level)
    lines = ["# %s: IMPALA beside WALL-E PPO and SB3 PPO, %d seed(s), same cores (%s)" % (
        level, len({r["seed"] for r in runs}), time.strftime("%Y-%m-%d", time.gmtime())), "",
        "Score: mean training return of the newest 20 (IMPALA) or 10 (PPOs) episodes; mean-100: of the "
        "newest 100. Time to %s: training seconds until the score first reached it." % f"{target:,.0f}", "",
        "| contender | seed | env steps | score | mean-100 | best | steps to %s | time to %s (s) | env steps/s | "
        "wall (s) | exit |" % (f"{target:,.0f}", f"{target:,.0f}"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, f="%.0f": f % x if x != "" else "-"
    for r in runs:
        if not r["steps"]:
            lines.append("| %s | %d | 0 | - | - | - | - | - | - | %.0f | %s |" % (
                r["contender"], r["seed"], r["wall_s"], r["exit"]))
            continue
        lines.append("| %s | %d | %s | %.0f | %s | %.0f | %s | %s | %s | %.0f | %s |" % (
            r["contender"], r["seed"], f"{r['steps']:,}", r["score"], fmt(r["mean_return_100"]), r["best"],
            fmt(r["steps_to_target"], "%d"), fmt(r["time_to_target_s"]), fmt(r["steps_per_s"]), r["wall_s"], r["exit"]))
    lines += ["", "| contender | seeds at %s | time to %s: median (min-max) s | steps to it: median |" % (
        f"{target:,.0f}", f"{target:,.0f}"), "|---|---|---|---|"]
    for c in CONTENDERS:
        mine = [r for r in runs if r["contender"] == c and r["steps"]]
        if not mine:
            continue
        hits = [r for r in mine if r["time_to_target_s"] != ""]
        t = [r["time_to_target_s"] for r in hits]
        lines.append("| %s | %d of %d | %s | %s |" % (
            LABELS[c], len(hits), len(mine),
            "%.0f (%.0f-%.0f)" % (np.median(t), min(t), max(t)) if t else "not reached",
            f"{int(np.median([r['steps_to_target'] for r in hits])):,}" if hits else "-"))
    commands = [r["command"] for r in runs if r["seed"] == runs[0]["seed"] and r.get("command")]
    if commands:
        lines += ["", "Commands (repository root): " + "; ".join("`%s`" % c for c in commands)]
    return lines


def plot(runs, out, level, target):
    fig, axes = common.subplots(1, 2, figsize=(12, 4.5))
    for i, c in enumerate(CONTENDERS):
        for j, r in enumerate(r for r in runs if r["contender"] == c and r.get("curve") is not None):
            steps, secs, score = r["curve"]
            for ax, x in zip(axes, (steps, secs)):
                ax.plot(x, score, color="C%d" % i, alpha=0.8, label=LABELS[c] if j == 0 else None)
    for ax, x in zip(axes, ("env steps", "training seconds")):
        ax.axhline(target, color="gray", ls="--", alpha=0.6)
        ax.set_xlabel(x)
        ax.set_ylabel("training return (mean of newest 20 / 10 episodes)")
        ax.grid(alpha=0.3)
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle("%s, one line per seed" % level)
    common.save_figure(fig, os.path.join(out, "mujoco_%s.png" % TASKS[level].short))


def suite(a, out):
    contenders = a.contenders or list(CONTENDERS)
    sb3_py = peers.SB3_PY
    if "sb3" in contenders and a.seeds:
        error = peers.ensure_peer("sb3")
        if error:
            raise SystemExit("mujoco: the SB3 peer could not be installed (%s); leave it out with "
                             "--contenders impala walle" % error)
    # runs finished in another checkout: their folders are not here, mujoco.csv keeps them
    kept = {(r["level"], r["contender"], int(r["seed"])) for r in common.read_csv(os.path.join(out, "mujoco.csv"))}
    for level in a.levels:
        for seed in a.seeds:
            for c in contenders:
                logdir = run_dir(out, level, c, seed)
                if not os.path.exists(logdir) and (level, c, seed) in kept:
                    print("[mujoco] %s %s seed %d: finished in another checkout, kept in mujoco.csv; not run again"
                          % (level, c, seed), flush=True)
                elif common.read_json(os.path.join(logdir, "done.json")) is None:
                    run_one(a, level, c, seed, logdir, sb3_py)
    lines, every = [], []
    for level in TASKS:  # every task with finished runs, so that one table holds them all
        runs = finished_runs(a, out, level)
        if runs:
            plot(runs, out, level, target_of(a, level))
            lines += ([""] if lines else []) + table(runs, a, level)
            every += runs
    if not every:
        raise SystemExit("mujoco: no finished runs under %s (give --seeds)" % os.path.join(out, "mujoco_runs"))
    write_csv(os.path.join(out, "mujoco.csv"), every)
    write_curves(os.path.join(out, "mujoco_curves.csv"), every)
    return lines


def finished_runs(a, out, level):
    """The task's finished runs, seed by seed: those with a folder here, then those kept without one."""
    folder = runs_dir(out, level)
    seeds = sorted({int(n.rsplit("_s", 1)[1]) for n in os.listdir(folder)}) if os.path.isdir(folder) else []
    runs = [summarise(level, c, seed, run_dir(out, level, c, seed), target_of(a, level))
            for seed in seeds for c in CONTENDERS]
    runs = [r for r in runs if r is not None]
    runs += kept_runs(out, level, {(r["contender"], r["seed"]) for r in runs}, target_of(a, level))
    return sorted(runs, key=lambda r: (r["seed"], CONTENDERS.index(r["contender"])))


def kept_runs(out, level, here, target):
    """The task's rows of <out>/mujoco.csv whose run, (contender, seed), is not in `here`, each with
    its curve from mujoco_curves.csv, from which the steps and seconds to `target` are read again
    (a row without curve points keeps the figures it was written with)."""
    points = collections.defaultdict(list)
    for p in common.read_csv(os.path.join(out, "mujoco_curves.csv")):
        if p["level"] == level:
            points[(p["contender"], int(p["seed"]))].append(p)
    kept = []
    for row in common.read_csv(os.path.join(out, "mujoco.csv")):
        key = (row["contender"], int(row["seed"]))
        if row["level"] != level or key in here:
            continue
        r = {k: (v if k in TEXT_FIELDS or v in (None, "") else int(float(v)) if k in INT_FIELDS else float(v))
             for k, v in row.items()}
        r.setdefault("command", "")
        r["curve"] = tuple(np.array([float(p[k]) for p in points[key]]) for k in ("steps", "train_s", "score")) \
            if points.get(key) else None
        if r["curve"] is not None:
            r.update(to_target(*r["curve"], target))
        kept.append(r)
    return kept


def write_curves(path, runs):
    """Every run's curve, since the run folders stay out of git."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["level", "contender", "seed", "steps", "train_s", "score"])
        for r in runs:
            if r.get("curve") is not None:
                w.writerows([r["level"], r["contender"], r["seed"], int(x), "%.1f" % t, "%.1f" % y]
                            for x, t, y in zip(*r["curve"]))


def write_csv(path, runs):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(runs)
