"""End-to-end tests of experiment.py on a real local cluster: processes, loopback
gRPC (tf.distribute.Server), real CartPole, real mpirun for two Horovod ranks."""
import csv
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from bench.faults import frames_now
from local_cluster import LocalCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PY = sys.executable
CARTPOLE = ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=8",
            "--unroll_length=20", "--envs_per_actor=4", "--queue_capacity=16",
            "--entropy_cost=0.01", "--learning_rate=0.001", "--log_every_s=1"]


UNIFORM_HALF = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
                '{"type": "standard", "capacity": 100, "sample_ratio": 0.5}]')


def _free_base_port():
    """The first base port whose 8 ports are free, searched in this pytest-xdist worker's own range
    (gw0 from 20000, gw1 from 26000, ...), so two workers never pick the same one before either binds."""
    import socket
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    start = 20000 + 6000 * (worker % 7)
    for base in range(start, start + 6000, 50):
        ok = True
        for p in range(base, base + 8):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def _no_leftovers(cluster):
    procs = [cluster.learner] + cluster.actor_procs
    for p in procs:
        assert p.poll() is not None, "process %d still running" % p.pid
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        assert cluster.logdir not in cmd, "leftover process: %s" % cmd


def _wait_for_frames(logdir, frames, learner, timeout_s):
    """The learner's frame count once it reaches `frames` (or the last one seen at the timeout);
    fails at once if the learner exits."""
    deadline, seen = time.time() + timeout_s, 0
    while time.time() < deadline and seen < frames:
        time.sleep(0.5)
        assert learner.poll() is None, open(os.path.join(logdir, "logs", "learner.log")).read()
        seen = frames_now(logdir)
    return seen


def _run_experiment(args, timeout=120):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([PY, os.path.join(ROOT, "experiment.py")] + args, capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("args,needle", [
    (["--agent_name=NoSuchAgent", "--level_name=CartPole-v1"], "--agent_name=NoSuchAgent"),
    (["--level_name=NoSuchGame-v9", "--agent_name=MLPAgent"], "--level_name=NoSuchGame-v9"),
    (["--batch_size=0"], "--batch_size"),
    (["--unroll_length=-3"], "--unroll_length"),
    (["--learning_rate=0"], "--learning_rate"),
    (["--discounting=1.5"], "--discounting"),
    (["--reward_clipping=weird"], "--reward_clipping"),
    (["--learner_hosts=localhost"], "--learner_hosts"),
    (["--actor_hosts=127.0.0.1:99999"], "--actor_hosts"),
    (["--queue_capacity=4", "--batch_size=8"], "--queue_capacity"),
    (["--mode=train_w_load"], "--load_model_url"),
    (["--mode=test", "--load_model_url=/nonexistent/run"], "/nonexistent/run"),
    (["--level_name=CartPole-v1", "--agent_name=SimpleConvNetAgent"], "MLPAgent"),
    (["--level_name=HalfCheetah-v5", "--agent_name=MLPAgent", "--mlp_hidden=64,x"], "--mlp_hidden=64,x"),
    (["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--mlp_hidden=64,¹²"],
     "--mlp_hidden=64,¹²: give positive layer widths in ASCII digits"),
    (["--batch_size=３２"], "flag --batch_size=３２: '３２' is not an integer; write ASCII digits 0-9"),
    (["--width=16"], "--width"),
    (["--min_log_std=-3", "--initial_log_std=-4"],
     "--initial_log_std=-4: give a start from the floor --min_log_std=-3"),
    (["--initial_log_std=2.5"], "--initial_log_std=2.5"),
    (["--min_log_std=-6"], "--min_log_std=-6: give a floor from -5"),
    (["--agent_name=NatureConvNetAgent", "--width=32", "--height=32"],
     "--agent_name=NatureConvNetAgent with --width=32 --height=32"),
    (["--env_backend=python", "--obs_transfer=frames"], "--obs_transfer=frames"),
    (["--learner_threads=-1"], "learner_threads"),
    (["--minibatch_over=steps"], "--vtrace_targets=batch_start"),
    (["--actor_wait_for_weights"], "--actor_wait_for_weights needs --noactor_send_ahead"),
    (["--level_name=CartPole-v1", "--agent_name=MLPLSTMAgent", "--minibatch_over=steps",
      "--vtrace_targets=batch_start"], "--agent_name=MLPLSTMAgent"),
    (["--minibatch_over=steps", "--vtrace_targets=batch_start", "--batch_size=2", "--unroll_length=5",
      "--num_minibatches=3"], "--batch_size x --unroll_length"),
])
def test_bad_input_gives_one_clear_error(args, needle, tmp_path):
    r = _run_experiment(args + ["--logdir=%s" % (tmp_path / "run")])
    assert r.returncode != 0
    err_lines = [l for l in r.stderr.splitlines() if l.strip() and "WARNING" not in l and "cuda" not in l.lower()]
    assert any(needle in l for l in err_lines), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "run"), "nothing may be started or written on bad input"


