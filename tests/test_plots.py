"""tools/plotcurve.py, plotcurve_cmp.py and runstats.py on every kind of run folder: IMPALA's metrics.csv and
eval.csv and WALL-E's progress.csv, by frames or by wall-clock, as a user runs them."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tools import plotcurve
from tools import runlog
from tools.runlog import RunLog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = b"\x89PNG\r\n\x1a\n"


def _write(path, columns, rows):
    log = RunLog(str(path), columns, None)
    for row in rows:
        log.write(row, step=0)
    log.close()


def impala_run(folder, scale=1.0):
    """A learner's metrics.csv (no episode ended in the first row) and an evaluator's eval.csv."""
    os.makedirs(folder)
    cols = ("time_s", "frames", "updates", "fps", "mean_return_20", "episodes", "queue_fill", "total_loss",
            "entropy", "grad_norm")
    _write(folder / "metrics.csv", cols, [
        dict(time_s=10.0 * i, frames=40000 * i, updates=10 * i, fps=4000.0, episodes=i,
             mean_return_20=float("nan") if i == 1 else scale * (i - 1), queue_fill=0.5, total_loss=1.0,
             entropy=1.0, grad_norm=1.0) for i in range(1, 6)])
    _write(folder / "eval.csv", ("time", "policy_version", "episodes", "mean_return", "std_return", "mean_length"),
           [dict(time=1.7e9 + 30.0 * i, policy_version=8 + 7 * i, episodes=10, mean_return=scale * 2 * i,
                 std_return=1.0, mean_length=100.0) for i in range(4)])
    return folder


def ppo_run(folder):
    os.makedirs(folder)
    _write(folder / "progress.csv", ("iteration", "steps", "time", "return_mean", "kl"),
           [dict(iteration=i, steps=1000 * i, time=2.0 * i, return_mean=None if i == 1 else -100.0 + i,
                 kl=0.01) for i in range(1, 6)])
    return folder


def plot(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", script)] + list(args), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_generic_names_read_the_right_column_of_each_kind(tmp_path):
    run = impala_run(tmp_path / "impala")
    x, y = plotcurve.load_curve(str(run / "metrics.csv"), "frames", "return")
    np.testing.assert_array_equal(x, [80000, 120000, 160000, 200000])  # the 'nan' row is skipped
    np.testing.assert_array_equal(y, [1, 2, 3, 4])
    x, y = plotcurve.load_curve(str(run / "metrics.csv"), "time", "fps")
    np.testing.assert_array_equal(x, [10, 20, 30, 40, 50])
    x, y = plotcurve.load_curve(str(run / "eval.csv"), "time", "return")
    np.testing.assert_array_equal(x, [0, 30, 60, 90])  # seconds since the first evaluation
    np.testing.assert_array_equal(y, [0, 2, 4, 6])
    x, y = plotcurve.load_curve(str(ppo_run(tmp_path / "ppo") / "progress.csv"), "frames", "return")
    np.testing.assert_array_equal(x, [2000, 3000, 4000, 5000])  # PPO's steps; the empty cell skipped
    np.testing.assert_array_equal(y, [-98, -97, -96, -95])


def test_a_run_folder_is_read_by_the_file_it_holds(tmp_path):
    impala, ppo = impala_run(tmp_path / "runs" / "a"), ppo_run(tmp_path / "runs" / "b")
    assert plotcurve.find_runs([str(impala)]) == [str(impala / "metrics.csv")]
    assert plotcurve.find_runs([str(ppo)]) == [str(ppo / "progress.csv")]
    assert plotcurve.find_runs([str(tmp_path / "runs")]) == [str(impala / "metrics.csv"), str(ppo / "progress.csv")]
    assert plotcurve.find_runs([str(tmp_path / "runs")], "eval") == [str(impala / "eval.csv")]
    with pytest.raises(plotcurve.PlotError, match="no eval.csv found"):
        plotcurve.find_runs([str(ppo)], "eval")


@pytest.mark.parametrize("source,x", [("auto", "frames"), ("auto", "time"), ("eval", "frames"), ("eval", "time"),
                                      ("eval", "policy_version")])
def test_impala_folders_plot_by_frames_and_by_time(tmp_path, source, x):
    runs = [impala_run(tmp_path / "r1"), impala_run(tmp_path / "r2", scale=2.0)]
    out = tmp_path / "fig.png"
    proc = plot("plotcurve.py", "--source", source, "-x", x, "-i", *map(str, runs), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG


def test_eval_frames_come_from_the_metrics_csv_beside_it(tmp_path):
    """policy_version is the learner's update count; metrics.csv logs updates next to frames
    (here 4000 frames per update): versions 15, 22, 29 interpolate, version 8 (before the
    learner's first row, at 10 updates) is left out rather than extrapolated."""
    run = impala_run(tmp_path / "impala")
    x, y = plotcurve.load_curve(str(run / "eval.csv"), "frames", "return")
    np.testing.assert_array_equal(x, [60000, 88000, 116000])
    np.testing.assert_array_equal(y, [2, 4, 6])


def test_eval_files_without_metrics_have_no_frames_and_say_so(tmp_path):
    run = impala_run(tmp_path / "r1")
    os.remove(run / "metrics.csv")
    proc = plot("plotcurve.py", "--source", "eval", "-x", "frames", "-i", str(run), "-o", str(tmp_path / "f.png"))
    assert proc.returncode == 2
    assert str(run / "eval.csv") in proc.stderr and "no frame count" in proc.stderr
    assert "-x time, -x policy_version" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_resumed_run_continues_its_time(tmp_path):
    """A run resumed into its folder appends to metrics.csv with time_s from 0 again."""
    os.makedirs(tmp_path / "run")
    _write(tmp_path / "run" / "metrics.csv", ("time_s", "frames", "mean_return_20"),
           [dict(time_s=t, frames=f, mean_return_20=1.0) for t, f in ((10, 100), (20, 200), (5, 300), (15, 400))])
    x, _ = plotcurve.load_curve(str(tmp_path / "run" / "metrics.csv"), "time", "return")
    np.testing.assert_array_equal(x, [10, 20, 25, 35])
    x, _ = plotcurve.load_curve(str(tmp_path / "run" / "metrics.csv"), "time_s", "return")
    np.testing.assert_array_equal(x, [10, 20, 5, 15])  # the raw column stays raw


def test_an_x_that_goes_back_is_not_averaged(tmp_path):
    os.makedirs(tmp_path / "a")
    _write(tmp_path / "a" / "metrics.csv", ("time_s", "frames", "mean_return_20"),
           [dict(time_s=t, frames=f, mean_return_20=1.0) for t, f in ((10, 100), (20, 300), (30, 200))])
    b = impala_run(tmp_path / "b")
    proc = plot("plotcurve.py", "-x", "frames", "-i", str(tmp_path / "a"), str(b), "-o", str(tmp_path / "f.png"))
    assert proc.returncode == 2 and str(tmp_path / "a" / "metrics.csv") in proc.stderr and "goes back" in proc.stderr


@pytest.mark.parametrize("x", ["steps", "frames", "time", "iteration"])
def test_ppo_folders_plot_by_each_x(tmp_path, x):
    runs = [ppo_run(tmp_path / "p1"), ppo_run(tmp_path / "p2")]
    out = tmp_path / "fig.png"
    proc = plot("plotcurve.py", "-x", x, "-i", *map(str, runs), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG


def test_an_unknown_column_names_the_file_and_the_columns(tmp_path):
    run = impala_run(tmp_path / "r1")
    proc = plot("plotcurve.py", "-y", "no_such_column", "-i", str(run), "-o", str(tmp_path / "f.png"))
    assert proc.returncode == 2
    assert str(run / "metrics.csv") in proc.stderr and "no column 'no_such_column'" in proc.stderr
    assert "mean_return_20" in proc.stderr


def test_an_impala_set_against_a_ppo_set_by_time(tmp_path):
    impala, ppo = impala_run(tmp_path / "impala"), ppo_run(tmp_path / "ppo")
    out = tmp_path / "cmp.png"
    proc = plot("plotcurve_cmp.py", "-x", "time", "-i", str(impala), "-b", str(ppo), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG


def test_a_resumed_run_with_newer_columns_widens_its_file_once(tmp_path):
    # A file begun by an older version (two columns), then resumed by one that appended a third cell
    # past the old header (as learners did before files were widened), then by today's four columns.
    path = tmp_path / "metrics.csv"
    path.write_text("frames,ret\n1,10\n2,20,0.5\n")
    log = RunLog(str(path), ("frames", "ret", "lag", "rate"), None)
    log.write(dict(frames=3, ret=30.0, lag=4.0, rate=1e-4), step=3)
    log.close()
    assert path.read_text().splitlines() == ["frames,ret,lag,rate", "1,10,,", "2,20,0.5,", "3,30,4,0.0001"]
    # A file that already has them, in its own order, is appended to as it is.
    log = RunLog(str(path), ("frames", "lag", "ret", "rate"), None)
    log.write(dict(frames=4, ret=40.0, lag=3.0, rate=0.0), step=4)
    log.close()
    assert path.read_text().splitlines()[-1] == "4,40,3,0"
    # A column the file has and the writer does not is kept, and left empty in new rows.
    log = RunLog(str(path), ("frames", "ret", "lag", "rate", "extra"), None)
    log.close()
    log = RunLog(str(path), ("frames", "ret"), None)
    log.write(dict(frames=5, ret=50.0), step=5)
    log.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "frames,ret,lag,rate,extra" and lines[-1] == "5,50,,,"


def test_a_resume_from_an_older_checkpoint_removes_the_rows_past_it(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("frames,ret\n100,1\n200,nan\n,3\n300,4\n400,5\n")
    assert runlog.drop_rows_after(str(path), "frames", 250) == 2
    assert path.read_text().splitlines() == ["frames,ret", "100,1", "200,nan", ",3"]
    assert runlog.drop_rows_after(str(path), "frames", 250) == 0
    assert runlog.drop_rows_after(str(tmp_path / "none.csv"), "frames", 0) == 0


def test_a_kept_copy_of_metrics_csv_is_read_as_metrics_by_its_columns(tmp_path):
    """The Atari suite keeps each run's metrics.csv beside its table under another name."""
    run = impala_run(tmp_path / "impala")
    copy = tmp_path / "atari_Pong_seed1_metrics.csv"
    copy.write_text((run / "metrics.csv").read_text())
    x, y = plotcurve.load_curve(str(copy), "frames", "return")
    np.testing.assert_array_equal(x, [80000, 120000, 160000, 200000])
    r = plot("plotcurve.py", "-x", "frames", "-i", str(copy), "-o", str(tmp_path / "copy.png"))
    assert r.returncode == 0, r.stderr


def stats(*args):
    return subprocess.run([sys.executable, "-m", "tools.runstats"] + list(args), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_runstats_reads_scores_at_frame_counts_and_medians_over_windows(tmp_path):
    a = impala_run(tmp_path / "a")
    _write(tmp_path / "b" / "metrics.csv", ("time_s", "frames", "updates", "mean_return_20", "mean_return_100"),
           [dict(time_s=i, frames=100_000 * i, updates=i, mean_return_20=1.0, mean_return_100=10.0 * i)
            for i in range(1, 4)])
    r = stats("-i", str(a), str(tmp_path / "b"), "--at", "150K", "300K", "--window", "100K:200K",
              "--window", "150K:", "--columns", "entropy", "grad_norm")
    assert r.returncode == 0, r.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in r.stdout.splitlines()[2:]}
    ra, rb = (rows[os.path.relpath(str(tmp_path / n), ROOT)] for n in ("a", "b"))
    # a: mean_return_20 (it has no mean_return_100) of the last row at or before 150K (120K: 2), and
    # "-" at 300K, which it never reached (200K)
    assert ra[2:5] == ["mean_return_20", "2", "-"]
    assert rb[2:5] == ["mean_return_100", "10", "30"]
    assert ra[5:] == ["1", "1", "1", "1 |"]
    assert rb[5:] == ["-", "-", "-", "- |"]  # b logged neither column


def test_runstats_refuses_a_column_no_run_logged_and_a_bad_frame_count(tmp_path):
    a = impala_run(tmp_path / "a")
    r = stats("-i", str(a), "--columns", "entropy", "kl_divergence")
    assert r.returncode == 2 and "kl_divergence" in r.stderr and "grad_norm" in r.stderr, r.stderr
    r = stats("-i", str(a), "--at", "ten million")
    assert r.returncode == 2 and "--at 'ten million'" in r.stderr, r.stderr
    r = stats("-i", str(a), "--window", "5M:1M")
    assert r.returncode == 2 and "--window '5M:1M'" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["¹²M", "٣٤M", "８０K"])
def test_runstats_frame_counts_take_ascii_digits_only(tmp_path, capsys, value):
    """The frame-count pattern's \\d took '٣٤M' and '８０K' as 34M and 80K (superscripts it refused)."""
    from tools import runstats
    a = impala_run(tmp_path / "a")
    for args, flag in ((["--at", value], "--at"), (["--window", value + ":"], "--window")):
        assert runstats.main(["-i", str(a)] + args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: %s %r: not a frame count (write e.g. 10M, 600K or 40000000 in ASCII digits) "
                              "(%r is " % (flag, value, value[0])) and err.count("\n") == 1, err
    with pytest.raises(SystemExit):
        plotcurve.main(["-x", "frames", "-i", str(a), "--smooth", value[:-1]])
    assert "argument --smooth: %r is not an integer" % value[:-1] in capsys.readouterr().err
