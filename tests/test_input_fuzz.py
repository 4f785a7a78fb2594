"""Bad user inputs to a run folder (--load_model_url): a checkpoint with files missing or truncated,
an options.json edited by hand (bad JSON, not an object, wrong types, missing keys, unknown keys).
Each is one line on stderr naming the file and what would be right, never a traceback, and the
folder is left as it was."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
OPTIONS = {"level_name": "CartPole-v1", "agent_name": "MLPAgent", "seed": 3}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A tiny CartPole MLPAgent run folder: options.json and one checkpoint of a fresh agent."""
    import tensorflow as tf
    from impala import agent as agent_lib
    path = tmp_path_factory.mktemp("base") / "run"
    agent, _, _ = agent_lib.build_agent("CartPole-v1", "MLPAgent", 20)
    tf.train.CheckpointManager(tf.train.Checkpoint(agent=agent), str(path / "checkpoints"), 1).save()
    (path / "options.json").write_text(json.dumps(OPTIONS))
    return path


def _snapshot(folder):
    return {p: (os.path.getsize(p), os.path.getmtime(p)) for p in glob.glob(os.path.join(folder, "**"), recursive=True)
            if os.path.isfile(p)}


def _truncate(pattern):
    def f(run):
        for p in glob.glob(str(run / pattern)):
            with open(p, "r+b") as fh:
                fh.truncate(os.path.getsize(p) // 2)
    return f


def _remove(pattern):
    def f(run):
        for p in glob.glob(str(run / pattern)):
            os.remove(p)
    return f


def _options(text):
    def f(run):
        (run / "options.json").write_text(text)
    return f


def _run(args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiment.py")] + args, capture_output=True,
                          text=True, timeout=120, env=ENV, cwd=ROOT)


def _one_error_line(r):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [l for l in r.stderr.splitlines() if l.startswith("experiment.py: error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


CASES = [
    ("data_truncated", _truncate("checkpoints/*.data-*"), ["checkpoints/ckpt-1", "whole"]),
    ("data_removed", _remove("checkpoints/*.data-*"), ["checkpoints/ckpt-1", "whole"]),
    ("index_removed", _remove("checkpoints/*.index"), ["checkpoints/ckpt-1", "whole"]),
    ("checkpoint_file_removed", _remove("checkpoints/checkpoint"), ["`checkpoint` index file", "ckpt-1"]),
    ("checkpoint_file_garbage", lambda run: (run / "checkpoints" / "checkpoint").write_text("\x00{{garbage"),
     ["`checkpoint` index file"]),
    ("options_bad_json", _options("{garbage"), ["options.json is not readable JSON"]),
    ("options_truncated", lambda run: (run / "options.json").write_text(json.dumps(OPTIONS)[:20]),
     ["options.json is not readable JSON"]),
    ("options_a_list", _options("[1, 2]"), ["options.json must hold a JSON object"]),
    ("options_int_for_string", _options(json.dumps(dict(OPTIONS, level_name=5))),
     ['"level_name" must be a string, got 5']),
    ("options_string_for_bool", _options(json.dumps(dict(OPTIONS, normalize_observations="yes"))),
     ['"normalize_observations" must be true or false']),
    ("options_string_for_list", _options(json.dumps(dict(OPTIONS, mlp_hidden="64"))),
     ['"mlp_hidden" must be a list of strings']),
    ("options_string_for_int", _options(json.dumps(dict(OPTIONS, batch_size="8"))),
     ['"batch_size" must be an integer, got "8"']),
    ("options_bad_enum", _options(json.dumps(dict(OPTIONS, optimizer="sgdx"))),
     ['"optimizer" is "sgdx"; choose one of']),
    ("options_missing_keys", _options("{}"), ['has no "level_name", "agent_name"', "--level_name"]),
]


@pytest.fixture(scope="module")
def broken_runs(base_run, tmp_path_factory):
    """Every case's folder, broken, with its --mode=test started at once (each process spends its
    seconds loading TensorFlow, not on the folder): name -> (folder, its files before, the process)."""
    started = {}
    for name, corrupt, _ in CASES:
        run = tmp_path_factory.mktemp(name) / "run"
        shutil.copytree(base_run, run)
        corrupt(run)
        started[name] = (run, _snapshot(run), subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "experiment.py"), "--mode=test", "--load_model_url=%s" % run,
             "--test_num_episodes=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT))
    yield started
    for _, _, p in started.values():
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.parametrize("name,needles", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_a_broken_run_folder_is_one_line_naming_it(broken_runs, name, needles):
    run, before, p = broken_runs[name]
    out, err = p.communicate(timeout=300)
    line = _one_error_line(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    assert str(run) in line and all(n in line for n in needles), line
    assert _snapshot(run) == before


@pytest.mark.parametrize("corrupt", [_truncate("checkpoints/*.data-*"), _options("[]")], ids=["data", "options"])
def test_train_w_load_on_a_broken_folder_writes_nothing_into_it(base_run, tmp_path, corrupt):
    """Resuming writes into the run folder it loads (no --logdir): a broken one is refused first."""
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    corrupt(run)
    before = _snapshot(run)
    _one_error_line(_run(["--mode=train_w_load", "--load_model_url=%s" % run]))
    assert _snapshot(run) == before, "the broken folder was written into"


def test_an_unknown_options_key_is_warned_of_in_one_line(base_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    (run / "options.json").write_text(json.dumps(dict(OPTIONS, batch_sise=8)))
    r = _run(["--mode=test", "--load_model_url=%s" % run, "--test_num_episodes=1", "--logdir=%s" % (tmp_path / "t")])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = [l for l in r.stderr.splitlines() if "batch_sise" in l]
    assert str(run / "options.json") in line and "not run flags" in line, line
