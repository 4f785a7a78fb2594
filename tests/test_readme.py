"""The README as a newcomer meets it: its shape (the title first, at most 150 lines, a standing table
of at most 10 rows with short cells, one picture under 200 KB, at most 8 limits), and every command it
shows run as written, here or by the test named for it (or marked 'not tested here' beside it).

The commands that train run from the repository root as a user would; the run folders they leave
under results/ are removed after each test."""
import csv
import glob
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PY = ".venv/bin/python"

TRAIN = "./train.sh"
TENSORBOARD = ".venv/bin/tensorboard --logdir results"
PLOT = ".venv/bin/python tools/plotcurve.py -x frames -i 'results/CartPole-v1_*' -o cartpole.png"
TEST_MODE = ".venv/bin/python experiment.py --mode=test --load_model_url=results/<run> --test_num_episodes=10"
ATARI = ("%s local_cluster.py --num_actors=2 -- --flagfile=configs/atari.flags "
         "--level_name=BreakoutNoFrameskip-v4" % PY)
OWN_ENV = "%s local_cluster.py --num_actors=1 -- --flagfile=configs/reach_target.flags" % PY
RACK = ("%s run_experiment_mm_raw.py --workers_csv_path=sandbox/local_workers_example.csv "
        "--flagfile=configs/cartpole.flags --follow" % PY)
WALLE = "%s ppo_parallel_main.py HalfCheetah-v5 @configs/ppo_halfcheetah.args -n 2" % PY
EXPORT = "%s experiment.py --mode=export --load_model_url=results/<run>" % PY
PLAY = "%s sandbox/play_policy.py results/<run>/exported --episodes 10 --deterministic" % PY
# README commands run elsewhere: command -> (file, the text of the command that file runs)
ELSEWHERE = {
    "./install.sh": (".ci/run", "./test.sh"),  # test.sh runs install.sh first
    "./test.sh": (".ci/run", "./test.sh"),
    "./test.sh -m slow": (".ci/run", "./test.sh -m slow"),
    "./test.sh -m docker": (".ci/run", "./test.sh -m docker"),
    "HYPOTHESIS_PROFILE=random ./test.sh tests/test_properties.py": (".ci/run", "HYPOTHESIS_PROFILE=random"),
    "sbatch --ntasks=3 sandbox/slurm_impala.sbatch --flagfile=configs/cartpole.flags":
        ("tests/test_slurm.py", "README_SBATCH"),
    "docker/build.sh && NUM_ACTORS=2 docker-compose -f docker/docker-compose.yml up":
        ("tests/test_docker.py", "NUM_ACTORS=str(num_actors)"),
}
HERE = {TRAIN, TENSORBOARD, PLOT, TEST_MODE, ATARI, OWN_ENV, RACK, WALLE, EXPORT, PLAY}


def _readme():
    return open(README).read().splitlines()


def readme_commands():
    """The README's commands: its indented code lines, without a trailing comment."""
    found = []
    for line in _readme():
        if line.startswith("    ") and line.strip():
            found.append(re.sub(r"\s+#.*$", "", line.strip()))
    return found


def test_every_readme_command_is_run_by_a_test():
    commands = readme_commands()
    untested = [c for c in commands if c not in HERE and c not in ELSEWHERE]
    assert not untested, "README commands no test runs (add them to tests/test_readme.py): %s" % untested
    for command, (path, text) in ELSEWHERE.items():
        assert text in open(os.path.join(ROOT, path)).read(), "%s does not run %r" % (path, command)
    assert set(commands) >= HERE, sorted(HERE - set(commands))


def test_readme_shape():
    lines = _readme()
    assert lines[0].startswith("# ") and len(lines) <= 150, (lines[0], len(lines))
    table = [line for line in lines[lines.index("## Where it stands"):] if line.startswith("| ")]
    rows = table[1:table.index(next(t for t in table[1:] if t.startswith("| page |")))] if any(
        t.startswith("| page |") for t in table) else table[1:]
    rows = [r for r in rows if not r.startswith("|---")]
    assert 0 < len(rows) <= 10, rows
    long_cells = [c.strip() for r in rows for c in r.strip("|").split("|") if len(c.strip()) > 100]
    assert not long_cells, long_cells
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", "\n".join(lines))
    assert len(pictures) == 1 and os.path.getsize(os.path.join(ROOT, pictures[0])) <= 200_000, pictures
    limits = lines[lines.index("## Limits"):]
    limits = [line for line in limits[:next(i for i, x in enumerate(limits[1:], 1) if x.startswith("## "))]
              if line.startswith("- ")]
    assert 0 < len(limits) <= 8, limits


def test_cartpole_recipe_is_the_benchmarks_settings():
    """configs/cartpole.flags (train.sh, the README's rack and Slurm commands) and
    bench/cartpole_impala.FLAGS (the CartPole figures) are one recipe."""
    from bench import cartpole_impala
    recipe = [line for line in open(os.path.join(ROOT, "configs", "cartpole.flags")).read().splitlines()
              if line.startswith("--")]
    timing = ("--log_every_s", "--total_environment_frames")
    assert sorted(f for f in recipe if not f.startswith(timing)) == sorted(
        f for f in cartpole_impala.FLAGS if not f.startswith(timing))


# ------------------------------------------------------------------ running them as written
def _new_runs(before, pattern):
    return sorted(set(glob.glob(os.path.join(ROOT, "results", pattern))) - before)


