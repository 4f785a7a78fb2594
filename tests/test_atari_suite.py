"""bench/run.py atari: a run folder's state (new, cut, done), the figures read from metrics.csv
(milestones, a resumed run's clock, human-normalised scores), and, slow, a real run cut off and
resumed by the suite."""
import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bench import atari

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = ("time_s", "frames", "updates", "fps", "mean_return_20", "episodes", "queue_fill", "total_loss",
        "entropy", "grad_norm", "mean_return_100")


def _metrics(folder, rows):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metrics.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def test_run_state_new_cut_done(tmp_path):
    d = str(tmp_path / "Breakout_s1")
    assert atari.run_state(d, 100) == "new"
    os.makedirs(os.path.join(d, "checkpoints"))
    open(os.path.join(d, "checkpoints", "ckpt-3.index"), "w").close()
    assert atari.run_state(d, 100) == "cut"
    json.dump({"frames": 100}, open(os.path.join(d, "summary.json"), "w"))
    assert atari.run_state(d, 100) == "done" and atari.run_state(d, 200) == "cut"


def test_summary_reads_milestones_and_continues_a_resumed_clock(tmp_path):
    d = str(tmp_path / "Breakout_s2")
    rows = [dict(time_s=t, frames=f, updates=f // 1024, mean_return_20=1.0, mean_return_100=s) for t, f, s in [
        (100, 5_000_000, 2.0), (200, 10_000_000, 10.0), (300, 15_000_000, 20.0),
        (50, 20_500_000, 30.0), (150, 25_000_000, 40.0)]]  # resumed at 15M: time_s restarts
    _metrics(d, rows)
    os.makedirs(os.path.join(d, "logs"))
    with open(os.path.join(d, "logs", "learner.log"), "w") as f:
        f.write("[learner 0] resumed from %s/checkpoints/ckpt-9 at 15000000 frames\n" % d)
    r = atari.summarise("BreakoutNoFrameskip-v4", 2, d, ceiling_fps=20000.0)
    assert r["at_10M"] == 10.0 and r["at_20M"] == 20.0 and np.isnan(r["at_40M"])
    assert r["train_seconds"] == 450.0 and r["return_last100"] == 40.0 and r["resumed_at"] == "15000000"
    assert r["fps"] == pytest.approx(25_000_000 / 450.0) and r["fps_ratio"] == pytest.approx(r["fps"] / 20000.0)
    lines = atari.table([r], 40_000_000)
    assert "| Breakout | 2 | 25.0M | 10 | 20 | - | 389 | 432 |" in lines[2]
    hns = (40.0 - 1.7) / (30.5 - 1.7)
    assert "%.2f / %.2f" % (hns, (388.9 - 1.7) / (30.5 - 1.7)) in lines[2]


def test_a_long_run_reports_where_it_stands(tmp_path):
    """The suite's progress line: frames against the budget, and the rate and time left measured
    since the run's last (re)start, where the learner's clock restarted."""
    d = str(tmp_path / "Breakout_s1")
    assert atari.progress(d, 40_000_000) == "[atari] Breakout_s1: starting (no metrics rows since the (re)start yet)"
    _metrics(d, [dict(time_s=t, frames=f, mean_return_100=s) for t, f, s in [
        (100, 1_000_000, 5.0), (200, 2_000_000, 9.0), (50, 2_100_000, 9.0), (350, 3_000_000, 13.0)]])
    assert atari.progress(d, 40_000_000) == (
        "[atari] Breakout_s1: 3.00M of 40M frames (8 %), 3000 frames/s since the (re)start, about 3.4 h to go; "
        "mean of the last 100 games 13")


