"""The PyTorch V-trace platform's replay claim on Atari (`bench/run.py atari_replay`): with
configs/atari.flags, at the same frame budget, queue only against queue + uniform replay against
queue + elite replay; and uniform and elite replay again with --clip_ratio_to=fresh_batch_start, which
anchors the replayed steps' PPO ratio to the actors' policy (standard_fresh_clip, elite_fresh_clip;
docs/replay.md#measured).

    .venv/bin/python bench/run.py atari_replay --games BreakoutNoFrameskip-v4 SeaquestNoFrameskip-v4 \\
        --frames 10000000 --seeds 1 --recipe_extra=--compute_dtype=float32
    .venv/bin/python bench/run.py atari_replay --games --seeds    # no game: only rebuild the table
    .venv/bin/python bench/run.py atari_replay --games SeaquestNoFrameskip-v4 --seeds 1 --variants elite

The replay variants take half of every batch from a buffer of 1,000 unrolls (the platform's own
example size) and half from the actors, so the learner trains on twice the samples per env frame.
Elite replay uses the platform's example settings (its README): ln_norm distance between
the stored and the current policy's logits, lambda_batch_multiplier 6, alfa_annealing_factor 2.0.

Each run lives in <out>/replay_runs/<Game>_<variant>_s<seed>/ and is started, resumed when cut off,
or left alone when done, as the Atari suite's runs are (bench/atari.py). A resume starts with empty
replay buffers that refill from the actors' unrolls: replay draws start again once a buffer holds a
batch, and it is full after 1,000 new unrolls (about 128K env frames, 1.3 % of a 10M-frame run).
--checkpoint_replay would carry the buffer over, at the cost of a buffer file of several MB
(docs/replay.md) in every cut run's folder, which is committed to move the run to another
machine; the suite leaves it off. Writes <out>/atari_replay.md,
atari_replay.csv and one figure per game with every variant's curve (atari_replay_<Game>.png), and
keeps each run's metrics.csv beside them, so that runs made in other checkouts stay in the table
(atari_replay_<Game>_<variant>_seed<N>_metrics.csv; bench/atari.py's doc says why). Where <out> is
a machine's folder in bench/results, it also writes bench/results/atari_replay_seeds.md with a figure
per game: every machine's runs, and the verdict over all their seeds (write_seeds).
"""
import csv
import json
import os
import re
import time

import numpy as np

from bench import atari, common

QUEUE_HALF = {"type": "queue", "capacity": 1, "sample_ratio": 0.5}
CAPACITY = 1000
STANDARD = [QUEUE_HALF, {"type": "standard", "capacity": CAPACITY, "sample_ratio": 0.5, "compress": True}]
ELITE = [QUEUE_HALF, {"type": "custom", "capacity": CAPACITY, "sample_ratio": 0.5, "compress": True,
                      "sample_strategy": "elite_sampling", "dist_function": "ln_norm",
                      "lambda_batch_multiplier": 6, "alfa_annealing_factor": 2.0}]
VARIANTS = {  # name: (what it is, --replay_parameters, the variant's own flags after the recipe's)
    "queue": ("queue only (no replay)", [{"type": "queue", "capacity": 1, "sample_ratio": 1}], []),
    "standard": ("queue + uniform replay, half of each batch", STANDARD, []),
    "elite": ("queue + elite replay, half of each batch (ln_norm, lambda 6, alfa 2.0)", ELITE, []),
    # The recipe's batch_start trust region restarts on every draw of a replayed unroll, the likely
    # cause of uniform replay's collapse (replay_levers.md); this variant anchors replayed steps to mu.
    "standard_fresh_clip": ("queue + uniform replay as standard, the replayed steps' PPO ratio against the "
                            "actors' policy (--clip_ratio_to=fresh_batch_start)", STANDARD,
                            ["--clip_ratio_to=fresh_batch_start"]),
    # Elite replay under the recipe's clip also ran into a near-zero entropy on a Breakout seed
    # (atari_replay_seeds.md): the same anchor, for elite replay.
    "elite_fresh_clip": ("queue + elite replay as elite, the replayed steps' PPO ratio against the actors' policy "
                         "(--clip_ratio_to=fresh_batch_start)", ELITE, ["--clip_ratio_to=fresh_batch_start"]),
}
CSV_FIELDS = ["game", "variant", "seed", "frames", "return_last100", "best_last100", "train_seconds", "fps",
              "learner_samples_per_s", "resumed_at", "extra_flags", "budget", "machines", "precision"]