UNICODE_DIGITS = ("¹²", "٣٤", "８０")  # superscript, Arabic-Indic, fullwidth


@pytest.mark.parametrize("edited, needle", [
    ({"batch_size": 0}, "flag --batch_size=0: must be a positive integer"),
    ({"initial_log_std": 9}, "--initial_log_std=9: give a start from the floor"),
    ({"batch_size": "abc"}, "holds a value its flag refuses"),
])
def test_an_options_json_edited_out_of_range_is_one_line_naming_it(tmp_path, edited, needle):
    """Restored options are assigned, which skips the flags' validators: checked after, a value edited
    by hand is refused as the command line would refuse it, naming the file, before anything starts."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "options.json").write_text(json.dumps(dict(level_name="CartPole-v1", agent_name="MLPAgent", **edited)))
    r = _run_experiment(["--mode=test", "--load_model_url=%s" % run], timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = [l for l in r.stderr.splitlines() if l.startswith("experiment.py: error:")]
    assert str(run / "options.json") in line and needle in line, line


def test_number_flags_take_ascii_digits_only():
    """int() and float() read '٣٤' and '８０' as numbers and str.isdigit() passes '¹²', which int()
    refuses with a traceback: every number a flag holds is ASCII digits, else one line naming the
    flag and the value."""
    cases = [(["--%s=%s" % (name, v)], "flag --%s=%s: %r is not " % (name, v, v))
             for v in UNICODE_DIGITS for name in ("batch_size", "seed", "learning_rate")]
    cases += [(["--learner_hosts=127.0.0.1:" + v], "flag --learner_hosts=['127.0.0.1:%s']: must be a "
               "comma-separated list of host:port (port 1-65535 in ASCII digits)" % v) for v in UNICODE_DIGITS]
    cases += [(["--mlp_hidden=64," + v], "--mlp_hidden=64,%s: give positive layer widths in ASCII digits" % v)
              for v in UNICODE_DIGITS]
    code = ("import json, sys, experiment\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    experiment.FLAGS.unparse_flags()\n"
            "    try:\n"
            "        experiment.FLAGS(['experiment.py', '--level_name=CartPole-v1', '--agent_name=MLPAgent'] + argv)\n"
            "        experiment.validate_run()\n"
            "        print('case', json.dumps('accepted'))\n"
            "    except Exception as e:  # flags.Error, UsageError; anything else is the bug\n"
            "        print('case', json.dumps(type(e).__name__ + ' ' + str(e)))\n")
    r = subprocess.run([PY, "-c", code, json.dumps([a for a, _ in cases])], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    got = [json.loads(line[len("case "):]) for line in r.stdout.splitlines() if line.startswith("case ")]
    assert len(got) == len(cases), r.stdout
    for (argv, needle), said in zip(cases, got):
        kind, _, msg = said.partition(" ")
        assert kind in ("IllegalFlagValueError", "UsageError") and msg.startswith(needle), (argv, said)
        assert "\n" not in msg and ("(%r is " % argv[0][-2] in msg or "host:port" in msg), (argv, said)


@pytest.mark.parametrize("recipe,names,expected", [
    ("pong", "level_name width num_sgd_iter compute_dtype normalize_observations normalize_returns",
     "PongNoFrameskip-v4 42 4 auto True True"),
    # pong_resnet.flags is the Pong recipe with the deep net at half the learning rate.
    ("pong_resnet", "level_name width agent_name learning_rate num_sgd_iter clip_ratio_to normalize_returns",
     "PongNoFrameskip-v4 42 ResNetAgent 0.00025 4 batch_start True"),
    # pong_resnet_lstm.flags is that recipe with the recurrent net reading layer-normalised features.
    ("pong_resnet_lstm", "level_name agent_name learning_rate lstm_input_norm lstm_forget_bias",
     "PongNoFrameskip-v4 ResNetLSTMAgent 0.00025 True 1.0"),
    ("atari", "width queue_capacity batch_size actor_send_ahead vtrace_targets learning_rate_decay",
     "84 32 32 False batch_start linear"),
    # hopper.flags includes mujoco.flags (by a path from the repository root) and changes part of it.
    ("hopper", "level_name discounting num_minibatches minibatch_over adam_epsilon mlp_hidden actor_send_ahead "
               "actor_wait_for_weights learning_rate_decay pg_advantage normalize_rewards normalize_returns",
     "Hopper-v5 0.99 32 steps 0.00064 ['64', '64'] False True linear gae True False")])
def test_a_recipe_is_a_valid_run(recipe, names, expected):
    """configs/<recipe>.flags (what the README and the suites run) parses and passes the run checks."""
    code = ("import experiment\n"
            "experiment.FLAGS(['experiment.py', '--flagfile=configs/%s.flags'])\n"
            "experiment.validate_run()\n"
            "print('recipe', *[getattr(experiment.FLAGS, n) for n in %r.split()])\n" % (recipe, names))
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    assert "recipe " + expected in r.stdout, r.stdout


def test_reward_clipping_auto_clips_atari_games_only_and_a_given_value_wins():
    """--reward_clipping=auto (the default) is resolved once at start-up: abs_one for an Atari id of
    either family, none for every other env; a value on the command line or saved in a resumed run's
    options.json (an old run's abs_one, the old default) stays as it is."""
    cases = [(["--level_name=PongNoFrameskip-v4"], {}, "abs_one (auto: an Atari game;"),
             (["--level_name=ALE/Breakout-v5"], {}, "abs_one (auto: an Atari game;"),
             (["--level_name=CartPole-v1", "--agent_name=MLPAgent"], {}, "none (auto: not an Atari game;"),
             (["--level_name=Pendulum-v1", "--agent_name=MLPAgent"], {}, "none (auto: not an Atari game;"),
             (["--level_name=CartPole-v1", "--reward_clipping=auto"], {}, "none (auto: not an Atari game;"),
             (["--level_name=CartPole-v1", "--reward_clipping=abs_one"], {}, "abs_one (--reward_clipping=abs_one)"),
             (["--level_name=PongNoFrameskip-v4", "--reward_clipping=none"], {}, "none (--reward_clipping=none)"),
             (["--level_name=HalfCheetah-v5", "--reward_clipping=soft_asymmetric"], {},
              "soft_asymmetric (--reward_clipping=soft_asymmetric)"),
             (["--level_name=CartPole-v1"], {"reward_clipping": "abs_one"}, "abs_one (as saved in"),
             (["--level_name=CartPole-v1", "--reward_clipping=none"], {"reward_clipping": "abs_one"},
              "none (--reward_clipping=none)")]
    code = ("import json, sys, experiment\n"
            "for argv, saved in json.loads(sys.argv[1]):\n"
            "    experiment.FLAGS.unparse_flags()\n"
            "    experiment.FLAGS(['experiment.py'] + argv)\n"
            "    experiment.apply_saved_options(saved)\n"
            "    line = experiment.resolve_reward_clipping()\n"
            "    print('case', experiment.FLAGS.reward_clipping, '|', line)\n")
    r = subprocess.run([PY, "-c", code, json.dumps([[a, s] for a, s, _ in cases])], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    got = [line[len("case "):] for line in r.stdout.splitlines() if line.startswith("case ")]
    assert len(got) == len(cases), r.stdout
    for (argv, saved, expected), line in zip(cases, got):
        value, said = line.split(" | ")
        assert said.startswith("reward clipping: " + expected) and value == expected.split()[0], (argv, saved, line)
    assert "reward clipping: abs_one (auto: an Atari game; --reward_clipping=none to turn it off)" in got[0]
    assert ("reward clipping: none (auto: not an Atari game; --reward_clipping=abs_one to clip to [-1, 1])"
            in got[2])


def _restored_values(tmp_path, flag, argv, cases):
    """In a fresh process: saves options.json as a run started with `argv` would, then applies each of
    `cases` under --mode=test (a Python expression of (command line, options) pairs, in which `saved`
    is what was saved and without(k) the same less key k); the value of --flag after each."""
    code = ("import sys, experiment\n"
            "experiment.FLAGS(['experiment.py'] + %r)\n"
            "experiment.save_options(sys.argv[1])\n"
            "saved = experiment.load_saved_options(sys.argv[1])[0]\n"
            "without = lambda key: {k: v for k, v in saved.items() if k != key}\n"
            "for argv, opts in %s:\n"
            "    experiment.FLAGS.unparse_flags()\n"
            "    experiment.FLAGS(['experiment.py', '--mode=test'] + argv)\n"
            "    experiment.apply_saved_options(opts)\n"
            "    print('value', getattr(experiment.FLAGS, %r))\n") % (argv, cases, flag)
    r = subprocess.run([PY, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    return [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("value ")]


def test_test_mode_steps_the_env_backend_the_run_trained_on(tmp_path):
    """--env_backend changes what the policy sees (the native and the Python backends reset and stack
    frames differently, envs/batch.py), so a run saves it in options.json and --mode=test and
    train_w_load restore it; an options.json written before it was saved keeps the default."""
    assert _restored_values(tmp_path, "env_backend", ["--level_name=PongNoFrameskip-v4", "--env_backend=python"],
                            "(([], saved), ([], without('env_backend')))") == ["python", "auto"]


def test_a_run_saved_before_the_lstm_layer_norm_was_on_by_default_rebuilds_without_it(tmp_path):
    """--lstm_input_norm is on by default, but a run whose options.json predates the flag trained
    its LSTM on raw features, so --mode=test and train_w_load rebuild it without the norm; a saved
    value, or the command line, wins; with no options.json at all the default holds."""
    assert _restored_values(tmp_path, "lstm_input_norm", ["--agent_name=MLPLSTMAgent"],
                            "(([], saved), ([], dict(saved, lstm_input_norm=False)), ([], without('lstm_input_norm')),"
                            " (['--lstm_input_norm'], without('lstm_input_norm')), ([], {}))") == [
        "True", "False", "False", "True", "True"]


@pytest.mark.parametrize("flags,warned", [
    (["--replay_parameters=" + UNIFORM_HALF], True),
    (["--replay_parameters=" + UNIFORM_HALF, "--clip_ratio_to=fresh_batch_start"], False),
    (["--replay_parameters=" + UNIFORM_HALF, "--job_name=actor", "--task=0"], False),
    ([], False)])  # the recipe alone has no replay
def test_the_learner_warns_of_batch_start_with_replay(flags, warned):
    """configs/atari.flags (batch_start) with a replay buffer: the learner says once, naming the entry,
    that replayed unrolls' trust region restarts on every draw and which option anchors them."""
    code = ("import sys, experiment\n"
            "experiment.FLAGS(['experiment.py', '--flagfile=configs/atari.flags'] + sys.argv[1:])\n"
            "experiment.validate_run()\n")
    r = subprocess.run([PY, "-c", code] + flags, capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("warning: --clip_ratio_to=batch_start")]
    assert len(lines) == (1 if warned else 0), r.stdout
    assert not warned or "(--replay_parameters entry 1)" in lines[0] and "fresh_batch_start" in lines[0]


@pytest.mark.parametrize("flag,expected", [([], True), (["--noonednn"], False)])
def test_onednn_flag_reaches_tensorflow(flag, expected):
    """--onednn must be set before anything imports TensorFlow, which reads it only then:
    main() sets it and validate_run() is the first import of TensorFlow."""
    code = ("import sys\n"
            "import experiment\n"
            "experiment.FLAGS(['experiment.py'] + %r)\n"
            "assert 'tensorflow' not in sys.modules, 'experiment.py imported TensorFlow before set_onednn'\n"
            "experiment.set_onednn()\n"
            "experiment.validate_run()\n"
            "from tensorflow.python.util import _pywrap_util_port\n"
            "print('onednn', _pywrap_util_port.IsMklEnabled())\n" % flag)
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "onednn %s" % expected in r.stdout


@pytest.mark.long  # a whole train, Ctrl-C, resume and test run, about 50 s
def test_train_sigint_checkpoint_resume_and_test_mode(tmp_path):
    """Trains CartPole on a local cluster, stops it with SIGINT mid-run (checkpoint,
    every process gone within 30 s), resumes with train_w_load (frame counter goes
    on), then plays the policy in test mode."""
    logdir = str(tmp_path / "run")
    base = _free_base_port()
    c = LocalCluster(2, base, CARTPOLE + ["--total_environment_frames=10000000"], logdir).start()
    try:
        frames = _wait_for_frames(logdir, 40000, c.learner, 150)
        assert frames >= 40000, "training did not advance: %d frames" % frames
        t0 = time.time()
        os.killpg(c.learner.pid, signal.SIGINT)
        for p in [c.learner] + c.actor_procs:
            p.wait(timeout=max(1, 30 - (time.time() - t0)))
        assert time.time() - t0 < 30
        assert c.learner.returncode == 0
        assert all(p.returncode == 0 for p in c.actor_procs), [p.returncode for p in c.actor_procs]
    finally:
        c.stop()
    _no_leftovers(c)
    summary = json.load(open(os.path.join(logdir, "summary.json")))
    assert summary["reason"].startswith("stopped by signal")
    stopped_at = summary["frames"]
    assert stopped_at >= 40000
    assert glob.glob(os.path.join(logdir, "checkpoints", "ckpt-*.index"))
    returns_before, episodes_before = summary["mean_return_20"], summary["episodes"]
    newest = open(os.path.join(logdir, "checkpoints", "checkpoint")).read().split('"')[1]
    saved = json.load(open(os.path.join(logdir, "checkpoints", newest + ".episodes.json")))
    assert saved["episodes"] == episodes_before and len(saved["returns"]) == min(100, episodes_before)

    # Resume: the frame counter continues from the checkpoint.
    c2 = LocalCluster(2, base, ["--mode=train_w_load", "--load_model_url=" + logdir,
                                "--total_environment_frames=%d" % (stopped_at + 20000),
                                "--log_every_s=1"], logdir).start()
    try:
        assert c2.wait(timeout=150) == 0, open(os.path.join(logdir, "logs", "learner.log")).read()
    finally:
        c2.stop()
    _no_leftovers(c2)
    log = open(os.path.join(logdir, "logs", "learner.log")).read()
    m = re.search(r"resumed from \S+ at (\d+) frames", log)
    assert m and int(m.group(1)) == stopped_at, log
    summary2 = json.load(open(os.path.join(logdir, "summary.json")))
    assert summary2["frames"] >= stopped_at + 20000
    # First returns after resume are in line with those before (not back to random ~22).
    assert summary2["mean_return_20"] >= 0.5 * returns_before, (returns_before, summary2)
    # The episode statistics go on from the checkpoint's: the resumed run's first row counts the
    # games before the stop and averages over them (it does not start from its first new game).
    rows = [r for r in csv.DictReader(open(os.path.join(logdir, "metrics.csv"))) if int(r["frames"]) > stopped_at]
    assert int(rows[0]["episodes"]) >= episodes_before, (episodes_before, rows[0])
    assert summary2["episodes"] > episodes_before

    r = _run_experiment(["--mode=test", "--load_model_url=" + logdir, "--test_num_episodes=3", "--render"])
    assert r.returncode == 0, r.stderr
    result = json.load(open(os.path.join(logdir, "test_results.json")))
    assert result["episodes"] == 3 and result["mean_return"] > 0
    assert os.path.getsize(os.path.join(logdir, "test_episodes.gif")) > 1000


# An actor killed mid-run while the learner trains on: tests/test_faults.py (kill_actor).


@pytest.mark.slow  # the default suite steps the LSTM agent (test_nets.py)
def test_recurrent_agent_trains_end_to_end(tmp_path):
    """An LSTM agent's state goes around the actors' traced step (a concrete function called
    with the state it returned) and reaches the learner with the unrolls."""
    logdir = str(tmp_path / "run")
    args = ["--agent_name=MLPLSTMAgent" if a.startswith("--agent_name") else a for a in CARTPOLE]
    c = LocalCluster(2, _free_base_port(), args + ["--total_environment_frames=20000"], logdir).start()
    try:
        assert c.wait(timeout=150) == 0
    finally:
        c.stop()
    assert json.load(open(os.path.join(logdir, "summary.json")))["frames"] >= 20000
    _no_leftovers(c)


def _policy_lags(tmp_path, name, extra):
    """The logged mean policy lag of each metrics row of a one-actor CartPole run whose unroll is a batch."""
    logdir = str(tmp_path / name)
    flags = [f for f in CARTPOLE if not f.startswith(("--batch_size", "--envs_per_actor"))]
    c = LocalCluster(1, _free_base_port(), flags + ["--batch_size=4", "--envs_per_actor=4", "--prefetch_batches=0",
                                                    "--noactor_send_ahead", "--total_environment_frames=12000"]
                     + extra, logdir).start()
    try:
        assert c.wait(timeout=150) == 0
    finally:
        c.stop()
    _no_leftovers(c)
    return [float(r["policy_lag"]) for r in csv.DictReader(open(os.path.join(logdir, "metrics.csv")))]


def test_an_actor_that_waits_for_weights_trains_the_learner_on_its_current_policy(tmp_path):
    """--actor_wait_for_weights: every batch acted on the learner's newest weights (lag 0), where an
    actor that only waits for its unroll to be queued acts on weights a batch old."""
    waited = _policy_lags(tmp_path, "waits", ["--actor_wait_for_weights"])
    assert waited and max(waited) == 0, waited
    queued = _policy_lags(tmp_path, "queued", [])
    print("policy lag per metrics row: waiting %s, queued %s" % (waited, queued))
    assert sum(queued) / len(queued) > 0.5, queued


def test_learner_without_actors_exits_when_told(tmp_path):
    """Exits 4 when no actor comes; on the way it says its reward clipping, and --learner_threads=1
    (the throughput suite's setting) reaches TensorFlow."""
    logdir = str(tmp_path / "run")
    r = _run_experiment(["--job_name=learner", "--learner_hosts=127.0.0.1:%d" % _free_base_port(),
                         "--logdir=" + logdir, "--exit_when_no_actors_s=3", "--actor_timeout_s=1",
                         "--learner_threads=1"] + CARTPOLE, timeout=90)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "no actor has sent anything" in r.stdout
    assert "TensorFlow threads: 1\n" in r.stdout, r.stdout
    # --reward_clipping=auto, resolved at start-up: said once, and saved resolved for a resume or a test
    assert r.stdout.count("[learner 0] reward clipping: none (auto: not an Atari game; "
                          "--reward_clipping=abs_one to clip to [-1, 1])\n") == 1, r.stdout
    assert json.load(open(os.path.join(logdir, "options.json")))["reward_clipping"] == "none"


def test_two_horovod_ranks_hold_identical_weights(tmp_path):
    """mpirun -np 2: each rank serves one actor; after training both ranks'
    weights hash the same (gradients averaged with allreduce). The hash covers the published
    observation and return statistics too, which each rank moves with the allreduce mean of
    the ranks' batch moments: without it they would differ; the actors' discounted returns reach
    both ranks' reward statistics (--normalize_rewards) the same way. With --compute_dtype=auto the ranks
    choose their precision together, on the mean of their timings: ranks that traced different
    updates would wait for each other's allreduces for ever (two ranks that chose apart did)."""
    logdir = str(tmp_path / "run")
    c = LocalCluster(2, _free_base_port(), CARTPOLE + ["--total_environment_frames=8000", "--normalize_observations",
                                                       "--normalize_returns", "--normalize_rewards", "--compute_dtype=auto"],
                     logdir,
                     num_learners=2).start()
    try:
        assert c.wait(timeout=240) == 0, open(os.path.join(logdir, "logs", "learner.log")).read()
    finally:
        c.stop()
    log = open(os.path.join(logdir, "logs", "learner.log")).read()
    chosen = dict(re.findall(r"\[learner (\d)\] compute dtype (\w+) \(--compute_dtype=auto: .*, the mean over the "
                             r"ranks\)", log))
    assert set(chosen) == {"0", "1"} and chosen["0"] == chosen["1"], log
    sums = dict(re.findall(r"\[learner (\d)\] final weights sha256 ([0-9a-f]{64})", log))
    assert set(sums) == {"0", "1"}, log
    assert sums["0"] == sums["1"]
    rewards = dict(re.findall(r"\[learner (\d)\] final reward statistics mean \S+ var (\S+)", log))
    assert set(rewards) == {"0", "1"} and rewards["0"] == rewards["1"] and float(rewards["0"]) != 1.0, log  # moved
    updates = re.findall(r"\[learner \d\] .* after (\d+) frames", log)
    assert len(updates) == 2 and updates[0] == updates[1]


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_pong_learns_with_the_native_backend_within_a_frame_budget(tmp_path):
    """Pong through ale-py's native vector env (the actors' default for Atari) learns with
    the settings of `bench/run.py pong_long` (configs/pong.flags): the mean return of the last
    20 games climbs from random play (about -20.5) to 0, as many points won as lost, within 4M
    frames (seed 1 passed 0 at 1.38M and 1.39M frames in the recipe's two runs and +5 at 1.55M
    and 1.64M: bench/results/2core-amd-epyc/pong_normalize.md; the run stops there). A frame
    budget: a slow machine only takes longer (about 3 minutes at 8K frames/s to 1.4M). The recipe
    times its precision (--compute_dtype=auto): bfloat16 alone ran 4.8x slower on an AMD EPYC
    without AVX-512 and CI ran out of time. A run that cannot finish says how far it got."""
    from bench import run as harness
    a = dict(zip(harness.PONG_LEARNS[0:8:2], harness.PONG_LEARNS[1:8:2]))
    recipe = [f.split("=", 1)[1] for f in harness.PONG_LEARNS[8:]]  # --flagfile=configs/pong.flags
    flags = recipe + ["--seed=1", "--log_every_s=10", "--envs_per_actor=" + a["--envs_per_actor"],
                      "--batch_size=" + a["--batch_size"], "--unroll_length=" + a["--unroll_length"],
                      "--total_environment_frames=4000000", "--env_backend=native"]
    logdir = str(tmp_path / "run")
    c = LocalCluster(int(a["--actors"]), _free_base_port(), flags, logdir).start()
    best, rows, deadline = -21.0, [], time.time() + 1650  # before pytest's timeout, to say why
    try:
        while c.wait(timeout=10) is None and time.time() < deadline:
            path = os.path.join(logdir, "metrics.csv")
            rows = list(csv.DictReader(open(path))) if os.path.exists(path) else []
            best = max([best] + [float(r["mean_return_20"]) for r in rows if r["mean_return_20"] != "nan"])
            if best >= 0.0:
                break
    finally:
        c.stop()
    learner_log = open(os.path.join(logdir, "logs", "learner.log")).read()
    dtype = re.search(r"compute dtype .*", learner_log)
    assert best >= 0.0, "best mean-20 return %.2f after %s frames at %s frames/s (%s)" % (
        best, rows[-1]["frames"] if rows else 0, rows[-1]["fps"] if rows else "?", dtype and dtype.group(0))


def test_local_cluster_names_the_run_folder_from_flag_files(tmp_path):
    """The run folder is named after --level_name and placed at --logdir as experiment.py reads them,
    flag files included (the last one wins): a run from configs/reach_target.flags is not 'Pong'."""
    from local_cluster import flag_value
    inner = tmp_path / "inner.flags"
    inner.write_text("# a comment\n--level_name=Inner-v0\n--logdir=/runs/a\n")
    outer = tmp_path / "outer.flags"
    outer.write_text("--flagfile=%s\n--batch_size=8\n" % inner)
    assert flag_value(["--flagfile=%s" % outer], "level_name", "PongNoFrameskip-v4") == "Inner-v0"
    assert flag_value(["--flagfile=%s" % outer, "--level_name=Last-v1"], "level_name", None) == "Last-v1"
    assert flag_value(["--flagfile=%s" % outer], "logdir", None) == "/runs/a"
    assert flag_value(["--batch_size=8"], "logdir", None) is None
    r = subprocess.run([PY, os.path.join(ROOT, "local_cluster.py"), "--", "--flagfile=/nonexistent.flags"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 2 and "--flagfile" in r.stderr and "/nonexistent.flags" in r.stderr, r.stderr