def test_the_command_line_names_every_run_in_the_table_with_its_budget(tmp_path):
    """The table holds every run folder, so its command lines come from them, not from the
    invocation that only ran one game: one line per frame budget and recipe flags."""
    runs = []
    for game, seed, budget in (("Breakout", 1, 40_000_000), ("Qbert", 1, 40_000_000), ("Pong", 1, 10_000_000)):
        d = str(tmp_path / ("%s_s%d" % (game, seed)))
        _metrics(d, [dict(time_s=10, frames=1000, updates=1, mean_return_20=0.0, mean_return_100=0.0)])
        json.dump({"total_environment_frames": budget}, open(os.path.join(d, "options.json"), "w"))
        json.dump(["--compute_dtype=float32"], open(os.path.join(d, "extra_flags.json"), "w"))
        runs.append(atari.summarise("%sNoFrameskip-v4" % game, seed, d, None))
    invoked = type("Args", (), {"games": ["QbertNoFrameskip-v4"], "seeds": [1], "frames": 40_000_000,
                                "recipe_extra": ["--compute_dtype=float32"]})
    line = atari.command("atari", invoked, runs)
    run = ".venv/bin/python bench/run.py atari --games "
    assert line == ("Commands: `%sPongNoFrameskip-v4 --frames 10000000 --seeds 1 "
                    "--recipe_extra='--compute_dtype=float32'`; "
                    "`%sBreakoutNoFrameskip-v4 QbertNoFrameskip-v4 --frames 40000000 --seeds 1 "
                    "--recipe_extra='--compute_dtype=float32'`" % (run, run)), line
    assert atari.command("atari", invoked, []).startswith("Command: `%sQbertNoFrameskip-v4 --frames 40000000" % run)


def test_any_atari_game_gets_a_row_and_a_wrong_id_is_refused_before_a_run(tmp_path):
    """A game outside the published PPO table (Asterix) still gets its row and curve, with its
    human-normalised score from the DQN papers' random and human scores, "-" for the PPO figures,
    and stays out of the median; a game with neither (Adventure) shows "-" there too. An id of
    another family is refused, naming --games and the id meant."""
    out = str(tmp_path)
    for game, score in (("Asterix", 2000.0), ("Adventure", 0.0), ("Breakout", 30.5)):
        _metrics(atari.run_dir(out, "%sNoFrameskip-v4" % game, 1),
                 [dict(time_s=100, frames=1_000_000, updates=244, mean_return_20=score, mean_return_100=score)])
    runs = atari.collect(out)
    assert [r["game"] for r in runs] == ["Adventure", "Asterix", "Breakout"]
    lines = atari.table(runs, 40_000_000)
    assert lines[2].startswith("| Adventure | 1 | 1.0M | - | - | - | - | - | - / - |"), lines[2]
    asterix = (2000.0 - 210.0) / (8503.3 - 210.0)
    assert lines[3].startswith("| Asterix | 1 | 1.0M | - | - | - | - | - | %.2f / - |" % asterix), lines[3]
    assert "ours 1.00, baselines PPO 13.44 at 40M frames" in lines[-3]  # Breakout's alone
    assert "for Adventure, Asterix: left out of the median" in lines[-1]
    atari.plot("AsterixNoFrameskip-v4", [r for r in runs if r["game"] == "Asterix"], 40_000_000, out)
    assert os.path.exists(os.path.join(out, "atari_Asterix.png"))
    atari.check_games(["AsterixNoFrameskip-v4", "PongNoFrameskip-v4"])
    for wrong in ("Breakout", "ALE/Breakout-v5"):
        with pytest.raises(SystemExit, match="--games %s: not an Atari id .* did you mean BreakoutNoFrameskip-v4"
                           % wrong):
            atari.check_games(["AsterixNoFrameskip-v4", wrong])


def test_recipe_is_one_file_for_every_game():
    flags = [ln for ln in open(os.path.join(ROOT, atari.RECIPE)) if ln.startswith("--")]
    assert flags and not any(ln.startswith(("--level_name", "--seed")) for ln in flags)
    assert atari.recipe_screen() == (84, 84)
    assert atari.recipe_screen(["--compute_dtype=float32", "--width=42", "--height=42"]) == (42, 42)


