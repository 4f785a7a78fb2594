"""The Atari suite (`bench/run.py atari`): each game trained to --frames with configs/atari.flags,
one run per game and seed, against the published PPO scores at 40M frames where there are some
(bench/atari_scores.py); any of ale-py's NoFrameskip-v4 games runs.

    .venv/bin/python bench/run.py atari --games BreakoutNoFrameskip-v4 SeaquestNoFrameskip-v4 --seeds 1
    .venv/bin/python bench/run.py atari --games --seeds 1      # no game: only rebuild the table

Each run lives in <out>/atari_runs/<Game>_s<seed>/ (a normal run folder: options, checkpoints,
metrics.csv, logs, and the suite's machines.csv: the machine of each (re)start, noted under the
table where a run spans kinds of machine). A run that was cut off (Ctrl-C, a time limit, a
restart) is resumed from its newest checkpoint with --mode=train_w_load the next time the suite
is asked for it, and the frame count it resumed at (from the learner's log, which the suite
appends to) is shown in the table; a run that reached --frames is not run again, nor is one
that atari.csv keeps from another checkout (below). Ctrl-C still writes the table, the cut run's
row standing where it stopped. Score = the mean of the last 100 whole-game training returns
(metrics.csv's mean_return_100), read at 10M, 20M and 40M frames. Writes <out>/atari.md,
atari.csv and one curve per game (atari_<Game>.png); with the default --out, also
bench/results/atari_five.md (across_machines).

Run folders are not committed (checkpoints are large), so a fresh checkout of the repository has
the results folder without them. Each run's metrics.csv is therefore copied beside the table
(atari_<Game>_seed<N>_metrics.csv), and a run whose folder is not here keeps its row, read back
from atari.csv and that copy, instead of dropping out of the table.
"""
import csv
import difflib
import json
import os
import re
import shutil
import time

import numpy as np

from bench import atari_scores, common
from local_cluster import LocalCluster
from tools import plotcurve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = "configs/atari.flags"
MILESTONES = (10_000_000, 20_000_000, 40_000_000)
CSV_FIELDS = ["game", "seed", "frames", "return_last100", "train_seconds", "fps", "fps_ratio", "at_10M", "at_20M",
              "at_40M", "resumed_at", "extra_flags", "budget", "machines", "precision"]
KEPT_METRICS = "atari_%s_seed%d_metrics.csv"  # game, seed: the copy of a run's metrics.csv in the results folder
MACHINES = "machines.csv"  # in a run folder: the machine of each (re)start, since a run may span checkouts
PROGRESS_S = 300  # a line on the terminal this often: a run takes hours and its learner writes to its log


def short(level):
    """BreakoutNoFrameskip-v4 -> Breakout."""
    return level.split("NoFrameskip")[0].split("/")[-1].split("-v")[0]


def check_games(games):
    """Refuses, naming --games, an id that is not an Atari game under the published tables' protocol
    (NoFrameskip-v4 ids: the recipe's env settings are those of the v4 family), before any run starts."""
    from envs import factory  # gymnasium and ale-py, loaded only when games are asked for
    known = factory.atari_ids("*NoFrameskip-v4")  # sorted, so close matches come out in a stable order
    for game in games:
        if game in known:
            continue
        guess = short(game) + "NoFrameskip-v4"
        close = [guess] if guess in known else difflib.get_close_matches(game, known, n=2, cutoff=0.6)
        raise SystemExit("--games %s: not an Atari id of the published tables' protocol, '<Game>NoFrameskip-v4' "
                         "(%d games, e.g. BreakoutNoFrameskip-v4)%s" % (
                             game, len(known), "; did you mean %s?" % " or ".join(close) if close else ""))


def run_dir(out, level, seed):
    return os.path.join(out, "atari_runs", "%s_s%d" % (short(level), seed))


def run_state(logdir, frames):
    """'done' (reached `frames`), 'cut' (has a checkpoint to resume from) or 'new'."""
    summary = common.read_json(os.path.join(logdir, "summary.json"), {})
    if summary.get("frames", 0) >= frames:
        return "done"
    ckpts = os.path.join(logdir, "checkpoints")
    return "cut" if os.path.isdir(ckpts) and any(n.endswith(".index") for n in os.listdir(ckpts)) else "new"


