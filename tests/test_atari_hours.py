"""bench/atari_hours.py: two runs' metrics compared at equal training time and equal frames, a
resumed run's clock continued and its first, short-window scores left out, and bad --run values
named."""
import csv
import os
import subprocess
import sys

import numpy as np

from bench import atari_hours

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = ("time_s", "frames", "episodes", "mean_return_100")


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS)
        w.writerows(rows)
    return str(path)


def _steady(path, fps, minutes, score_per_million):
    """A run at `fps` frames/s for `minutes`, a row a minute, whose score grows with frames."""
    rows = []
    for m in range(1, minutes + 1):
        frames = fps * 60 * m
        rows.append((60 * m, frames, 50 * m, score_per_million * frames / 1e6))
    return _write(path, rows)


def test_a_resumed_run_continues_its_clock_and_skips_its_short_window(tmp_path):
    rows = [(60, 1e6, 150, 10.0), (120, 2e6, 300, 20.0),
            # resumed: time and the game count restart; the first means are over a few games
            (60, 3e6, 5, 900.0), (120, 4e6, 120, 40.0)]
    frames, t, score = atari_hours.read_run(_write(tmp_path / "m.csv", rows))
    assert list(t) == [60, 120, 180, 240]
    assert np.isnan(score[2]) and score[3] == 40.0
    # at 3.5M frames the newest full-window score is the one before the resume, not the 900
    assert atari_hours.at(frames, score, 3.5e6) == 20.0
    assert np.isnan(atari_hours.at(frames, score, 5e6))
    assert atari_hours.first_reach(t, score, 30.0) == 240


def test_the_table_compares_equal_minutes_and_equal_frames(tmp_path):
    slow = _steady(tmp_path / "slow.csv", 1000, 60, 10.0)   # 3.6M frames in 60 min
    fast = _steady(tmp_path / "fast.csv", 2000, 40, 8.0)    # 4.8M frames in 40 min, less per frame
    runs = {name: (p, atari_hours.read_run(p)) for name, p in (("recipe", slow), ("lever", fast))}
    lines = atari_hours.tables(runs, minutes_step=30, frames_step=2e6)
    text = "\n".join(lines)
    # 30 min: recipe 1.8M frames -> 18, lever 3.6M frames -> 28.8 (shown rounded); 60 min: lever ended at 40
    assert "| 30 | 18 (1.8M) | 29 (3.6M) |" in text
    assert "| 60 | 36 (3.6M) | - |" in text
    # 2M frames are first reached in the recipe's 34th minute (2.04M) and the lever's 17th (2.04M)
    row2m = next(ln for ln in lines if ln.startswith("| 2M |"))
    assert "(34 min)" in row2m and "(17 min)" in row2m
    assert any(ln.startswith("| 4M |") and ln.endswith("| - | 32 (34 min) |") for ln in lines)


def test_the_script_writes_its_table_and_names_a_bad_run(tmp_path):
    a = _steady(tmp_path / "a.csv", 1000, 31, 10.0)
    b = _steady(tmp_path / "b.csv", 2000, 31, 5.0)
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run([sys.executable, "bench/atari_hours.py", "--game", "Pong", "--run", "x=" + a,
                         "--run", "y=" + b, "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert os.path.exists(tmp_path / "atari_hours_Pong.png")
    assert "| 30 | 18 (1.8M) | 18 (3.6M) |" in open(tmp_path / "atari_hours_Pong.md").read()
    bad = subprocess.run([sys.executable, "bench/atari_hours.py", "--game", "Pong", "--run", "x=" + a,
                          "--run", "y=" + str(tmp_path / "nope.csv")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "nope.csv does not exist" in bad.stderr
    one = subprocess.run([sys.executable, "bench/atari_hours.py", "--game", "Pong", "--run", "x=" + a],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert one.returncode == 2 and "two or more runs" in one.stderr
