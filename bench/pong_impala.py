"""PongNoFrameskip-v4 with IMPALA (SimpleConvNetAgent unless --extra names another net) on a local cluster, for
a fixed frame budget, next to the raw env-stepping ceiling of the same cores
measured in the same run.

  .venv/bin/python bench/pong_impala.py --frames 2000000 --actors 2 --envs_per_actor 32

Phase 1 (ceiling): the physical limit of the cores at the run's frame size
(bench/ceiling.py: Python processes and ale-py's native vector env, random actions,
--ceiling_s seconds each; the higher one counts).
Phase 2 (training): 1 learner + `--actors` actor processes until --frames.
Writes bench/results/pong_impala.{csv,md,png}: the learning curve (every column
of the run's metrics.csv: frames, seconds, fps, mean returns, entropy, policy lag,
losses, gradient norm) and the ratio of median
end-to-end training fps to the ceiling, with the learner's own report of where
time went (the bottleneck). With --stop_at_return R the run stops at the first
progress line whose mean return of the last 20 games is >= R and reports the
training seconds and frames it took (time to threshold).
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
from bench import ceiling

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def expand_flagfiles(flags):
    """The flags with each --flagfile=PATH replaced by the flags in that file (as absl reads it)."""
    out = []
    for f in flags:
        if f.startswith("--flagfile="):
            with open(os.path.join(ROOT, f.split("=", 1)[1])) as fh:
                out += expand_flagfiles([ln.strip() for ln in fh if ln.strip().startswith("--")])
        else:
            out.append(f)
    return out


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="PongNoFrameskip-v4")
    p.add_argument("--frames", type=int, default=2_000_000)
    common.cluster_args(p, actors=2, envs_per_actor=32, batch_size=32, unroll_length=20)
    p.add_argument("--ceiling_s", type=float, default=20.0)
    p.add_argument("--base_port", type=int, default=18800)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stop_at_return", type=float, default=None,
                   help="stop when the mean return of the last 20 games reaches this (time to threshold)")
    p.add_argument("--tag", default="pong_impala")
    p.add_argument("--extra", action="append", default=[],
                   help="one more experiment.py flag, e.g. --extra=--epsilon=1e-5 (repeatable)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--run_dir", default=None,
                   help="the run's folder, kept afterwards (checkpoints, metrics.csv) so that a stopped run can go "
                        "on: the same command with --extra=--mode=train_w_load --extra=--load_model_url=<run_dir> "
                        "and a larger --frames; default: a temporary folder, removed at the end")
    return p.parse_args()


def run_flags(a):
    """experiment.py's flags for this run: defaults, then --extra's flagfiles (a recipe), then this
    run's own settings, then the other --extra. The queue's size and the net are defaults, not this
    run's settings: the queue sets the actors' policy lag, which a recipe chooses (configs/pong.flags
    keeps it at one batch), and configs/pong_resnet.flags names its net."""
    flagfiles = [e for e in a.extra if e.startswith("--flagfile=")]
    return ["--entropy_cost=0.0006", "--learning_rate=0.0006", "--gradients_clipping=40",
            "--queue_capacity=%d" % max(2 * a.batch_size, a.envs_per_actor),
            "--agent_name=SimpleConvNetAgent"] + flagfiles + [
        "--level_name=" + a.level] + common.cluster_flags(a) + [
        "--total_environment_frames=%d" % a.frames, "--log_every_s=10", "--seed=%d" % a.seed] + [
        e for e in a.extra if e not in flagfiles]


def last_flag(flags, name, default=None):
    """The value the run gets for --name: the last one of its flags, flagfiles expanded, as absl
    reads them; `default` where none is given."""
    return next((e.split("=", 1)[1] for e in reversed(expand_flagfiles(flags)) if e.startswith("--%s=" % name)),
                default)


def frame_size(flags):
    """The frame size the run will use: (--width, --height)."""
    return tuple(int(last_flag(flags, k, 84)) for k in ("width", "height"))


def threshold_row(logdir, target, games_in_flight):
    """The first metrics row whose mean return of the last 20 games is at or above target, or None.
    A resumed run (its time_s starts again) starts every env's game at once and the short, one-sided
    games end first, so until each of the `games_in_flight` restarted games could have ended the
    last 20 are not a fair sample: a Pong run resumed at 11.5 showed 19.45 on its first 16 games."""
    rows, counted_from = common.read_csv(os.path.join(logdir, "metrics.csv")), 0
    for prev, r in zip([None] + rows, rows):
        if prev is not None and float(r["time_s"]) < float(prev["time_s"]):  # the first row after a resume
            counted_from = int(r["episodes"]) + games_in_flight
        if int(r["episodes"]) >= counted_from and float(r["mean_return_20"]) >= target:
            return r
    return None


def this_part(rows):
    """(the rows this invocation wrote, the frame counter it resumed from: 0 for a fresh run). A
    resumed run appends to its metrics.csv, and its time_s starts again at the resume."""
    start = 0
    for i in range(1, len(rows)):
        if float(rows[i]["time_s"]) < float(rows[i - 1]["time_s"]):
            start = i
    return rows[start:], int(rows[start - 1]["frames"]) if start else 0


def train(a, flags, logdir):
    """Runs the cluster until its budget, --stop_at_return or Ctrl-C. Returns (the learner's exit
    code, the threshold row or None, whether Ctrl-C stopped it)."""
    hit, interrupted = None, False
    with LocalCluster(a.actors, a.base_port, flags, logdir) as cluster:
        try:
            while True:
                code = cluster.wait(timeout=2.0)
                if code is not None:
                    break
                hit = (threshold_row(logdir, a.stop_at_return, a.actors * a.envs_per_actor)
                       if a.stop_at_return is not None else None)
                if hit is not None:
                    print("mean return %.2f >= %g at %s frames, %.0f s: stopping" % (
                        float(hit["mean_return_20"]), a.stop_at_return, hit["frames"],
                        float(hit["time_s"])), flush=True)
                    break
        except KeyboardInterrupt:  # Ctrl-C: stop the run (it checkpoints) and report what it did
            print("interrupted: stopping the run, then writing what it measured", flush=True)
            interrupted = True
    if interrupted or hit is not None:
        code = cluster.learner.returncode
    return code, hit, interrupted


def command_line(a):
    return ("`.venv/bin/python bench/pong_impala.py %s--frames %d --actors %d --envs_per_actor %d "
            "--batch_size %d --unroll_length %d --seed %d%s%s`" % (
                "" if a.level == "PongNoFrameskip-v4" else "--level %s " % a.level,
                a.frames, a.actors, a.envs_per_actor, a.batch_size, a.unroll_length, a.seed,
                " --stop_at_return %g" % a.stop_at_return if a.stop_at_return is not None else "",
                "".join(" --extra=" + e for e in a.extra)))


def table(a, part, summary, limit, run):
    """The Markdown report's lines for `part`, the rows this invocation wrote (this_part); run holds
    median_fps, ratio, wall, hit, interrupted, agent and resumed_at."""
    lags = sorted(float(r["policy_lag"]) for r in part if r.get("policy_lag"))
    tb = summary["time_breakdown"]
    hit = run["hit"]
    share = lambda k: 100 * tb[k] / tb["elapsed_s"]  # noqa: E731
    return [
        "# %s, IMPALA %s, 1 learner + %d actors x %d envs (2-core CPU)" % (
            a.level, run["agent"], a.actors, a.envs_per_actor), "",
        "| figure | value |", "|---|---|",
        "| env ceiling, %d Python processes / native vector env with %d threads (random actions) | "
        "%.0f / %.0f frames/s |" % (os.cpu_count(), os.cpu_count(), limit["python"], limit["native"]),
        "| end-to-end training, median | %.0f frames/s |" % run["median_fps"],
        "| ratio to the higher ceiling (same run) | **%.2f** |" % run["ratio"],
        "| frames trained | %d%s in %.0f s (wall, with start-up %.0f s) |" % (
            summary["frames"] - run["resumed_at"], " (the run's counter from %d to %d)" % (
                run["resumed_at"], summary["frames"]) if run["resumed_at"] else "",
            summary["elapsed_s"], run["wall"]),
        "| final mean return (last 20 games) | %.2f |" % summary["mean_return_20"]] + (
        ["| time to mean return %g (training s%s / frames) | %s |" % (
            a.stop_at_return, " since the resume" if run["resumed_at"] else "",
            "%.0f s / %s" % (float(hit["time_s"]), hit["frames"]) if hit else
            "not reached in %d frames" % summary["frames"])] if a.stop_at_return is not None else []) + [
        "| learner: learning / publishing / waiting | %.0f%% / %.0f%% / %.0f%% |" % (
            share("learner_learn_s"), share("learner_publish_s"), share("learner_wait_s")),
        "| actors: env / inference / transfer | %.0f%% / %.0f%% / %.0f%% |" % (
            100 * tb["actor_env_share"], 100 * tb["actor_inference_share"], 100 * tb["actor_transfer_share"]),
        "| bottleneck | %s |" % tb["bottleneck"]] + (
        ["| actors' policy lag, median of the rows (weight versions behind) | %.1f |" % lags[len(lags) // 2]]
        if lags else []) + [""] + (
        ["Stopped by Ctrl-C at %d of %d frames." % (summary["frames"], a.frames), ""]
        if run["interrupted"] else []) + ["Command: " + command_line(a)]


def write_json(path, a, summary, limit, run):
    hit = run["hit"]
    with open(path, "w") as f:
        json.dump({"seed": a.seed, "ceiling_fps": limit["limit"], "ceiling_python_fps": limit["python"],
                   "ceiling_native_fps": limit["native"], "median_fps": run["median_fps"],
                   "ratio": run["ratio"], "frames": summary["frames"], "resumed_at_frames": run["resumed_at"],
                   "elapsed_s": summary["elapsed_s"],
                   "final_mean_return_20": summary["mean_return_20"], "threshold": a.stop_at_return,
                   "reached": hit is not None, "interrupted": run["interrupted"],
                   "time_to_threshold_s": float(hit["time_s"]) if hit else None,
                   "frames_to_threshold": int(hit["frames"]) if hit else None,
                   "bottleneck": summary["time_breakdown"]["bottleneck"]}, f, indent=2)


def plot(path, level, rows, ceiling_fps):
    fig, (ax1, ax2) = common.subplots(1, 2, figsize=(10, 3.8))
    xs = [int(r["frames"]) / 1e6 for r in rows]
    ax1.plot(xs, [float(r["mean_return_20"]) for r in rows])
    ax1.set_xlabel("frames (M)")
    ax1.set_ylabel("mean return, last 20 games")
    ax1.set_title(level)
    ax2.plot(xs, [float(r["fps"]) for r in rows], label="training fps")
    ax2.axhline(ceiling_fps, color="k", ls="--", lw=0.8, label="env ceiling")
    ax2.set_xlabel("frames (M)")
    ax2.set_ylabel("frames/s")
    ax2.legend()
    common.save_figure(fig, path)


def main():
    obey_ctrl_c()
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    flags = run_flags(a)
    screen = frame_size(flags)
    try:
        limit = ceiling.physical_limit(a.level, os.cpu_count(), a.ceiling_s, screen)
    except KeyboardInterrupt:  # before any training: nothing to report or keep
        print("\n[stopped] Ctrl-C while measuring the env-stepping ceiling; nothing was trained", flush=True)
        return 130
    print("ceiling at %dx%d: %d processes step %s at %.0f frames/s, the native vector env at %.0f"
          % (screen + (os.cpu_count(), a.level, limit["python"], limit["native"])), flush=True)

    logdir = a.run_dir or tempfile.mkdtemp(prefix="pong_bench_")
    t0 = time.time()
    code, hit, interrupted = train(a, flags, logdir)
    rows, summary, log = common.finished_run(logdir, keep=a.run_dir is not None)
    if code != 0 or not rows or summary is None:
        print("training failed (exit %s):\n%s" % (code, "\n".join(log.splitlines()[-25:])))
        return 1
    part, resumed_at = this_part(rows)
    fps = sorted(float(r["fps"]) for r in part[1:] or part)
    run = {"median_fps": fps[len(fps) // 2], "wall": time.time() - t0, "hit": hit, "interrupted": interrupted,
           "agent": last_flag(flags, "agent_name"), "resumed_at": resumed_at}
    run["ratio"] = run["median_fps"] / limit["limit"]

    # Every column of metrics.csv, so a run that stalls can be read afterwards (entropy, policy lag,
    # value loss, gradient norm, mean ratio) without its run folder, which is a temporary one.
    base = os.path.join(a.out, a.tag)
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = table(a, part, summary, limit, run)
    common.write_lines(base + ".md", lines)
    write_json(base + ".json", a, summary, limit, run)
    plot(base + ".png", a.level, rows, limit["limit"])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