def kept_done(out, suite_csv, logdir, matches, frames, asked):
    """True when a run that reached `frames` at that budget is kept in <out>/suite_csv (the row for
    which matches(row) holds) but its folder `logdir` is not here: it finished in another checkout
    (the module's doc) and is not run again. Asking it for other --recipe_extra flags is an error,
    as for a run whose folder is here (extra_flags)."""
    if os.path.exists(logdir):
        return False
    for row in common.read_csv(os.path.join(out, suite_csv)):
        if not matches(row) or not row.get("budget") or int(float(row["budget"])) != frames \
                or int(float(row["frames"])) < frames:
            continue
        if asked and " ".join(asked) != row.get("extra_flags", ""):
            raise SystemExit("--recipe_extra %s: %s keeps this run (%s) finished with %s; a finished run is not run "
                             "again (take its row out of that file for a new run)" % (
                                 " ".join(asked), os.path.join(out, suite_csv), os.path.basename(logdir),
                                 row.get("extra_flags") or "none"))
        print("[atari] %s: finished in another checkout, kept in %s; not run again" % (
            os.path.basename(logdir), suite_csv), flush=True)
        return True
    return False


def extra_flags(logdir, asked):
    """The flags a run takes after the recipe's: those it started with (extra_flags.json), which
    its resumes keep; a new run records `asked`. Asking a started run for others is an error."""
    path = os.path.join(logdir, "extra_flags.json")
    if os.path.exists(path):
        started = common.read_json(path, [])
        if asked and asked != started:
            raise SystemExit("--recipe_extra %s: %s started with %s; a resume keeps the flags a run started with "
                             "(move the folder aside for a new run)" % (" ".join(asked), logdir, " ".join(started)
                                                                         or "none"))
        return started
    os.makedirs(logdir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(list(asked), f)
    return list(asked)


def run_game(a, level, seed, logdir, extra):
    """Trains one (game, seed) in `logdir` to a.frames with the recipe and `extra` (extra_flags), starting
    it or resuming it; returns the learner's exit code (None when it was already done). Ctrl-C stops the
    cluster, which checkpoints, and propagates."""
    state = run_state(logdir, a.frames)
    if state == "done":
        return None
    if state == "cut":
        flags = ["--mode=train_w_load", "--load_model_url=" + logdir,
                 "--total_environment_frames=%d" % a.frames] + extra
    else:
        flags = ["--flagfile=" + os.path.join(ROOT, RECIPE), "--level_name=" + level, "--seed=%d" % seed,
                 "--total_environment_frames=%d" % a.frames] + extra
    print("[atari] %s seed %d: %s" % (short(level), seed, "resuming" if state == "cut" else "starting"), flush=True)
    os.makedirs(os.path.join(logdir, "logs"), exist_ok=True)
    record_machine(logdir)
    with open(os.path.join(logdir, "logs", "learner.log"), "a") as log:  # a resume adds to it
        cluster = LocalCluster(a.actors, a.base_port, flags, logdir, learner_stdout=log)
        with cluster:
            code = cluster.wait(timeout=PROGRESS_S)
            while code is None:
                print(progress(logdir, a.frames), flush=True)
                code = cluster.wait(timeout=PROGRESS_S)
    return code


def progress(logdir, frames):
    """One line on where a run stands: its frames against the budget, the frames/s since this
    (re)start, the time that leaves, and the mean of the last 100 games."""
    rows = common.read_csv(os.path.join(logdir, "metrics.csv"))
    name = os.path.basename(logdir)
    times = [float(r["time_s"]) for r in rows]
    start = max([i for i in range(1, len(rows)) if times[i] < times[i - 1]], default=0)  # time_s restarts
    if len(rows) - start < 2:
        return "[atari] %s: starting (no metrics rows since the (re)start yet)" % name
    first, last = rows[start], rows[-1]
    done = float(last["frames"])
    rate = (done - float(first["frames"])) / max(times[-1] - times[start], 1e-9)
    left = "%.1f h to go" % ((frames - done) / rate / 3600) if rate > 0 else "no frames yet"
    return "[atari] %s: %.2fM of %.0fM frames (%.0f %%), %.0f frames/s since the (re)start, about %s; mean of the " \
           "last 100 games %s" % (name, done / 1e6, frames / 1e6, 100 * done / frames, rate, left,
                                 _cell(float(last.get("mean_return_100") or "nan")))


def curve(rows):
    """(frames, training seconds, score) of metrics.csv rows; a resume's clock continues the one before."""
    frames = np.array([float(r["frames"]) for r in rows])
    times = plotcurve.stitched(np.array([float(r["time_s"]) for r in rows]))
    score = np.array([float(r.get("mean_return_100") or r["mean_return_20"]) for r in rows])
    return frames, times, score


def summarise(level, seed, logdir, ceiling_fps):
    """The table's figures of one run folder, or None before its first metrics row."""
    rows = common.read_csv(os.path.join(logdir, "metrics.csv"))
    if not rows:
        return None
    frames, times, score = curve(rows)
    fps = frames[-1] / times[-1] if times[-1] > 0 else float("nan")
    extra = common.read_json(os.path.join(logdir, "extra_flags.json"), [])
    log = common.log_text(logdir)  # the suite appends every (re)start to it
    budget = common.read_json(os.path.join(logdir, "options.json"), {}).get("total_environment_frames")
    return {"budget": budget, "game": short(level), "seed": seed, "frames": int(frames[-1]),
            "return_last100": float(score[-1]),
            "train_seconds": float(times[-1]), "fps": fps, "fps_ratio": fps / ceiling_fps if ceiling_fps else "",
            "at_10M": plotcurve.score_at(frames, score, MILESTONES[0]),
            "at_20M": plotcurve.score_at(frames, score, MILESTONES[1]),
            "at_40M": plotcurve.score_at(frames, score, MILESTONES[2]),
            "resumed_at": " ".join(resumed_at(log)),
            "updates": int(rows[-1]["updates"]), "extra": extra, "extra_flags": " ".join(extra),
            "machines": machines(logdir), "precision": precision(log), "curve": (frames, times, score)}


def restore(row, metrics_path):
    """A run's figures from what the results folder keeps of it, for a run whose folder is not here:
    its CSV row (a table's row, as written) and the copy of its metrics.csv for the curve (None
    where there is no copy: the run keeps its row but draws no line)."""
    def number(key):
        value = row.get(key)
        return float(value) if value not in (None, "") else float("nan")
    text = ("game", "variant", "resumed_at", "extra_flags", "machines", "precision")
    r = {key: number(key) for key in row if key not in text}
    r.update({key: row[key] for key in ("game", "variant") if key in row})
    extra = (row.get("extra_flags") or "").split()
    rows = common.read_csv(metrics_path)
    r.update(seed=int(row["seed"]), frames=int(float(row["frames"])), resumed_at=row.get("resumed_at") or "",
             machines=row.get("machines") or "", precision=row.get("precision") or "",
             budget=int(r["budget"]) if np.isfinite(r.get("budget", float("nan"))) else None,
             fps_ratio=r["fps_ratio"] if np.isfinite(r.get("fps_ratio", float("nan"))) else "",
             extra=extra, extra_flags=" ".join(extra), curve=curve(rows) if rows else None)
    return r


def with_kept(out, suite_csv, kept_metrics, present, key_of):
    """The runs of a suite's table (see the module's doc): `present`, (key, run folder, figures) of
    each run folder here, whose metrics.csv is copied to <out>/kept_metrics % key; then the rows of
    <out>/suite_csv whose key (key_of(row)) has no folder here, restored from that CSV and copy."""
    kept = {key_of(row): row for row in common.read_csv(os.path.join(out, suite_csv))}
    for key, logdir, _ in present:
        shutil.copyfile(os.path.join(logdir, "metrics.csv"), os.path.join(out, kept_metrics % key))
        kept.pop(key, None)
    return [r for _, _, r in present] + [restore(row, os.path.join(out, kept_metrics % key))
                                         for key, row in kept.items()]


def resumed_at(text):
    """The frame counts the run was resumed at, as its learner log `text` says."""
    return re.findall(r"\[learner 0\] resumed from \S+ at (\d+) frames", text)


def precision(text):
    """The precisions the learner chose with --compute_dtype=auto, as its log `text` says, one per
    change and joined by " then " ("" where the run named its precision): a run resumed on another
    kind of machine may choose differently."""
    chosen = re.findall(r"\[learner 0\] compute dtype (\w+) \(--compute_dtype=auto", text)
    return " then ".join(c for i, c in enumerate(chosen) if i == 0 or c != chosen[i - 1])


def record_machine(logdir):
    """Appends this machine to the run folder's MACHINES, with the frames the run (re)starts from."""
    rows = common.read_csv(os.path.join(logdir, "metrics.csv"))
    path = os.path.join(logdir, MACHINES)
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, ["from_frames", "cpu", "cores", "date"])
        if new:
            w.writeheader()
        w.writerow({"from_frames": rows[-1]["frames"] if rows else 0, "cpu": common.cpu_model(),
                    "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


def machines(logdir):
    """Where a run trained, when that was more than one kind of machine ("" otherwise, and for a run
    started before MACHINES was kept): each change of CPU or core count with the frames it came at.
    Such a run's training time and frames/s add up its machines' different rates."""
    rows = common.read_csv(os.path.join(logdir, MACHINES))
    changes = rows[:1] + [r for before, r in zip(rows, rows[1:]) if (r["cpu"], r["cores"]) != (before["cpu"],
                                                                                               before["cores"])]
    if len(changes) < 2:  # every (re)start on one kind of machine
        return ""
    return ", ".join("%s (%s cores) from %.1fM" % (r["cpu"], r["cores"], int(float(r["from_frames"])) / 1e6)
                     for r in changes)


def mixed_machines(runs, name):
    """A note under a table for its runs (name(run) names one) that trained on more than one kind of
    machine (machines), or [] where there is none."""
    spanned = ["%s: %s" % (name(r), r["machines"]) for r in runs if r.get("machines")]
    return ["", "Trained on more than one kind of machine, so training time and frames/s mix their rates: "
            + "; ".join(spanned) + "."] if spanned else []


def chosen_precisions(runs, name):
    """A note under a table on what --compute_dtype=auto (the recipes' setting) chose in each run's
    learner (precision), or [] where no run chose: a run's speed depends on it."""
    chosen = ["%s: %s" % (name(r), r["precision"]) for r in runs if r.get("precision")]
    return ["", "The learner's precision as --compute_dtype=auto chose it: " + "; ".join(chosen) + "."] if chosen else []


def ceiling_fps(logdir, level, screen):
    """The env ceiling at the run's frame size (bench/ceiling.py), measured once per run folder."""
    from bench import ceiling
    path = os.path.join(logdir, "ceiling.json")
    if not os.path.exists(path):
        os.makedirs(logdir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(ceiling.physical_limit(level, os.cpu_count(), 10.0, screen), f)
    return common.read_json(path, {})["limit"]


def recipe_screen(extra=()):
    """(width, height) of the frames: the recipe's, or those of the flags after it."""
    lines = [ln.strip() for ln in open(os.path.join(ROOT, RECIPE)) if ln.strip().startswith("--")] + list(extra)
    get = {ln.split("=", 1)[0][2:]: ln.split("=", 1)[1] for ln in lines if "=" in ln}
    return int(get.get("width", 84)), int(get.get("height", 84))


def _cell(x, fmt="%.0f"):
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else fmt % x


def budget_score(at_40m, last, reached):
    """The score a run is judged by: at the budget, the milestone row (the last at or before 40M
    frames: the run's final row has trained on a few frames past it, which the published scores did
    not), as the table's "at 40M" column shows it; a run not there yet, its last row."""
    at_40m = float(at_40m) if at_40m not in (None, "") else float("nan")
    return at_40m if reached and np.isfinite(at_40m) else float(last)


def table(runs, frames):
    """The Markdown lines: one row per run, then the median human-normalised scores over the runs
    of games with published PPO scores (the others' rows show "-" where a figure is not known)."""
    lines = ["| game | seed | frames | at 10M | at 20M | at 40M | baselines PPO | CleanRL PPO | HNS ours / baselines "
             "| training time | frames/s (x ceiling) | resumed after | beyond the recipe |", "|---" * 13 + "|"]
    ours, theirs, unpublished = [], [], set()
    for r in runs:
        base, clean = atari_scores.published(r["game"])
        final = r["at_40M"] if r["frames"] >= frames else float("nan")
        score = budget_score(r["at_40M"], r["return_last100"], r["frames"] >= frames)
        hns, base_hns = (atari_scores.human_normalised(r["game"], x) for x in (score, base))
        if base_hns is None:
            unpublished.add(r["game"])
        else:
            ours.append(hns)
            theirs.append(base_hns)
        lines.append("| %s | %d | %.1fM | %s | %s | %s | %s | %s | %s / %s | %.0f min | %.0f (%s) | %s | %s |" % (
            r["game"], r["seed"], r["frames"] / 1e6, _cell(r["at_10M"]), _cell(r["at_20M"]), _cell(final),
            _cell(base), _cell(clean), _cell(hns, "%.2f"), _cell(base_hns, "%.2f"), r["train_seconds"] / 60,
            r["fps"], _cell(r["fps_ratio"], "%.2f") if r["fps_ratio"] != "" else "-", r["resumed_at"] or "-",
            r["extra_flags"] or "-"))
    if ours:
        lines += ["", "Median human-normalised score over these runs (each at 40M frames, or at its last row short "
                  "of them): ours %.2f, baselines PPO %.2f at 40M frames." % (float(np.median(ours)), float(np.median(theirs)))]
    lines += mixed_machines(runs, lambda r: "%s seed %d" % (r["game"], r["seed"]))
    lines += chosen_precisions(runs, lambda r: "%s seed %d" % (r["game"], r["seed"]))
    if unpublished:
        lines += ["", "No published PPO score at 40M frames (baselines, CleanRL) for %s: left out of the median."
                  % ", ".join(sorted(unpublished))]
    return lines


# The five games of the PPO paper's Atari set that CleanRL's docs tabulate; their median is the suite's figure.
FIVE = ("BeamRider", "Breakout", "Qbert", "Seaquest", "SpaceInvaders")


def across_machines(results_root, frames):
    """The Markdown lines of the five games' standing over every machine's atari.csv under
    results_root. A 40M-frame run takes a 2-core machine more than two hours, so the five come
    from runs on different machines: each row names its machine, and the median counts each
    game once (the mean of its runs that reached `frames`), naming the games not there yet."""
    lines = ["| game | machine | seed | frames | score | HNS ours / baselines | training time | frames/s "
             "| beyond the recipe |", "|---" * 9 + "|"]
    finished = {}
    last = {}
    for machine in sorted(os.listdir(results_root)):
        cpu = common.read_json(os.path.join(results_root, machine, "machine.json"), {}).get("cpu", machine)
        for row in common.read_csv(os.path.join(results_root, machine, "atari.csv")):
            if row["game"] not in FIVE:
                continue
            game, done = row["game"], int(row["frames"]) >= frames
            score = budget_score(row.get("at_40M"), row["return_last100"], done and frames == MILESTONES[-1])
            base = atari_scores.published(game)[0]
            if done:
                finished.setdefault(game, []).append(atari_scores.human_normalised(game, score))
            last[game] = max(last.get(game, 0), int(row["frames"]))
            lines.append("| %s | %s | %s | %.1fM%s | %.0f | %.2f / %.2f | %.0f min | %.0f | %s |" % (
                game, cpu, row["seed"], int(row["frames"]) / 1e6, "" if done else " (not at the budget)", score,
                atari_scores.human_normalised(game, score), atari_scores.human_normalised(game, base),
                float(row["train_seconds"]) / 60,
                float(row["fps"]), row["extra_flags"] or "-"))
    missing = ["%s (%s)" % (g, "%.1fM frames" % (last[g] / 1e6) if g in last else "not run")
               for g in FIVE if g not in finished]
    if finished:
        ours = [float(np.mean(finished[g])) for g in sorted(finished)]
        theirs = [atari_scores.human_normalised(g, atari_scores.published(g)[0]) for g in sorted(finished)]
        lines += ["", "Median human-normalised score of the %d of the five games at %s frames: ours %.2f, baselines "
                  "PPO %.2f." % (len(ours), "{:,}".format(frames), float(np.median(ours)), float(np.median(theirs)))]
    lines += ["", "Not at %s frames yet: %s." % ("{:,}".format(frames), ", ".join(missing) if missing else "none")]
    return lines


def write_five(results_root, frames):
    """<results_root>/atari_five.md: across_machines with its title and date."""
    lines = ["# The five Atari games at %s frames, over the machines that ran them" % "{:,}".format(frames), "",
             "Score: mean of the last 100 whole-game training returns at the run's last row at or before 40M "
             "frames (as the published scores, no frame past the budget); each machine's own table, with curves "
             "and the commands, is its atari.md.", ""]
    lines += across_machines(results_root, frames) + ["", "![the five games' curves](atari_five.png)", "",
                                                      "Date: " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())]
    common.write_lines(os.path.join(results_root, "atari_five.md"), lines)
    plot_five(results_root, frames)


def plot_five(results_root, frames):
    """<results_root>/atari_five.png: one panel per game of FIVE, a line per machine and seed from the
    metrics copies the machines' folders keep (KEPT_METRICS), beside baselines PPO's score at 40M."""
    fig, axes = common.subplots(1, len(FIVE), figsize=(3.0 * len(FIVE), 2.6))
    for ax, game in zip(axes, FIVE):
        for machine in sorted(os.listdir(results_root)):
            for seed in range(1, 10):
                rows = common.read_csv(os.path.join(results_root, machine, KEPT_METRICS % (game, seed)))
                if rows:
                    f, _, score = curve(rows)
                    ax.plot(f / 1e6, score, lw=1, color="C%d" % (seed - 1), label="seed %d" % seed)
        base = atari_scores.published(game)[0]
        if base is not None:
            ax.axhline(base, color="k", ls="--", lw=1, label="baselines PPO")
        ax.set_title(game, fontsize=10)
        ax.set_xlim(0, frames / 1e6)
        ax.set_xlabel("frames (M)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean of the last 100 games", fontsize=8)
    axes[-1].legend(fontsize=6, loc="lower right")
    common.save_figure(fig, os.path.join(results_root, "atari_five.png"))


def plot(level, runs, frames, out):
    fig, ax = common.subplots(1, 1, figsize=(6, 4))
    for r in (r for r in runs if r["curve"] is not None):
        f, _, score = r["curve"]
        ax.plot(f / 1e6, score, label="seed %d" % r["seed"])
        for x in r["resumed_at"].split():
            ax.axvline(int(x) / 1e6, color="gray", ls=":", alpha=0.7)
    for score, color, who in zip(atari_scores.published(short(level)), ("C3", "C4"), ("baselines", "CleanRL")):
        if score is not None:
            ax.axhline(score, color=color, ls="--", alpha=0.7, label="%s PPO at 40M" % who)
    ax.set_xlabel("frames (M); dotted: resumed there")
    ax.set_ylabel("mean of the last 100 games")
    ax.set_xlim(0, frames / 1e6)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(short(level))
    common.save_figure(fig, os.path.join(out, "atari_%s.png" % short(level)))


def collect(out):
    """Every run of the table: the run folders under <out>/atari_runs, and the runs of the atari.csv
    there whose folders are not here (with_kept), in game and seed order."""
    runs_root = os.path.join(out, "atari_runs")
    names = sorted(os.listdir(runs_root)) if os.path.isdir(runs_root) else []
    present = []
    for name in names:
        match = re.fullmatch(r"(\w+)_s(\d+)", name)
        if match is None:  # not a run folder of the suite's (run_dir): a user's own, left alone
            continue
        game, seed = match.group(1), int(match.group(2))
        logdir = os.path.join(runs_root, name)
        r = summarise("%sNoFrameskip-v4" % game, seed, logdir,
                      common.read_json(os.path.join(logdir, "ceiling.json"), {}).get("limit"))
        if r is not None:
            present.append(((game, seed), logdir, r))
    runs = with_kept(out, "atari.csv", KEPT_METRICS, present, lambda row: (row["game"], int(row["seed"])))
    return sorted(runs, key=lambda r: (r["game"], r["seed"]))


def suite(a, out):
    """Runs (or resumes) each game and seed to a.frames, then the table of every run there (collect);
    Ctrl-C still writes the table (common.train_then_table)."""
    return common.train_then_table(lambda: train(a, out), lambda: report(a, out))


def train(a, out):
    """Runs (or resumes) each game and seed to a.frames, one after the other."""
    check_games(a.games)
    for level in a.games:
        for seed in a.seeds:
            logdir = run_dir(out, level, seed)
            if kept_done(out, "atari.csv", logdir, lambda row: (row["game"], int(row["seed"])) == (short(level), seed),
                         a.frames, a.recipe_extra):
                continue
            extra = extra_flags(logdir, a.recipe_extra)
            ceiling_fps(logdir, level, recipe_screen(extra))
            code = run_game(a, level, seed, logdir, extra)
            if code not in (None, 0):
                print("[atari] %s seed %d: the learner exited with %s" % (short(level), seed, code), flush=True)


def report(a, out):
    """The table of every run under `out` (collect), its atari.csv and curves, and atari_five.md."""
    runs = collect(out)
    csv_rows = [{k: r[k] for k in CSV_FIELDS} for r in runs]
    with open(os.path.join(out, "atari.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS)
        w.writeheader()
        w.writerows(csv_rows)
    for level in sorted({"%sNoFrameskip-v4" % r["game"] for r in runs}):
        plot(level, [r for r in runs if r["game"] == short(level)], a.frames, out)
    if a.out is None:  # out is bench/results/<machine>: the five-game file sits beside the machines' folders
        write_five(os.path.dirname(out), a.frames)
    return ["# Atari at %s frames, %s, %d cores" % ("{:,}".format(a.frames), RECIPE, os.cpu_count()), "",
            "Score: mean of the last 100 whole-game training returns. HNS: human-normalised score. Published "
            "figures: OpenAI baselines' and CleanRL's PPO at 40M frames (CleanRL's docs). Training time counts from the learner being ready; "
            "a resumed run's time leaves out the stop.", ""] + table(runs, a.frames) + [
        "", command("atari", a, runs)]


def command(suite, a, runs, invoked_variants=()):
    """The table's "Command:" line: the command lines that made its runs, one per frame budget and
    recipe flags, since the table holds every run folder there, not only those this invocation ran;
    with no run yet, the invocation's own line (the replay suite's `invoked_variants` with it)."""
    groups = {}
    for r in runs:
        extra = tuple(f for f in r["extra"] if not f.startswith("--replay_parameters="))
        games, seeds, variants = groups.setdefault((r["budget"] or a.frames, extra), (set(), set(), []))
        games.add("%sNoFrameskip-v4" % r["game"])
        seeds.add(r["seed"])
        # The replay suite runs every variant unless told: without its --variants the line would
        # start variants these runs never had (runs come in the suite's variant order).
        if r.get("variant") and r["variant"] not in variants:
            variants.append(r["variant"])
    if not groups:
        groups[(a.frames, tuple(a.recipe_extra))] = (set(a.games), set(a.seeds), list(invoked_variants))
    out = " --out %s" % a.out if getattr(a, "out", None) else ""  # a resume must find the same folder
    lines = [".venv/bin/python bench/run.py %s --games %s --frames %d --seeds %s%s%s%s" % (
        suite, " ".join(sorted(games)), frames, " ".join(map(str, sorted(seeds))),
        " --variants %s" % " ".join(variants) if variants else "",
        " --recipe_extra='%s'" % " ".join(extra) if extra else "", out)
        for (frames, extra), (games, seeds, variants) in sorted(groups.items())]
    return "Command%s: %s" % ("s" if len(lines) > 1 else "", "; ".join("`%s`" % line for line in lines))