RESULTS_ROOT = os.path.join(atari.ROOT, "bench", "results")  # where each machine has its folder
KEPT_METRICS = "atari_replay_%s_%s_seed%d_metrics.csv"  # game, variant, seed (bench/atari.py's module doc)


def run_dir(out, level, variant, seed):
    return os.path.join(out, "replay_runs", "%s_%s_s%d" % (atari.short(level), variant, seed))


def summarise(logdir, game, variant, seed):
    """The table's figures of one run folder, or None before its first metrics row."""
    r = atari.summarise("%sNoFrameskip-v4" % game, seed, logdir, None)
    if r is None:
        return None
    options = common.read_json(os.path.join(logdir, "options.json"), {})
    samples = r["updates"] * options.get("batch_size", 32) * options.get("unroll_length", 32)
    _, _, score = r["curve"]
    # The variant, not the flag, names its replay settings and own flags: "extra" keeps what was asked
    # with --recipe_extra, which the Command line and a kept run's check (atari.kept_done) compare.
    own = VARIANTS[variant][2]
    extra = [f for f in r["extra"] if f not in own]
    r.update(variant=variant, best_last100=float(np.nanmax(score)), extra=extra,
             learner_samples_per_s=samples / r["train_seconds"] if r["train_seconds"] > 0 else float("nan"),
             extra_flags=" ".join(f for f in extra if not f.startswith("--replay_parameters=")))
    return r


def final_scores(runs):
    """Each variant's final scores (the mean of the last 100 games at each run's end) over `runs`."""
    return {v: [r["return_last100"] for r in runs if r["variant"] == v] for v in VARIANTS}


def verdict(game, runs):
    """Sentences on elite replay against uniform replay and the queue, and on the fresh clip's uniform
    replay where it has runs, each only beyond the seeds' spread."""
    final = final_scores(runs)
    against = [v for v in ("standard", "queue") if final[v]]
    if final["elite"] and against:
        words = [compare(game, "elite replay", final, "elite", against)]
    else:
        words = ["%s: elite replay has no run yet, or nothing to compare it with." % game]
    if not final["standard"]:
        words.append("Uniform replay has no run in this table.")
    if final["standard_fresh_clip"] and final["standard"]:
        words.append(compare(game, "uniform replay with the fresh clip", final, "standard_fresh_clip",
                             ("standard", "queue")))
    if final["elite_fresh_clip"]:
        words.append(compare(game, "elite replay with the fresh clip", final, "elite_fresh_clip",
                             ("standard_fresh_clip", "elite", "queue")))
    return " ".join(words)


def compare(game, name, final, variant, others):
    """One sentence on `variant`'s final scores against each of `others`' with runs, beyond the spread:
    a comparison needs two seeds on each side, so one with a single seed is named as not called."""
    if len(final[variant]) < 2:
        return ("%s: one seed of %s, so the run-to-run spread is not measured and no difference can be "
                "called beyond it." % (game, name))
    words, uncalled = [], []
    lo, hi = min(final[variant]), max(final[variant])
    for other in others:
        if not final[other]:
            continue
        if len(final[other]) < 2:
            uncalled.append("not compared with %s (one seed)" % other)
        elif lo > max(final[other]):
            words.append("above %s on every seed" % other)
        elif hi < min(final[other]):
            words.append("below %s on every seed" % other)
        else:
            words.append("within the seeds' spread of %s" % other)
    return "%s: %s is %s." % (game, name, " and ".join(words + uncalled))


def table(runs):
    lines = ["| game | variant | seed | frames | score at the end | best | training time | env frames/s | "
             "learner samples/s | resumed after |", "|---" * 10 + "|"]
    for r in runs:
        lines.append("| %s | %s | %d | %.1fM | %.1f | %.1f | %.0f min | %.0f | %.0f | %s |" % (
            r["game"], r["variant"], r["seed"], r["frames"] / 1e6, r["return_last100"], r["best_last100"],
            r["train_seconds"] / 60, r["fps"], r["learner_samples_per_s"], r["resumed_at"] or "-"))
    def name(r):
        return "%s %s seed %d" % (r["game"], r["variant"], r["seed"])
    return lines + atari.mixed_machines(runs, name) + atari.chosen_precisions(runs, name)


