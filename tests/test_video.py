"""Episodes as MP4 videos (tools/video.py): --mode=test --video_dir, sandbox/play_policy.py --video_dir
and the evaluator's --eval_video_every. Each video has one frame per agent step, the screen the
policy acted on (as many frames as the episode's length), at the env's screen size and the game's
speed; a video is whole or absent, never half-written under its finished name."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import gymnasium as gym
import imageio.v2 as imageio
import imageio_ffmpeg
import numpy as np
import pytest

from local_cluster import LocalCluster
from tests.test_experiment import CARTPOLE, _free_base_port
from tests.test_export import BLOCKED_RUN, ENV, PLAYER, ROOT, _project_modules, _run_folder
from tools import video

EPISODE = re.compile(r"episode (\d+)/\d+: return [-\d.]+, length (\d+)")
WROTE = re.compile(r"wrote (.+?\.mp4) \((\d+) frames, ([\d.]+) s at ([\d.]+) fps, ")
BREAKOUT = "BreakoutNoFrameskip-v4"


def _screen(level_name):
    """The env's own RGB screen [H, W, 3]."""
    import ale_py
    gym.register_envs(ale_py)
    env = gym.make(level_name, render_mode="rgb_array")
    env.reset(seed=0)
    screen = env.render()
    env.close()
    return screen.shape


def _videos(folder, pattern="episode_*.mp4"):
    """{file name: (frames, (height, width, 3))} of the MP4s, read back from the files; no hidden
    part-written file is left beside them."""
    assert not [f for f in os.listdir(folder) if f.startswith(".")], os.listdir(folder)
    found = {}
    for path in sorted(glob.glob(os.path.join(str(folder), pattern))):
        frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
        reader = imageio.get_reader(path)
        found[os.path.basename(path)] = (frames, reader.get_data(0).shape, reader.get_meta_data()["fps"])
        reader.close()
    return found


def _test_mode(run, *args, timeout=120):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=test", "--load_model_url=%s" % run]
                       + list(args), capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _export_and_play(run, away, *args):
    """Exports the run, then plays it from a folder outside the checkout with every module of the
    project unimportable, as a user who took the exported folder and the player away would."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=export",
                        "--load_model_url=%s" % run], capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    away.mkdir()
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-I", "-c", BLOCKED_RUN, ",".join(_project_modules()), PLAYER,
                        str(run / "exported")] + list(args), capture_output=True, text=True, timeout=120,
                       env=env, cwd=away)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _check(out, folder, shape, fps):
    """Each episode the output names has its video, of its length in frames, the env's screen size
    and fps, as the line written for it says; returns the lengths."""
    lengths = [int(n) for _, n in EPISODE.findall(out)]
    wrote = {os.path.basename(p): int(n) for p, n, _, _ in WROTE.findall(out)}
    found = _videos(folder)
    names = ["episode_%03d.mp4" % (i + 1) for i in range(len(lengths))]
    assert sorted(found) == names and [wrote[n] for n in names] == lengths, (out, found)
    assert [found[n] for n in names] == [(n, shape, fps) for n in lengths], (lengths, found)
    return lengths


@pytest.mark.slow  # trains, tests and plays with video, about 17 s
def test_cartpole_test_mode_and_the_player_write_an_mp4_per_episode(tmp_path):
    """--mode=test and the player (deterministic: the same episodes) each write episode_001.mp4, ...:
    as many frames as the episode's length (the log's and test_results.json's), 600x400 at
    CartPole's 50 fps."""
    run = tmp_path / "run"
    _run_folder(run, "CartPole-v1", "MLPAgent")
    out = _test_mode(run, "--test_num_episodes=3", "--video_dir=%s" % (tmp_path / "test videos"))
    lengths = _check(out, tmp_path / "test videos", _screen("CartPole-v1"), 50)
    assert json.load(open(run / "test_results.json"))["lengths"] == lengths
    played = _export_and_play(run, tmp_path / "away", "--episodes=3", "--deterministic",
                              "--video_dir=%s" % (tmp_path / "played"))
    assert _check(played, tmp_path / "played", _screen("CartPole-v1"), 50) == lengths


