"""bench/run.py mujoco's tables, read from run folders as the suite leaves them: one section per
task with its own target, every run in mujoco.csv and every curve in mujoco_curves.csv under its
task, one figure per task (no training here: the folders are written by the test)."""
import csv
import json
import os
import shutil
import types

from bench import mujoco_suite as mujoco


def _done(folder, command="cmd"):
    with open(os.path.join(folder, "done.json"), "w") as f:
        json.dump({"exit": 0, "wall_s": 100.0, "command": command}, f)


def _rows(path, fields, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)


def _impala(out, level, seed, scores):
    folder = mujoco.run_dir(out, level, "impala", seed)
    _rows(os.path.join(folder, "metrics.csv"), ["time_s", "frames", "mean_return_20", "mean_return_100"],
          [dict(time_s=10 * (i + 1), frames=40000 * (i + 1), mean_return_20=s, mean_return_100=s - 100)
           for i, s in enumerate(scores)])
    _done(folder, "impala %s" % level)


def _walle(out, level, seed, scores):
    folder = mujoco.run_dir(out, level, "walle", seed)
    _rows(os.path.join(folder, "progress.csv"), ["steps", "time", "return_last10"],
          [dict(steps=20000 * (i + 1), time=8 * (i + 1), return_last10=s) for i, s in enumerate(scores)])
    _done(folder)


def test_each_task_gets_its_section_target_figure_and_rows(tmp_path):
    out = str(tmp_path)
    _impala(out, "HalfCheetah-v5", 1, [100, 3000, 5200])
    _walle(out, "HalfCheetah-v5", 1, [200, 4000, 4900])
    _impala(out, "Hopper-v5", 1, [300, 2100, 1900])
    a = types.SimpleNamespace(seeds=[], contenders=None, levels=["Hopper-v5"], target=None)
    lines = mujoco.suite(a, out)
    text = "\n".join(lines)
    assert "# HalfCheetah-v5:" in text and "# Hopper-v5:" in text
    cheetah, hopper = text.split("# Hopper-v5:")
    # HalfCheetah's target is 5,000: IMPALA passed it at 120K steps (30 s), WALL-E never did.
    assert "| impala | 1 | 120,000 | 5200 | 5100 | 5200 | 120000 | 30 |" in cheetah
    assert "| walle | 1 | 60,000 | 4900 | - | 4900 | - | - |" in cheetah
    # Hopper's is 2,000: reached at 80K steps (20 s), though the run ended below it.
    assert "time to 2,000" in hopper and "| impala | 1 | 120,000 | 1900 | 1800 | 2100 | 80000 | 20 |" in hopper
    with open(tmp_path / "mujoco.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["level"], r["contender"]) for r in rows] == [
        ("HalfCheetah-v5", "impala"), ("HalfCheetah-v5", "walle"), ("Hopper-v5", "impala")]
    with open(tmp_path / "mujoco_curves.csv") as f:
        curves = list(csv.DictReader(f))
    assert {r["level"] for r in curves} == {"HalfCheetah-v5", "Hopper-v5"} and len(curves) == 9
    assert (tmp_path / "mujoco_HalfCheetah.png").exists() and (tmp_path / "mujoco_Hopper.png").exists()


def test_an_explicit_target_applies_to_every_task(tmp_path):
    out = str(tmp_path)
    _impala(out, "Hopper-v5", 2, [300, 900])
    a = types.SimpleNamespace(seeds=[], contenders=None, levels=["Hopper-v5"], target=500.0)
    text = "\n".join(mujoco.suite(a, out))
    assert "time to 500" in text and "| impala | 2 | 80,000 | 900 | 800 | 900 | 80000 | 20 |" in text


def test_runs_without_a_folder_keep_their_rows_and_curves(tmp_path):
    # Run folders stay out of git: in a fresh checkout only mujoco.csv and mujoco_curves.csv are there,
    # and a new invocation must not drop the runs they hold.
    out = str(tmp_path)
    _impala(out, "HalfCheetah-v5", 1, [100, 3000, 5200])
    _walle(out, "HalfCheetah-v5", 1, [200, 4000, 4900])
    a = types.SimpleNamespace(seeds=[], contenders=None, levels=["HalfCheetah-v5"], target=None)
    first = mujoco.suite(a, out)
    with open(tmp_path / "mujoco.csv") as f:
        assert [r["command"] for r in csv.DictReader(f)] == ["impala HalfCheetah-v5", "cmd"]
    shutil.rmtree(mujoco.runs_dir(out, "HalfCheetah-v5"))
    # A new run of another seed beside the kept ones, as a later invocation would add it.
    _impala(out, "HalfCheetah-v5", 2, [400, 5100])
    text = "\n".join(mujoco.suite(a, out))
    assert "| impala | 1 | 120,000 | 5200 | 5100 | 5200 | 120000 | 30 |" in text
    assert "| walle | 1 | 60,000 | 4900 | - | 4900 | - | - |" in text
    assert "| impala | 2 | 80,000 | 5100 | 5000 | 5100 | 80000 | 20 |" in text
    assert "| IMPALA (ours, the task's flag file, 1 actor(s) x 8 envs) | 2 of 2 | 25 (20-30) | 100,000 |" in text
    assert first[-1] == text.splitlines()[-1]  # seed 1's commands, read back from the CSV
    with open(tmp_path / "mujoco.csv") as f:
        assert [(r["contender"], r["seed"]) for r in csv.DictReader(f)] == [("impala", "1"), ("walle", "1"),
                                                                            ("impala", "2")]
    with open(tmp_path / "mujoco_curves.csv") as f:
        assert len(list(csv.DictReader(f))) == 3 + 3 + 2
    # A target given now applies to the kept curves too: WALL-E's seed 1 passed 4,000 at 40K steps.
    a.target = 4000.0
    assert "| walle | 1 | 60,000 | 4900 | - | 4900 | 40000 | 16 |" in "\n".join(mujoco.suite(a, out))
    # A run that is here again replaces its kept row rather than doubling it.
    _impala(out, "HalfCheetah-v5", 1, [100, 4500])
    text = "\n".join(mujoco.suite(a, out))
    assert text.count("| impala | 1 |") == 1 and "| impala | 1 | 80,000 | 4500 |" in text


def test_runs_finished_in_another_checkout_are_not_run_again(tmp_path, monkeypatch):
    out = str(tmp_path)
    _impala(out, "HalfCheetah-v5", 1, [100, 3000, 5200])
    a = types.SimpleNamespace(seeds=[], contenders=["impala"], levels=["HalfCheetah-v5"], target=None)
    mujoco.suite(a, out)
    shutil.rmtree(mujoco.runs_dir(out, "HalfCheetah-v5"))
    started = []
    monkeypatch.setattr(mujoco, "run_one", lambda *args: started.append(args[1:4]))
    a.seeds = [1, 2]  # seed 1 is kept in mujoco.csv; seed 2 has never run
    text = "\n".join(mujoco.suite(a, out))
    assert started == [("HalfCheetah-v5", "impala", 2)]
    assert "| impala | 1 | 120,000 | 5200 |" in text