def plot(game, runs, frames, path):
    """One figure of `game`'s runs at `path`: a colour per variant, a line style per seed."""
    fig, ax = common.subplots(1, 1, figsize=(6, 4))
    for r in (r for r in runs if r["curve"] is not None):
        f, _, score = r["curve"]
        ax.plot(f / 1e6, score, color="C%d" % list(VARIANTS).index(r["variant"]),
                ls=["-", "--", ":", "-."][(r["seed"] - 1) % 4], label="%s, seed %d" % (r["variant"], r["seed"]))
    ax.set_xlabel("env frames (M)")
    ax.set_ylabel("mean of the last 100 games")
    ax.set_xlim(0, frames / 1e6)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("%s: replay variants, %s" % (game, atari.RECIPE))
    common.save_figure(fig, path)


def across_machines(results_root, frames):
    """Every machine folder's runs under results_root (collect), each with the folder's name: one
    variant's 10M-frame run takes a 2-core machine 30-190 minutes, so a game's seeds come from
    runs on different machines. Returns (all of them, those the verdict pools: at `frames`,
    with no flag beyond the recipe's but the precision, which changes speed and not the recipe)."""
    runs = []
    for name in sorted(os.listdir(results_root)):
        if os.path.isdir(os.path.join(results_root, name)):
            runs += [dict(r, folder=name) for r in collect(os.path.join(results_root, name))]
    runs.sort(key=lambda r: (r["game"], list(VARIANTS).index(r["variant"]), r["seed"], r["folder"]))
    pooled = [r for r in runs if r["frames"] >= frames
              and not [f for f in r["extra"] if not f.startswith(("--replay_parameters=", "--compute_dtype="))]]
    return runs, pooled


def precision_of(run):
    """The learner's precision: what --compute_dtype=auto chose, else what the run's flags named."""
    named = [f.split("=", 1)[1] for f in run["extra"] if f.startswith("--compute_dtype=")]
    return run["precision"] or (named[-1] if named else "not recorded")


def spreads(game, pooled):
    """A line naming each variant's final scores over `game`'s pooled seeds and their spread."""
    words = []
    for variant, scores in final_scores(pooled).items():
        scores = sorted(scores)
        if scores:
            words.append("%s %s%s" % (variant, ", ".join("%.1f" % x for x in scores),
                                      " (spread %.1f)" % (scores[-1] - scores[0]) if len(scores) > 1 else ""))
    return "%s, the seeds at the budget: %s." % (game, "; ".join(words))


def write_seeds(results_root, frames):
    """<results_root>/atari_replay_seeds.md and a figure per game (atari_replay_seeds_<Game>.png):
    the study's runs over every machine, and the verdict over all their seeds."""
    runs, pooled = across_machines(results_root, frames)
    lines = ["# Replay on Atari at %s frames, the seeds of every machine" % "{:,}".format(frames), "",
             "Score: mean of the last 100 whole-game training returns. Each machine's table, with its command, "
             "frames/s and learner samples/s, is its atari_replay.md; the verdict pools the runs at the budget whose "
             "only flag beyond %s is the precision." % atari.RECIPE, "",
             "| game | variant | seed | results folder | frames | score at the end | training time | precision | "
             "beyond the recipe |", "|---" * 9 + "|"]
    for r in runs:
        lines.append("| %s | %s | %d | [%s](%s/atari_replay.md) | %.1fM%s | %.1f | %.0f min | %s | %s |" % (
            r["game"], r["variant"], r["seed"], r["folder"], r["folder"], r["frames"] / 1e6,
            "" if r["frames"] >= frames else " (not at the budget)", r["return_last100"], r["train_seconds"] / 60,
            precision_of(r), r["extra_flags"] or "-"))
    games = sorted({r["game"] for r in runs})
    for game in games:
        mine = [r for r in pooled if r["game"] == game]
        lines += ["", spreads(game, mine), verdict(game, mine)]
        plot(game, [r for r in runs if r["game"] == game], frames,
             os.path.join(results_root, "atari_replay_seeds_%s.png" % game))
    lines += ["", "Figures: %s" % ", ".join("[%s](atari_replay_seeds_%s.png)" % (g, g) for g in games),
              "", "Date: " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())]
    common.write_lines(os.path.join(results_root, "atari_replay_seeds.md"), lines)


