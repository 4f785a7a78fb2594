"""bench/run.py atari_replay: the run folders it reads (one per game, variant and seed; others left
alone), learner samples/s from the updates, the verdict against the seeds' spread, and, slow, a real
tiny run of every variant through the suite."""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from bench import atari, atari_replay, common
from tests.test_atari_suite import _metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out, variant, seed, final, updates=100):
    d = atari_replay.run_dir(out, "BreakoutNoFrameskip-v4", variant, seed)
    _metrics(d, [dict(time_s=50, frames=100_000, updates=updates // 2, mean_return_20=1.0, mean_return_100=final / 2),
                 dict(time_s=100, frames=200_000, updates=updates, mean_return_20=1.0, mean_return_100=final)])
    json.dump({"batch_size": 32, "unroll_length": 32}, open(os.path.join(d, "options.json"), "w"))
    return d


def test_the_table_reads_each_variants_folders_and_leaves_others_alone(tmp_path):
    out = str(tmp_path)
    _run(out, "queue", 1, 10.0, updates=100)
    _run(out, "elite", 1, 30.0, updates=200)
    os.makedirs(os.path.join(out, "replay_runs", "notes_from_a_user"))
    runs = atari_replay.collect(out)
    assert [(r["game"], r["variant"], r["seed"]) for r in runs] == [("Breakout", "queue", 1), ("Breakout", "elite", 1)]
    elite = runs[1]
    assert elite["return_last100"] == 30.0 and elite["best_last100"] == 30.0 and elite["train_seconds"] == 100.0
    assert elite["learner_samples_per_s"] == pytest.approx(200 * 32 * 32 / 100.0)
    assert elite["fps"] == pytest.approx(2000.0)
    lines = atari_replay.table(runs)
    assert lines[3].startswith("| Breakout | elite | 1 | 0.2M | 30.0 | 30.0 | 2 min | 2000 | 2048 |")


def test_the_command_line_names_the_variants_its_runs_had(tmp_path):
    """The suite runs every variant unless told, so the table's command, which resumes a cut run,
    names the variants the table's runs had, in the suite's order."""
    out = str(tmp_path)
    _run(out, "elite", 2, 30.0)
    _run(out, "queue", 2, 10.0)
    invoked = argparse.Namespace(games=["BreakoutNoFrameskip-v4"], seeds=[2], frames=200_000, recipe_extra=[],
                                 variants=list(atari_replay.VARIANTS), out=out)
    line = atari.command("atari_replay", invoked, atari_replay.collect(out))
    assert line == ("Command: `.venv/bin/python bench/run.py atari_replay --games BreakoutNoFrameskip-v4 "
                    "--frames 200000 --seeds 2 --variants queue elite --out %s`" % out), line
    assert "--variants %s --out" % " ".join(atari_replay.VARIANTS) in atari.command(
        "atari_replay", invoked, [], invoked.variants)
    assert "--variants" not in atari.command("atari", invoked, [])


def test_runs_made_in_another_checkout_stay_in_the_table(tmp_path):
    """Without its run folders (a fresh checkout) the table is rebuilt from atari_replay.csv and the
    metrics copies kept beside it: the same rows, the same curves, the same verdict."""
    out = str(tmp_path)
    for seed, finals in ((1, (10.0, 20.0, 30.0)), (2, (12.0, 25.0, 28.0))):
        for variant, final in zip(("queue", "standard", "elite"), finals):
            d = _run(out, variant, seed, final)
            json.dump(["--replay_parameters=[{\"type\": \"queue\"}]"], open(os.path.join(d, "extra_flags.json"), "w"))
    before = atari_replay.collect(out)
    with open(os.path.join(out, "atari_replay.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, atari_replay.CSV_FIELDS)
        w.writeheader()
        w.writerows({k: r[k] for k in atari_replay.CSV_FIELDS} for r in before)
    shutil.rmtree(os.path.join(out, "replay_runs"))
    after = atari_replay.collect(out)
    assert atari_replay.table(after) == atari_replay.table(before)
    assert atari_replay.verdict("Breakout", after) == atari_replay.verdict("Breakout", before)
    assert all(list(a["curve"][2]) == list(b["curve"][2]) for a, b in zip(after, before))
    assert all(r["extra"] == [] for r in after)  # the variant, not the flag, names the replay settings


def test_the_verdict_needs_two_seeds_and_names_the_spread(tmp_path):
    out = str(tmp_path)
    for variant, finals in (("queue", (10.0, 12.0)), ("standard", (20.0, 40.0)), ("elite", (30.0, 35.0))):
        _run(out, variant, 1, finals[0])
    assert "spread is not measured" in atari_replay.verdict("Breakout", atari_replay.collect(out))
    for variant, finals in (("queue", (10.0, 12.0)), ("standard", (20.0, 40.0)), ("elite", (30.0, 35.0))):
        _run(out, variant, 2, finals[1])
    assert atari_replay.verdict("Breakout", atari_replay.collect(out)) == (
        "Breakout: elite replay is within the seeds' spread of standard and above queue on every seed.")
    # A table of queue and elite runs alone still compares the two.
    only = [r for r in atari_replay.collect(out) if r["variant"] != "standard"]
    assert atari_replay.verdict("Breakout", only) == (
        "Breakout: elite replay is above queue on every seed. Uniform replay has no run in this table.")


def test_the_fresh_clip_variant_gets_its_own_sentence(tmp_path):
    out = str(tmp_path)
    for seed, finals in ((1, (10.0, 2.0, 30.0, 15.0)), (2, (12.0, 3.0, 35.0, 16.0))):
        for variant, final in zip(("queue", "standard", "elite", "standard_fresh_clip"), finals):
            _run(out, variant, seed, final)
    assert atari_replay.verdict("Breakout", atari_replay.collect(out)).endswith(
        "Breakout: uniform replay with the fresh clip is above standard on every seed and above queue on every "
        "seed.")


def test_a_variants_own_flags_are_not_taken_for_asked_ones(tmp_path):
    """The fresh-clip variant starts with its own flag after the replay parameters: its row and the
    Command line show only what --recipe_extra asked, so that asking the same again is no conflict."""
    out = str(tmp_path)
    d = _run(out, "standard_fresh_clip", 1, 5.0)
    json.dump(["--compute_dtype=float32", "--replay_parameters=[]", "--clip_ratio_to=fresh_batch_start"],
              open(os.path.join(d, "extra_flags.json"), "w"))
    (r,) = atari_replay.collect(out)
    assert r["extra"] == ["--compute_dtype=float32", "--replay_parameters=[]"]
    assert r["extra_flags"] == "--compute_dtype=float32"


def test_ctrl_c_during_a_variant_still_gives_the_table(tmp_path, monkeypatch):
    """Ctrl-C in the second variant's run: the suite raises common.Stopped carrying the table with
    the first variant's finished row and the cut one's, for bench/run.py to write."""
    out = str(tmp_path)

    def train_or_cut(a, level, seed, logdir, extra):
        variant = os.path.basename(logdir).rsplit("_s", 1)[0].split("_", 1)[1]
        _run(out, variant, seed, 10.0)
        if variant != "queue":
            raise KeyboardInterrupt
    monkeypatch.setattr(atari_replay.atari, "run_game", train_or_cut)
    a = argparse.Namespace(games=["BreakoutNoFrameskip-v4"], seeds=[1], frames=200_000, variants=["queue", "elite"],
                           recipe_extra=[])
    with pytest.raises(common.Stopped) as stop:
        atari_replay.suite(a, out)
    lines = stop.value.lines
    assert lines[0].startswith("# Replay on Atari") and lines[2].startswith("Stopped by Ctrl-C on ")
    assert [line.split("|")[2].strip() for line in lines if line.startswith("| Breakout |")] == ["queue", "elite"]


# One variant of each kind: the queue alone, a replay source under the recipe's clip, and elite
# sampling with a variant's own flags; the other two combine the same parts (checked without a run in
# test_every_variants_replay_and_own_flags_are_valid), so three real runs cover them.
RUN_VARIANTS = ("queue", "standard", "elite_fresh_clip")


def test_every_variants_replay_and_own_flags_are_valid():
    from impala import replay
    for variant, (_, spec, own) in atari_replay.VARIANTS.items():
        sources = replay.parse_replay_parameters(json.dumps(spec))
        assert [s.type for s in sources][0] == "queue", variant
        assert set(own) <= {"--clip_ratio_to=fresh_batch_start"}, variant
    kinds = {(len(spec), bool(own)) for name, (_, spec, own) in atari_replay.VARIANTS.items() if name in RUN_VARIANTS}
    assert kinds == {(1, False), (2, False), (2, True)}  # the runs cover queue, replay, replay with own flags


@pytest.mark.long
def test_the_suite_runs_every_variant(tmp_path):
    """Real Breakout runs of a few updates each, one of each kind of variant: one folder per variant
    with its replay parameters and own flags, the replay variants training on about twice the
    samples per env frame."""
    out = str(tmp_path)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "run.py"), "atari_replay", "--games", "BreakoutNoFrameskip-v4",
           "--seeds", "1", "--frames", "16384", "--out", out, "--base_port", "19680",
           "--recipe_extra=--compute_dtype=float32", "--variants", *RUN_VARIANTS]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {row["variant"]: row for row in csv.DictReader(open(os.path.join(out, "atari_replay.csv")))}
    assert sorted(rows) == sorted(RUN_VARIANTS) and all(int(x["frames"]) >= 16384 for x in rows.values())
    for variant in RUN_VARIANTS:
        _, spec, own = atari_replay.VARIANTS[variant]
        options = json.load(open(os.path.join(atari_replay.run_dir(out, "BreakoutNoFrameskip-v4", variant, 1),
                                              "options.json")))
        assert json.loads(options["replay_parameters"]) == spec
        assert options["clip_ratio_to"] == ("fresh_batch_start" if own else "batch_start")  # the recipe's otherwise
        assert rows[variant]["extra_flags"] == "--compute_dtype=float32"  # what --recipe_extra asked, no more
    per_frame = {v: float(x["learner_samples_per_s"]) / float(x["fps"]) for v, x in rows.items()}
    assert all(per_frame[v] > 1.5 * per_frame["queue"] for v in rows if v != "queue")
    assert os.path.exists(os.path.join(out, "atari_replay_Breakout.png"))
    assert "spread is not measured" in open(os.path.join(out, "atari_replay.md")).read()


def test_the_suite_does_not_run_again_what_another_checkout_finished(tmp_path):
    """A fresh checkout keeps finished runs only in atari_replay.csv: asked for them again, the suite
    starts no learner and rebuilds the table from what it keeps."""
    import argparse
    out = str(tmp_path)
    budget = 200_000
    for variant in atari_replay.VARIANTS:
        d = _run(out, variant, 1, 10.0)
        json.dump({"batch_size": 32, "unroll_length": 32, "total_environment_frames": budget},
                  open(os.path.join(d, "options.json"), "w"))
    with open(os.path.join(out, "atari_replay.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, atari_replay.CSV_FIELDS)
        w.writeheader()
        w.writerows({k: r[k] for k in atari_replay.CSV_FIELDS} for r in atari_replay.collect(out))
    shutil.rmtree(os.path.join(out, "replay_runs"))
    a = argparse.Namespace(games=["BreakoutNoFrameskip-v4"], seeds=[1], frames=budget, recipe_extra=[],
                           variants=list(atari_replay.VARIANTS), actors=1, base_port=19990)
    lines = atari_replay.suite(a, out)
    assert not os.path.exists(os.path.join(out, "replay_runs"))  # a run started would have its folder there
    assert sum(line.startswith("| Breakout |") for line in lines) == len(atari_replay.VARIANTS)


def test_a_variant_with_one_seed_is_named_and_the_others_still_compared(tmp_path):
    out = str(tmp_path)
    for seed, finals in ((1, (10.0, 2.0, 30.0)), (2, (12.0, None, 35.0))):
        for variant, final in zip(("queue", "standard", "elite"), finals):
            if final is not None:
                _run(out, variant, seed, final)
    assert atari_replay.verdict("Breakout", atari_replay.collect(out)) == (
        "Breakout: elite replay is above queue on every seed and not compared with standard (one seed).")


def test_the_seeds_of_every_machine_are_pooled_for_the_verdict(tmp_path):
    """Each machine folder's runs (folders or kept rows) come into one table naming the folder; the
    verdict pools the runs at the budget whose only extra flag is the precision, leaving out a run
    short of the budget and one with another recipe flag; a figure per game beside the file."""
    root = tmp_path / "results"
    a, b = str(root / "2core-a"), str(root / "2core-b")
    _run(a, "queue", 1, 10.0)
    _run(a, "elite", 1, 30.0)
    _run(b, "queue", 2, 12.0)
    json.dump(["--compute_dtype=float32"], open(os.path.join(_run(b, "elite", 2, 35.0), "extra_flags.json"), "w"))
    json.dump(["--num_sgd_iter=2"], open(os.path.join(_run(b, "elite", 3, 5.0), "extra_flags.json"), "w"))
    short = _run(b, "queue", 3, 50.0)
    _metrics(short, [dict(time_s=10, frames=100_000, updates=10, mean_return_20=1.0, mean_return_100=50.0)])
    os.makedirs(root / "no-replay-here")
    atari_replay.write_seeds(str(root), 200_000)
    text = open(root / "atari_replay_seeds.md").read()
    rows = [ln for ln in text.splitlines() if ln.startswith("| Breakout |")]
    assert [ln.split("|")[2:4] for ln in rows] == [[" queue ", " 1 "], [" queue ", " 2 "], [" queue ", " 3 "],
                                                   [" elite ", " 1 "], [" elite ", " 2 "], [" elite ", " 3 "]]
    assert "[2core-b](2core-b/atari_replay.md)" in rows[1] and "(not at the budget)" in rows[2]
    assert "| float32 | --compute_dtype=float32 |" in rows[4] and rows[5].endswith("| --num_sgd_iter=2 |")
    assert "Breakout, the seeds at the budget: queue 10.0, 12.0 (spread 2.0); elite 30.0, 35.0 (spread 5.0)." in text
    assert "Breakout: elite replay is above queue on every seed." in text
    assert os.path.exists(root / "atari_replay_seeds_Breakout.png")


def test_elite_replay_with_the_fresh_clip_is_compared_with_both_replays_and_the_queue(tmp_path):
    out = str(tmp_path)
    for seed, finals in ((1, (10.0, 30.0, 20.0, 40.0)), (2, (12.0, 5.0, 25.0, 45.0))):
        for variant, final in zip(("queue", "elite", "standard_fresh_clip", "elite_fresh_clip"), finals):
            _run(out, variant, seed, final)
    runs = atari_replay.collect(out)
    assert {r["variant"] for r in runs} == {"queue", "elite", "standard_fresh_clip", "elite_fresh_clip"}
    assert atari_replay.verdict("Breakout", runs).endswith(
        "Breakout: elite replay with the fresh clip is above standard_fresh_clip on every seed and above elite on "
        "every seed and above queue on every seed.")