@pytest.mark.slow  # a whole training run or Atari episodes in subprocesses
def test_atari_videos_show_the_full_colour_screen_at_15_fps(tmp_path):
    """Breakout (a random policy loses its five lives in a few hundred steps; --eval_stall_frames
    caps one that stands still): one screen per agent step of 4 emulator frames, 210x160 in
    colour at 60 / 4 fps, from --mode=test's native env and the player's gymnasium one."""
    run = tmp_path / "run"
    _run_folder(run, BREAKOUT, "SimpleConvNetAgent", frame_size=(42, 42))
    options = json.load(open(run / "options.json"))
    json.dump(dict(options, width=42, height=42), open(run / "options.json", "w"))
    out = _test_mode(run, "--test_num_episodes=2", "--eval_stall_frames=800", "--video_dir=%s" % (tmp_path / "v"))
    assert (210, 160, 3) == _screen(BREAKOUT)
    lengths = _check(out, tmp_path / "v", (210, 160, 3), 15)
    assert json.load(open(run / "test_results.json"))["lengths"] == lengths
    played = _export_and_play(run, tmp_path / "away", "--episodes=1", "--video_dir=%s" % (tmp_path / "p"))
    _check(played, tmp_path / "p", (210, 160, 3), 15)


def _default_sigint():
    """Ctrl-C's default action in the child, as a terminal gives it: a suite started in the
    background (`./test.sh &`) hands its children SIGINT ignored, and Python then never raises
    KeyboardInterrupt, so the run would play all its episodes and pass the Ctrl-C by."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_only_whole_videos(tmp_path):
    """Ctrl-C (SIGINT to the process group, ffmpeg's included) in the middle of an episode: the
    episodes finished before it are whole files, the one under way leaves nothing."""
    run = tmp_path / "run"
    _run_folder(run, BREAKOUT, "SimpleConvNetAgent", frame_size=(42, 42))
    options = json.load(open(run / "options.json"))
    json.dump(dict(options, width=42, height=42), open(run / "options.json", "w"))
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=test",
                          "--load_model_url=%s" % run, "--test_num_episodes=50", "--video_dir=%s" % (tmp_path / "v")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT,
                         start_new_session=True, preexec_fn=_default_sigint)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if "episode_001.mp4" in line:
            break
    time.sleep(0.3)  # inside episode 2 (a few hundred steps, about a second)
    os.killpg(p.pid, signal.SIGINT)
    lines += p.stdout.readlines()
    assert p.wait(timeout=60) != 0
    out = "".join(lines)
    found = _videos(tmp_path / "v")
    assert sorted(found) == ["episode_%03d.mp4" % (i + 1) for i in range(len(WROTE.findall(out)))], (out, found)
    assert "episode_001.mp4" in found and len(found) < 50


@pytest.mark.parametrize("under", ["", "videos"])
def test_a_bad_video_dir_is_one_line_before_any_work(tmp_path, under):
    """A path that is a file, or lies under one: one line naming the flag and the path, at once
    (--mode=test before the checkpoint loads, the player before the policy loads)."""
    (tmp_path / "a file").write_text("x")
    bad = os.path.join(tmp_path / "a file", under) if under else tmp_path / "a file"
    t = time.time()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=test",
                        "--load_model_url=%s" % tmp_path, "--video_dir=%s" % bad], capture_output=True, text=True,
                       timeout=60, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "experiment.py: error: --video_dir=%s: %s" % (bad, _why(bad))], r.stderr
    assert time.time() - t < 15
    (tmp_path / "exported").mkdir()
    (tmp_path / "exported" / "policy.json").write_text("{}")
    r = subprocess.run([sys.executable, PLAYER, str(tmp_path / "exported"), "--video_dir=%s" % bad],
                       capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "play_policy.py: error: --video_dir=%s: %s" % (bad, _why(bad))], r.stderr


def _why(bad):
    if os.path.isfile(bad):
        return "%s is a file, not a folder" % bad
    return "cannot make the folder %s (Not a directory)" % bad


def test_a_video_is_renamed_whole_or_dropped(tmp_path):
    """EpisodeVideo writes under a hidden name and renames at close(); abort() leaves nothing. An
    odd-sized screen (libx264's yuv420p needs even sizes) gets its last row and column repeated."""
    v = video.EpisodeVideo(fps=30)
    v.start(str(tmp_path / "a.mp4"))
    for i in range(12):
        v.add(np.full((31, 45, 3), 10 * i, np.uint8))
    assert not os.path.exists(tmp_path / "a.mp4")  # its frames go to the hidden name, as ffmpeg takes them
    written = v.close()
    assert (written.frames, written.fps) == (12, 30) and "wrote %s (12 frames, 0.4 s at 30 fps, " % written.path \
        in written.line()
    assert _videos(tmp_path, "a.mp4") == {"a.mp4": (12, (32, 46, 3), 30)}
    v.start(str(tmp_path / "b.mp4"))
    v.add(np.zeros((30, 40, 3), np.uint8))
    v.abort()
    assert os.listdir(tmp_path) == ["a.mp4"]


def test_frame_rates_follow_the_game():
    assert video.fps_for(True, {"render_fps": 60}) == 15  # Atari: a screen per 4-frame agent step
    assert video.fps_for(False, {"render_fps": 50}) == 50
    assert video.fps_for(False, {}) == video.fps_for(False, {"render_fps": None}) == 30


def test_the_evaluator_records_its_first_round_and_every_kth():
    from impala.evaluator import EvalVideos
    recorder = EvalVideos.__new__(EvalVideos)
    recorder.every = 3
    assert [r for r in range(1, 11) if recorder.due(r)] == [1, 4, 7, 10]


@pytest.mark.slow  # a whole training run or Atari episodes in subprocesses
def test_a_training_run_with_eval_video_every_writes_eval_videos(tmp_path):
    """A CartPole run with the evaluator and --eval_video_every=1: videos/eval_v<version>.mp4, each
    as long as the recorded episode its line names; stopped with Ctrl-C, it leaves no part file."""
    logdir = str(tmp_path / "run")
    c = LocalCluster(1, _free_base_port(), CARTPOLE + ["--total_environment_frames=10000000", "--test_every_s=1",
                                                       "--test_num_episodes=1", "--eval_video_every=1"],
                     logdir, evaluator=True).start()
    log = os.path.join(logdir, "logs", "evaluator.log")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(re.findall(r"eval_v\d+\.mp4", _read(log))) < 2:
            assert c.evaluator_proc.poll() is None, _read(log)
            time.sleep(0.5)
    finally:
        c.stop()
    recorded = re.findall(r"policy version (\d+), a recorded episode: return [\d.]+, length (\d+); "
                          r"wrote (\S+) \((\d+) frames", _read(log))
    assert len(recorded) >= 2, _read(log)
    found = _videos(os.path.join(logdir, "videos"), "eval_v*.mp4")
    for version, length, path, frames in recorded:
        assert os.path.basename(path) == "eval_v%08d.mp4" % int(version) and int(frames) == int(length)
    last = {os.path.basename(path): int(length) for _, length, path, _ in recorded}  # a version recorded again
    assert found == {name: (length, _screen("CartPole-v1"), 50) for name, length in last.items()}, (found, last)
    rows = open(os.path.join(logdir, "eval.csv")).read().splitlines()[1:]
    assert all(row.split(",")[2] == "1" for row in rows), rows  # the recorded episode is no round's


def _read(path):
    return open(path).read() if os.path.exists(path) else ""