@pytest.fixture
def results_dir_cleanup():
    """Removes the run folders a README command leaves under results/ (and the plot it writes)."""
    import shutil
    before = set(glob.glob(os.path.join(ROOT, "results", "*")))
    yield before
    for path in set(glob.glob(os.path.join(ROOT, "results", "*"))) - before:
        shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(os.path.join(ROOT, "cartpole.png")) and not any("cartpole.png" in b for b in before):
        os.remove(os.path.join(ROOT, "cartpole.png"))


def _start(command):
    """The command in its own process group, its output gathered by a thread into proc.said."""
    proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    proc.said = []
    threading.Thread(target=_gather, args=(proc,), daemon=True).start()
    return proc


def _gather(proc):
    for line in proc.stdout:
        proc.said.append(line)


def _wait_for(proc, pattern, timeout):
    """Waits until `pattern` shows in the process's output or it ends; the output so far."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not re.search(pattern, "".join(proc.said)):
        time.sleep(0.2)
    return "".join(proc.said)


def _interrupt(proc, timeout=90):
    """Ctrl-C as a terminal sends it (to the whole process group); all the output."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("still running %d s after Ctrl-C:\n%s" % (timeout, "".join(proc.said)[-3000:]))
    time.sleep(0.5)  # the reader thread's last lines
    return "".join(proc.said)


def _checkpoint(run):
    return glob.glob(os.path.join(run, "checkpoints", "*.index"))


@pytest.mark.slow  # a whole CartPole run
def test_quickstart_train_then_tensorboard_plot_and_test_mode(results_dir_cleanup):
    done = subprocess.run(["bash", "-c", TRAIN], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\[learner 0\] frames .* fps \| return", done.stdout + done.stderr)
    (run,) = _new_runs(results_dir_cleanup, "CartPole-v1_*")
    assert _checkpoint(run)
    rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv"))))
    best = max(float(r["mean_return_20"]) for r in rows if r["mean_return_20"] != "nan")
    assert best >= 475, "the quickstart's best mean-20 return was %.1f" % best
    board = _start(TENSORBOARD)
    try:
        said = _wait_for(board, r"http://\S+:\d+", 60)
        assert re.search(r"http://\S+:\d+", said), said
    finally:
        os.killpg(board.pid, signal.SIGTERM)
        board.wait(timeout=30)
    plot = subprocess.run(["bash", "-c", PLOT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0 and os.path.getsize(os.path.join(ROOT, "cartpole.png")) > 0, plot.stderr
    for command in (TEST_MODE, EXPORT, PLAY):  # test mode, then the policy taken away and played
        done = subprocess.run(["bash", "-c", command.replace("results/<run>", os.path.relpath(run, ROOT))],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, command + "\n" + done.stdout[-2000:] + done.stderr[-2000:]
    assert os.path.exists(os.path.join(run, "exported", "policy.json"))


@pytest.mark.slow  # local_cluster.py on ReachTarget-v0 to its budget, then test mode: about 35 s
def test_own_env_command_learns_and_test_mode_finds_the_env(results_dir_cleanup):
    """sandbox/custom_env.py's ReachTarget-v0 (random play scores about -1.0) passes a mean return
    of 0.5 within the recipe's 200K frames (about 30K in the runs so far); test mode then finds the
    env through the --env_module saved with the run."""
    done = subprocess.run(["bash", "-c", OWN_ENV], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = _new_runs(results_dir_cleanup, "ReachTarget-v0_*")
    assert _checkpoint(run)
    assert "reward clipping: none" in done.stdout
    rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv"))))
    best = max(float(r["mean_return_20"]) for r in rows if r["mean_return_20"] != "nan")
    assert best >= 0.5, "best mean-20 return %.2f in %s frames" % (best, rows[-1]["frames"])
    test = subprocess.run([PY, "experiment.py", "--mode=test", "--load_model_url=" + run, "--test_num_episodes=10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert test.returncode == 0, test.stderr[-3000:]
    assert json.load(open(os.path.join(run, "test_results.json")))["mean_return"] > 0.3


@pytest.mark.slow  # the Atari recipe's start-up and its first 30-s progress line, about a minute
def test_atari_command_trains_and_stops_on_ctrl_c(results_dir_cleanup):
    proc = _start(ATARI)
    said = _wait_for(proc, r"\[learner 0\] frames", 240)
    assert "[learner 0] frames" in said, said[-3000:]
    said = _interrupt(proc)
    assert proc.returncode in (0, 130), said[-3000:]
    (run,) = _new_runs(results_dir_cleanup, "BreakoutNoFrameskip-v4_*")
    assert _checkpoint(run), said[-3000:]
    assert "reward clipping: abs_one" in said


@pytest.mark.slow  # a CartPole run under tmux and mpirun; the default suite has the frontend in test_frontend.py
def test_rack_command_trains_and_ctrl_c_stops_everything(results_dir_cleanup):
    proc = _start(RACK)
    said = _wait_for(proc, r"\[learner 0\] frames", 240)
    assert "[learner 0] frames" in said, said[-3000:]
    said = _interrupt(proc)
    assert proc.returncode in (0, 130) and "stopping the run" in said, said[-3000:]
    (run,) = _new_runs(results_dir_cleanup, "CartPole-v1_*")
    assert _checkpoint(run), said[-3000:]


@pytest.mark.slow  # a WALL-E run under Ctrl-C, about 15 s
def test_walle_command_trains_and_stops_on_ctrl_c(results_dir_cleanup):
    proc = _start(WALLE)
    said = _wait_for(proc, r"(?m)^it +\d+ \| steps", 180)
    said = _interrupt(proc)
    assert proc.returncode in (0, 130), said[-3000:]
    (run,) = _new_runs(results_dir_cleanup, "ppo_HalfCheetah-v5_*")
    assert glob.glob(os.path.join(run, "checkpoints", "ckpt-*")), said[-3000:]
