"""The standalone benchmark scripts, each run end to end on a tiny budget (slow): they write the
files their docs promise, with figures that are what a run of that size can give."""
import csv
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")


def _bench(script, *args, timeout=600):
    out = subprocess.run([sys.executable, os.path.join("bench", script)] + list(args), cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.timeout(120)
def test_pong_impala_runs_the_net_and_rate_its_recipe_names():
    """A recipe given as --extra=--flagfile= chooses the net and the learning rate over the bench's
    defaults (SimpleConvNetAgent at 6e-4), as experiment.py parses the run's flags; a flag given
    by --extra after it still wins."""
    cases = [[], ["--extra=--flagfile=configs/pong.flags"], ["--extra=--flagfile=configs/pong_resnet.flags"],
             ["--extra=--flagfile=configs/pong_resnet.flags", "--extra=--agent_name=ResNetLSTMAgent"],
             ["--extra=--flagfile=configs/pong_resnet_lstm.flags"]]
    code = ("import json, sys\n"
            "from bench import pong_impala\n"
            "import experiment\n"
            "for extra in json.loads(sys.argv[1]):\n"
            "    sys.argv = ['pong_impala.py'] + extra\n"
            "    flags = pong_impala.run_flags(pong_impala.parse_args())\n"
            "    experiment.FLAGS.unparse_flags()\n"
            "    experiment.FLAGS(['experiment.py'] + flags)\n"
            "    print('case', experiment.FLAGS.agent_name, experiment.FLAGS.learning_rate,\n"
            "          pong_impala.last_flag(flags, 'agent_name'))\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=110)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("case ")]
    assert got == [["SimpleConvNetAgent", "0.0006", "SimpleConvNetAgent"],
                   ["SimpleConvNetAgent", "0.0005", "SimpleConvNetAgent"],
                   ["ResNetAgent", "0.00025", "ResNetAgent"],
                   ["ResNetLSTMAgent", "0.00025", "ResNetLSTMAgent"],
                   ["ResNetLSTMAgent", "0.00025", "ResNetLSTMAgent"]], r.stdout


def test_pong_impala_does_not_stop_on_the_first_short_games_after_a_resume(tmp_path):
    """A kept Pong run resumed at 14.0M frames (mean of 20: 11.5) counted 19.45 on its first 16
    restarted games: the stop at +18 must wait until the 64 restarted games could all have ended.
    Before a resume, and in a run that never stopped, the first row at the target counts."""
    sys.path.insert(0, ROOT)
    from bench import pong_impala
    with open(os.path.join(ROOT, "bench/results/2core-amd-epyc/pong_runs/resnet_lstm_lr25_seed1/metrics.csv")) as f:
        kept = [r for r in csv.DictReader(f) if int(r["frames"]) <= 14422016]  # to the stop it made
    os.makedirs(tmp_path / "kept")
    with open(tmp_path / "kept" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(kept[0]))
        w.writeheader()
        w.writerows(kept)
    assert pong_impala.threshold_row(str(tmp_path / "kept"), 18, 64) is None
    assert pong_impala.threshold_row(str(tmp_path / "kept"), 18, 0)["frames"] == "14417920"  # the stop it made
    rows = [(10.0, 5, -20.0), (20.0, 40, 18.5), (5.0, 40, 18.5), (15.0, 60, 19.0), (25.0, 110, 18.8)]
    with open(tmp_path / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "frames", "episodes", "mean_return_20"])
        w.writerows([(t, i, e, m) for i, (t, e, m) in enumerate(rows)])
    assert pong_impala.threshold_row(str(tmp_path), 18, 64)["frames"] == "1"
    assert pong_impala.threshold_row(str(tmp_path), 19.5, 64) is None
    assert pong_impala.threshold_row(str(tmp_path), 18.6, 64)["frames"] == "4"  # 19.0 at 60 < 40 + 64 games is not
    # the report of the resumed invocation counts its own rows and frames, not the earlier part's
    with open(tmp_path / "metrics.csv") as f:
        part, resumed_at = pong_impala.this_part(list(csv.DictReader(f)))
    assert [r["frames"] for r in part] == ["2", "3", "4"] and resumed_at == 1
    assert pong_impala.this_part(part) == (part, 0)


def test_passes_score_counts_a_seed_short_of_the_target_as_slowest_and_compares_medians():
    """bench/passes_score.py's table: per variant the median time to +18 over its seeds, a seed that
    never reached it slower than any that did, and the ratios to the recipe's 4 x 4."""
    import argparse
    sys.path.insert(0, ROOT)
    from bench import passes_score

    def run(t, fps, reached=True):
        return {"reached": reached, "time_to_threshold_s": t if reached else None, "median_fps": fps,
                "frames_to_threshold": t * fps if reached else None, "frames": 5e6, "ceiling_fps": 2e4,
                "bottleneck": "learner"}
    runs = {("4x4", 1): run(300, 5000), ("4x4", 2): run(400, 5000), ("4x4", 3): run(500, 5000),
            ("1x16", 1): run(150, 9000), ("1x16", 2): run(0, 9000, reached=False), ("1x16", 3): run(200, 9000)}
    lines = passes_score.table(argparse.Namespace(recipe="atari", seeds=[1, 2, 3], frames=5000000), runs)
    assert "| 4x4 | 3 of 3 | 400 s | 2.00M | 5000 | 1.00 | 1.00 |" in lines
    assert "| 1x16 | 2 of 3 | 200 s | 1.80M | 9000 | 0.50 | 1.80 |" in lines  # the short seed is the slowest
    assert "| 1x16 | 2 | not reached | (5.00M run) | 9000 | 20000 | learner |" in lines
    two = {k: v for k, v in runs.items() if k[1] != 3}  # 2 seeds: the median of a short seed and 150 s
    assert any(ln.startswith("| 1x16 | 1 of 2 | not reached |") for ln in passes_score.table(
        argparse.Namespace(recipe="atari", seeds=[1, 2], frames=5000000), two))


@pytest.mark.long
@pytest.mark.timeout(900)
def test_pong_impala_keeps_its_run_dir_and_a_stopped_run_goes_on_from_it(tmp_path):
    """--run_dir keeps the run's folder; the same command with train_w_load and a larger budget
    resumes from its checkpoint, its curve going on past the first run's frames."""
    run = str(tmp_path / "run")
    common = ["--ceiling_s", "1", "--actors", "1", "--envs_per_actor", "8", "--batch_size", "4",
              "--base_port", "18960", "--out", str(tmp_path), "--run_dir", run]
    _bench("pong_impala.py", "--frames", "30000", "--tag", "first", *common)
    assert os.listdir(os.path.join(run, "checkpoints"))
    assert "IMPALA SimpleConvNetAgent" in (tmp_path / "first.md").read_text()
    _bench("pong_impala.py", "--frames", "50000", "--tag", "second", *common,
           "--extra=--mode=train_w_load", "--extra=--load_model_url=" + run)
    with open(tmp_path / "second.csv") as f:
        frames = [float(r["frames"]) for r in csv.DictReader(f)]
    first = json.load(open(tmp_path / "first.json"))["frames"]
    assert frames[-1] >= 50000 and min(frames) <= first < max(frames)


@pytest.mark.long
@pytest.mark.timeout(600)
def test_pong_impala_reports_a_short_run_beside_its_ceiling(tmp_path):
    _bench("pong_impala.py", "--frames", "60000", "--ceiling_s", "2", "--actors", "1", "--envs_per_actor", "8",
           "--batch_size", "4", "--base_port", "18950", "--tag", "tiny", "--out", str(tmp_path))
    report = json.load(open(tmp_path / "tiny.json"))
    assert report["frames"] >= 60000 and report["median_fps"] > 0 and report["ceiling_fps"] > 0
    assert 0 < report["ratio"] < 2 and report["threshold"] is None and not report["reached"]
    with open(tmp_path / "tiny.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"frames", "fps", "entropy", "policy_lag"} <= set(rows[0])
    md = (tmp_path / "tiny.md").read_text()
    assert "| bottleneck |" in md and "--frames 60000" in md
    assert (tmp_path / "tiny.png").stat().st_size > 0


@pytest.mark.long
@pytest.mark.timeout(600)
def test_replay_compare_trains_each_variant_to_the_same_budget(tmp_path):
    _bench("replay_compare.py", "--level", "CartPole-v1", "--frames", "30000", "--capacity", "200",
           "--actors", "1", "--base_port", "19950", "--out", str(tmp_path))
    md = (tmp_path / "replay_CartPole-v1.md").read_text()
    for variant in ("queue", "queue+standard", "queue+elite"):
        assert "| %s |" % variant in md
    with open(tmp_path / "replay_CartPole-v1.csv") as f:
        curves = list(csv.DictReader(f))
    assert {r["variant"] for r in curves} == {"queue", "queue+standard", "queue+elite"}
    assert (tmp_path / "replay_CartPole-v1.png").stat().st_size > 0


@pytest.mark.long
@pytest.mark.timeout(300)
def test_walle_speedup_times_every_n(tmp_path):
    _bench("walle_speedup.py", "--max_n", "2", "--repeats", "1", "-b", "2000", "--out", str(tmp_path))
    with open(tmp_path / "walle_speedup.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["n"]) for r in rows] == [1, 2]
    assert float(rows[0]["speedup"]) == 1 and float(rows[1]["speedup"]) > 0
    assert (tmp_path / "walle_speedup.png").stat().st_size > 0


@pytest.mark.long
@pytest.mark.timeout(300)
def test_soak_samples_every_process(tmp_path):
    _bench("soak.py", "--minutes", "0.5", "--every_s", "5", "--level", "CartPole-v1", "--agent", "MLPAgent",
           "--actors", "1", "--envs_per_actor", "4", "--base_port", "19750", "--out", str(tmp_path))
    with open(tmp_path / "soak.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 4 and float(rows[-1]["learner_rss_mb"]) > 0 and "actor_0_fds" in rows[0]
    md = (tmp_path / "soak.md").read_text()
    assert "| learner |" in md and "| actor_0 |" in md and "exited during the soak" not in md