def collect(out):
    """Every run of the table: the run folders under <out>/replay_runs, and the runs of the
    atari_replay.csv there whose folders are not here (atari.with_kept), in game, variant and seed order."""
    root = os.path.join(out, "replay_runs")
    present = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        match = re.fullmatch(r"(\w+?)_(%s)_s(\d+)" % "|".join(VARIANTS), name)
        if match is None:  # not a run folder of this suite's (run_dir): left alone
            continue
        key = (match.group(1), match.group(2), int(match.group(3)))
        r = summarise(os.path.join(root, name), *key)
        if r is not None:
            present.append((key, os.path.join(root, name), r))
    runs = atari.with_kept(out, "atari_replay.csv", KEPT_METRICS, present,
                           lambda row: (row["game"], row["variant"], int(row["seed"])))
    return sorted((r for r in runs if r["variant"] in VARIANTS),
                  key=lambda r: (r["game"], list(VARIANTS).index(r["variant"]), r["seed"]))


def suite(a, out):
    """Runs (or resumes) each game, seed and variant to a.frames, then the table of every run (collect);
    Ctrl-C still writes the table (common.train_then_table)."""
    return common.train_then_table(lambda: train(a, out), lambda: report(a, out))


def train(a, out):
    """Runs (or resumes) each game, seed and variant to a.frames, one after the other."""
    atari.check_games(a.games)
    for level in a.games:
        for seed in a.seeds:
            for variant, (_, spec, own) in VARIANTS.items():  # variants in turn within a seed
                if variant not in a.variants:
                    continue
                logdir = run_dir(out, level, variant, seed)
                key = (atari.short(level), variant, seed)
                if atari.kept_done(out, "atari_replay.csv", logdir,
                                   lambda row: (row["game"], row["variant"], int(row["seed"])) == key,
                                   a.frames, a.recipe_extra):
                    continue
                extra = atari.extra_flags(logdir, a.recipe_extra + ["--replay_parameters=" + json.dumps(spec)] + own)
                print("[atari_replay] %s" % variant, flush=True)
                code = atari.run_game(a, level, seed, logdir, extra)
                if code not in (None, 0):
                    print("[atari_replay] %s %s seed %d: the learner exited with %s" % (
                        atari.short(level), variant, seed, code), flush=True)


def report(a, out):
    """The table of every run under `out` (collect), with its atari_replay.csv, curves and verdicts."""
    runs = collect(out)
    with open(os.path.join(out, "atari_replay.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS)
        w.writeheader()
        w.writerows({k: r[k] for k in CSV_FIELDS} for r in runs)
    games = sorted({r["game"] for r in runs})
    for game in games:
        plot(game, [r for r in runs if r["game"] == game], a.frames, os.path.join(out, "atari_replay_%s.png" % game))
    if os.path.abspath(os.path.dirname(out)) == RESULTS_ROOT:  # out is a machine's folder: pool every machine's
        write_seeds(RESULTS_ROOT, a.frames)
    return ["# Replay on Atari at %s frames, %s: queue only against replay variants" % (
                "{:,}".format(a.frames), atari.RECIPE), "",
            "Score: mean of the last 100 whole-game training returns. Variants: %s. Replay capacity %d unrolls, "
            "lz4-compressed. Learner samples/s counts every unroll step trained on, replayed or new. A resumed run's "
            "buffer started empty and refilled from new unrolls (bench/atari_replay.py's doc says why)." % (
                "; ".join("**%s** %s" % (k, v[0]) for k, v in VARIANTS.items()), CAPACITY), ""] + table(runs) + [
        ""] + [verdict(game, [r for r in runs if r["game"] == game]) for game in games] + [
        "", "Figures: %s" % ", ".join("[atari_replay_%s.png](atari_replay_%s.png)" % (g, g) for g in games),
        "", atari.command("atari_replay", a, runs, a.variants)]