def test_many_cores_refuses_a_recipe_that_is_not_there(tmp_path):
    """bench/many_cores.py --flagfile: a missing recipe is named before anything is measured or written."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "many_cores.py"), "--flagfile",
                           "configs/atari_typo.flags", "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--flagfile=configs/atari_typo.flags: no such file" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_every_lever_is_a_valid_run_of_the_recipe():
    """bench/atari_levers.py: each variant's flags after configs/atari.flags parse and pass the run
    checks (replay JSON included), so no lever fails only after the ones before it have run."""
    from bench import atari_levers
    code = ("import json, sys\n"
            "import experiment\n"
            "for name, flags in json.loads(sys.argv[1]).items():\n"
            "    experiment.FLAGS.unparse_flags()\n"
            "    experiment.FLAGS(['experiment.py', '--flagfile=configs/atari.flags'] + flags)\n"
            "    experiment.validate_run()\n"
            "    print('valid', name, experiment.FLAGS.clip_ratio_to, experiment.FLAGS.num_sgd_iter)\n")
    variants = {name: flags for name, (_, flags) in atari_levers.VARIANTS.items()}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(variants)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.startswith("valid ")]) == len(variants)
    assert "valid replay_uniform_clip_mu behaviour 4" in r.stdout
    assert "valid replay_uniform_sgd1 batch_start 1" in r.stdout


def test_a_run_keeps_the_flags_it_started_with(tmp_path):
    """--recipe_extra: a new run records its flags; a resume asked for none keeps them; others are refused."""
    d = str(tmp_path / "Breakout_s1")
    assert atari.extra_flags(d, ["--compute_dtype=float32"]) == ["--compute_dtype=float32"]
    assert atari.extra_flags(d, []) == ["--compute_dtype=float32"]
    assert atari.extra_flags(d, ["--compute_dtype=float32"]) == ["--compute_dtype=float32"]
    with pytest.raises(SystemExit, match="a resume keeps the flags a run started with"):
        atari.extra_flags(d, ["--num_sgd_iter=2"])


@pytest.mark.long
def test_the_suite_resumes_a_run_that_was_cut_off(tmp_path):
    """A real Breakout run to one budget, then the suite asked for more: it resumes the run from its
    checkpoint (train_w_load), says where, and the table and atari.csv have the run at the new budget;
    the flags a run started with beyond the recipe stay with its resumes, and others are refused."""
    out = str(tmp_path)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "run.py"), "atari", "--games", "BreakoutNoFrameskip-v4",
           "--seeds", "1", "--out", out, "--base_port", "19650"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    first = subprocess.run(cmd + ["--frames", "8192", "--recipe_extra=--compute_dtype=float32"], capture_output=True,
                           text=True, timeout=600, cwd=ROOT, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    stopped_at = json.load(open(os.path.join(atari.run_dir(out, "BreakoutNoFrameskip-v4", 1), "summary.json")))["frames"]
    second = subprocess.run(cmd + ["--frames", "16384"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Breakout seed 1: resuming" in second.stdout
    rows = list(csv.DictReader(open(os.path.join(out, "atari.csv"))))
    assert len(rows) == 1 and int(rows[0]["frames"]) >= 16384 and rows[0]["resumed_at"] == str(stopped_at)
    assert rows[0]["extra_flags"] == "--compute_dtype=float32"
    run = atari.run_dir(out, "BreakoutNoFrameskip-v4", 1)
    assert json.load(open(os.path.join(run, "options.json")))["compute_dtype"] == "float32"
    starts = list(csv.DictReader(open(os.path.join(run, atari.MACHINES))))
    assert [int(r["from_frames"]) for r in starts][0] == 0 and len(starts) == 2, starts
    other = subprocess.run(cmd + ["--frames", "32768", "--recipe_extra=--num_sgd_iter=2"], capture_output=True,
                           text=True, timeout=600, cwd=ROOT, env=env)
    assert other.returncode != 0 and "a resume keeps the flags a run started with" in other.stderr, other.stderr
    assert os.path.exists(os.path.join(out, "atari_Breakout.png"))
    third = subprocess.run(cmd + ["--frames", "16384"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert third.returncode == 0 and "resuming" not in third.stdout and "starting" not in third.stdout


def test_ctrl_c_still_writes_the_table_of_where_the_runs_stood(tmp_path, monkeypatch):
    """Ctrl-C during a game's run (it has checkpointed; the next invocation resumes it): bench/run.py
    still writes atari.md and atari.csv with that run's row where it was cut, says so under the
    title, and exits 130."""
    from bench import run as bench_run
    out = str(tmp_path)
    cut_at = 3_000_448

    def cut(a, level, seed, logdir, extra):
        _metrics(logdir, [dict(time_s=600, frames=cut_at, updates=732, mean_return_20=5.0, episodes=150,
                               mean_return_100=4.5)])
        raise KeyboardInterrupt
    monkeypatch.setattr(atari, "run_game", cut)
    monkeypatch.setattr(atari, "ceiling_fps", lambda logdir, level, screen: 20000.0)
    monkeypatch.setattr(bench_run, "versions", lambda py: {"python": "x"})
    for peer in ("SB3_PY", "SF_PY", "RLLIB_PY"):
        monkeypatch.setattr(bench_run, peer, str(tmp_path / "absent"))
    monkeypatch.setattr(sys, "argv", ["bench/run.py", "atari", "--games", "BreakoutNoFrameskip-v4", "--seeds", "1",
                                      "--frames", "40000000", "--out", out])
    assert bench_run.main() == 130
    text = open(os.path.join(out, "atari.md")).read().splitlines()
    assert text[0].startswith("# Atari at 40,000,000 frames") and text[2].startswith("Stopped by Ctrl-C on ")
    assert any(line.startswith("| Breakout | 1 | 3.0M | - | - | - |") for line in text), text
    rows = list(csv.DictReader(open(os.path.join(out, "atari.csv"))))
    assert [(r["game"], int(r["frames"]), float(r["return_last100"])) for r in rows] == [("Breakout", cut_at, 4.5)]


def test_a_run_resumed_on_another_kind_of_machine_says_so_under_the_table(tmp_path, monkeypatch):
    """Each (re)start records its machine in the run folder; a run whose machines differ gets a note
    under the table (its training time and frames/s mix their rates), kept through atari.csv for a
    fresh checkout; a run on one kind of machine gets none."""
    from bench import common
    d = str(tmp_path / "atari_runs" / "Breakout_s1")
    for cpu, rows in (("Xeon", []), ("Xeon", [(100, 4_000_000)]), ("EPYC", [(100, 4_000_000), (200, 8_000_000)])):
        _metrics(d, [dict(time_s=t, frames=f, updates=1, mean_return_100=3.0) for t, f in rows])
        monkeypatch.setattr(common, "cpu_model", lambda cpu=cpu: cpu)
        atari.record_machine(d)
        if cpu == "Xeon":
            assert atari.machines(d) == ""
    assert atari.machines(d) == "Xeon (%d cores) from 0.0M, EPYC (%d cores) from 8.0M" % ((os.cpu_count(),) * 2)
    note = atari.table(atari.collect(str(tmp_path)), 40_000_000)[-1]
    assert note.startswith("Trained on more than one kind of machine") and "Breakout seed 1: Xeon" in note
    with open(tmp_path / "atari.csv", "w", newline="") as f:
        w = csv.DictWriter(f, atari.CSV_FIELDS)
        w.writeheader()
        w.writerows({k: r[k] for k in atari.CSV_FIELDS} for r in atari.collect(str(tmp_path)))
    shutil.rmtree(tmp_path / "atari_runs")  # a fresh checkout: the row comes back from atari.csv
    assert atari.table(atari.collect(str(tmp_path)), 40_000_000)[-1] == note


def test_the_precision_auto_chose_is_noted_under_the_table_and_kept_in_atari_csv(tmp_path):
    """--compute_dtype=auto (the recipes') may choose differently when a run resumes on another kind
    of machine: the note names each run's choices in order, a fresh checkout keeps it, and a run that
    named its precision gets none."""
    from bench import common
    runs = tmp_path / "atari_runs"
    log = ("[learner 0] compute dtype bfloat16 (--compute_dtype=auto: a gradient step ...)\n"
           "[learner 0] resumed from x at 4000000 frames\n[learner 0] compute dtype bfloat16 (--compute_dtype=auto: ...)\n"
           "[learner 0] compute dtype float32 (--compute_dtype=auto: ...)\n")
    for name, text in (("Breakout_s1", log), ("Pong_s1", "[learner 0] serving ...\n")):
        _metrics(str(runs / name), [dict(time_s=100, frames=4_000_000, updates=1, mean_return_100=3.0)])
        os.makedirs(runs / name / "logs")
        (runs / name / "logs" / "learner.log").write_text(text)
    assert atari.precision(common.log_text(str(runs / "Breakout_s1"))) == "bfloat16 then float32"
    assert atari.precision(common.log_text(str(runs / "Pong_s1"))) == ""
    note = atari.table(atari.collect(str(tmp_path)), 40_000_000)[-1]
    assert note == "The learner's precision as --compute_dtype=auto chose it: Breakout seed 1: bfloat16 then float32."
    with open(tmp_path / "atari.csv", "w", newline="") as f:
        w = csv.DictWriter(f, atari.CSV_FIELDS)
        w.writeheader()
        w.writerows({k: r[k] for k in atari.CSV_FIELDS} for r in atari.collect(str(tmp_path)))
    shutil.rmtree(runs)
    assert atari.table(atari.collect(str(tmp_path)), 40_000_000)[-1] == note


def test_machine_json_keeps_the_peers_it_does_not_measure_again(tmp_path, monkeypatch):
    """A suite run without a peer's venv keeps that peer's recorded versions (its tables there were made
    with them) and records this run's own versions and date."""
    from bench import run as bench_run
    with open(tmp_path / "machine.json", "w") as f:
        json.dump({"date": "then", "ours": {}, "sb3_peer": {"torch": "2.13.0+cpu"}}, f)
    monkeypatch.setattr(bench_run, "SB3_PY", str(tmp_path / "absent"))
    monkeypatch.setattr(bench_run, "SF_PY", str(tmp_path / "absent"))
    monkeypatch.setattr(bench_run, "RLLIB_PY", str(tmp_path / "absent"))
    monkeypatch.setattr(bench_run, "versions", lambda py: {"python": "x"})
    info = bench_run.write_machine(str(tmp_path))
    saved = json.load(open(tmp_path / "machine.json"))
    assert saved == info and saved["sb3_peer"] == {"torch": "2.13.0+cpu"} and saved["date"] != "then"
    assert saved["ours"] == {"python": "x"}


def test_machine_json_keeps_the_folders_machine_when_another_resumes_a_run_there(tmp_path, monkeypatch):
    """A run resumed into another machine's folder is recorded beside that folder's machine, once per
    machine, and the tables' machine line names both, instead of the folder's record being replaced."""
    from bench import run as bench_run
    folder = {"cores": 2, "cpu": "AMD EPYC without AVX-512", "gpu": None, "date": "then", "ours": {"python": "old"}}
    json.dump(folder, open(tmp_path / "machine.json", "w"))
    for key in ("SB3_PY", "SF_PY", "RLLIB_PY"):
        monkeypatch.setattr(bench_run, key, str(tmp_path / "absent"))
    monkeypatch.setattr(bench_run, "versions", lambda py: {"python": "x", "tensorflow-cpu": "2.18.1"})
    monkeypatch.setattr(bench_run.common, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(bench_run, "gpu_model", lambda: None)
    bench_run.write_machine(str(tmp_path))
    info = bench_run.write_machine(str(tmp_path))
    saved = json.load(open(tmp_path / "machine.json"))
    assert saved == info and saved["cpu"] == "AMD EPYC without AVX-512" and saved["ours"] == {"python": "old"}
    assert saved["date"] != "then"
    assert [m["cpu"] for m in saved["other_machines"]] == ["AMD EPYC"]
    assert "Part of it ran on 2 cores, AMD EPYC (" in bench_run.machine_line(info)
    monkeypatch.setattr(bench_run.common, "cpu_model", lambda: "AMD EPYC without AVX-512")
    same = bench_run.write_machine(str(tmp_path))
    assert same["ours"] == {"python": "x", "tensorflow-cpu": "2.18.1"} and same["date"] != "then"
    assert [m["cpu"] for m in same["other_machines"]] == ["AMD EPYC"]


def test_a_run_whose_folder_is_not_here_keeps_its_row_and_curve(tmp_path):
    """Run folders are not committed: a fresh checkout has atari.csv and the kept metrics copies only.
    The table then keeps those runs (figures and curve as written) beside the run folders it has, and
    a run folder that is here replaces its kept row and refreshes its metrics copy."""
    out = str(tmp_path)
    rows = [dict(time_s=t, frames=f, updates=f // 1024, mean_return_20=1.0, mean_return_100=s) for t, f, s in [
        (100, 10_000_000, 12.0), (200, 20_000_000, 20.0), (400, 40_000_000, 30.0)]]
    done = atari.run_dir(out, "BreakoutNoFrameskip-v4", 1)
    _metrics(done, rows)
    json.dump({"total_environment_frames": 40_000_000}, open(os.path.join(done, "options.json"), "w"))
    json.dump(["--compute_dtype=float32"], open(os.path.join(done, "extra_flags.json"), "w"))
    json.dump({"limit": 20000.0}, open(os.path.join(done, "ceiling.json"), "w"))
    first = atari.collect(out)
    with open(os.path.join(out, "atari.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, atari.CSV_FIELDS)
        w.writeheader()
        w.writerows([{k: r[k] for k in atari.CSV_FIELDS} for r in first]
                     + [dict(game="Pong", seed=1, frames=10_002_432, return_last100=20.71, train_seconds=2458.9,
                             fps=4067.8, fps_ratio="", at_10M=20.73, at_20M="nan", at_40M="nan", resumed_at="",
                             extra_flags="", budget="")])
    assert os.path.exists(os.path.join(out, atari.KEPT_METRICS % ("Breakout", 1)))
    shutil.rmtree(os.path.join(out, "atari_runs"))  # a fresh checkout
    runs = atari.collect(out)
    assert [(r["game"], r["seed"]) for r in runs] == [("Breakout", 1), ("Pong", 1)]
    breakout, pong = runs
    assert breakout["return_last100"] == 30.0 and breakout["budget"] == 40_000_000
    assert breakout["extra"] == ["--compute_dtype=float32"] and breakout["fps_ratio"] == pytest.approx(5.0)
    assert list(breakout["curve"][0]) == [10e6, 20e6, 40e6] and pong["curve"] is None and pong["budget"] is None
    lines = atari.table(runs, 40_000_000)
    assert lines[2] == atari.table(first, 40_000_000)[2]
    assert "| Pong | 1 | 10.0M | 21 | - | - |" in lines[3] and "| 4068 (-) |" in lines[3]
    atari.plot("BreakoutNoFrameskip-v4", [breakout], 40_000_000, out)
    atari.plot("PongNoFrameskip-v4", [pong], 40_000_000, out)
    _metrics(atari.run_dir(out, "PongNoFrameskip-v4", 1), rows[:1])  # the folder is here again: it wins
    pong_again = [r for r in atari.collect(out) if r["game"] == "Pong"]
    assert len(pong_again) == 1 and pong_again[0]["return_last100"] == 12.0
    assert os.path.exists(os.path.join(out, atari.KEPT_METRICS % ("Pong", 1)))


def test_the_five_games_are_summed_up_over_the_machines_that_ran_them(tmp_path):
    """Each machine's atari.csv gives its rows, named by the machine's CPU; the median counts a game once
    (the mean of its finished runs), leaves out runs short of the budget and games outside the five,
    and names the games not there yet."""
    def machine(name, cpu, rows):
        os.makedirs(tmp_path / name)
        json.dump({"cpu": cpu}, open(tmp_path / name / "machine.json", "w"))
        with open(tmp_path / name / "atari.csv", "w", newline="") as f:
            w = csv.DictWriter(f, atari.CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows([dict(zip(("game", "seed", "frames", "return_last100"), r), train_seconds=6000, fps=5000,
                              extra_flags="") for r in rows])
    machine("2core-a", "CPU A", [("Breakout", 1, 40_000_000, 400.0), ("Pong", 1, 10_000_000, 20.0)])
    machine("2core-b", "CPU B", [("Breakout", 2, 40_000_000, 200.0), ("Qbert", 1, 40_000_000, 13455.0),
                                 ("Seaquest", 1, 28_000_000, 1800.0)])
    os.makedirs(tmp_path / "no-atari-here")
    lines = atari.across_machines(str(tmp_path), 40_000_000)
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| game")]
    assert len(rows) == 4 and not any("Pong" in ln for ln in rows)
    assert rows[0].startswith("| Breakout | CPU A | 1 | 40.0M | 400 |")
    assert "| Seaquest | CPU B | 1 | 28.0M (not at the budget) | 1800 |" in rows[3]
    breakout = np.mean([(400.0 - 1.7) / 28.8, (200.0 - 1.7) / 28.8])
    median = float(np.median([breakout, 1.0]))
    assert "Median human-normalised score of the 2 of the five games at 40,000,000 frames: ours %.2f" % median \
        in "\n".join(lines)
    assert lines[-1] == "Not at 40,000,000 frames yet: BeamRider (not run), Seaquest (28.0M frames), " \
                        "SpaceInvaders (not run)."


def test_a_finished_run_is_judged_at_40m_frames_not_past_them(tmp_path):
    """The run's last row has trained on a batch past the budget: the five's score and the table's
    human-normalised score are both the row at or before 40M frames, the one the "at 40M" column shows."""
    os.makedirs(tmp_path / "2core-a")
    json.dump({"cpu": "CPU A"}, open(tmp_path / "2core-a" / "machine.json", "w"))
    with open(tmp_path / "2core-a" / "atari.csv", "w", newline="") as f:
        w = csv.DictWriter(f, atari.CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerow(dict(game="Breakout", seed=1, frames=40_001_536, return_last100=420.0, at_40M=400.0,
                        train_seconds=6000, fps=5000, extra_flags=""))
    lines = atari.across_machines(str(tmp_path), 40_000_000)
    assert any(ln.startswith("| Breakout | CPU A | 1 | 40.0M | 400 |") for ln in lines), lines
    run = dict(game="Breakout", seed=1, frames=40_001_536, return_last100=420.0, at_10M=100.0, at_20M=200.0,
               at_40M=400.0, train_seconds=6000.0, fps=5000.0, fps_ratio="", resumed_at="", extra_flags="",
               machines="", precision="")
    row = atari.table([run], 40_000_000)[2]
    assert "| 400 |" in row and "| %.2f / " % ((400.0 - 1.7) / 28.8) in row, row


def test_a_run_finished_in_another_checkout_is_not_run_again(tmp_path):
    out = str(tmp_path)
    with open(os.path.join(out, "atari.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, atari.CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerow({"game": "Qbert", "seed": 1, "frames": 40001536, "budget": 40000000, "extra_flags": ""})
        w.writerow({"game": "Seaquest", "seed": 1, "frames": 28800000, "budget": 40000000, "extra_flags": ""})
    qbert = lambda row: (row["game"], int(row["seed"])) == ("Qbert", 1)  # noqa: E731
    absent = os.path.join(out, "atari_runs", "Qbert_s1")
    assert atari.kept_done(out, "atari.csv", absent, qbert, 40_000_000, [])
    # another budget, a run kept short of it, a folder that is here: the suite runs or resumes them
    assert not atari.kept_done(out, "atari.csv", absent, qbert, 50_000_000, [])
    seaquest = lambda row: (row["game"], int(row["seed"])) == ("Seaquest", 1)  # noqa: E731
    assert not atari.kept_done(out, "atari.csv", os.path.join(out, "atari_runs", "Seaquest_s1"), seaquest,
                               40_000_000, [])
    os.makedirs(absent)
    assert not atari.kept_done(out, "atari.csv", absent, qbert, 40_000_000, [])
    os.rmdir(absent)
    with pytest.raises(SystemExit, match="--recipe_extra --compute_dtype=float32: .*atari.csv keeps this run"):
        atari.kept_done(out, "atari.csv", absent, qbert, 40_000_000, ["--compute_dtype=float32"])


def test_a_cpu_without_avx512_is_named_apart(tmp_path):
    """Virtual machines call CPUs of different generations "AMD EPYC"; bfloat16 is 1.5x faster on
    one and 4.8x slower on the other, so the name that files results says which it is."""
    from bench import common
    info = "processor\t: %d\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 %s\n\n"
    for extra, name in (("", "AMD EPYC without AVX-512"), ("avx512f avx512_bf16", "AMD EPYC")):
        path = tmp_path / "cpuinfo"
        path.write_text(info % (0, extra) + info % (1, extra))
        assert common.cpu_model(str(path)) == name
