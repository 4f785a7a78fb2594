"""Environments users bring and environments that crash: --env_module, entry-point ids, the spaces the
agents take and the ones they refuse, and crashing envs counted from the
actor's env batch to the learner's summary. Real gymnasium envs written by the tests into a module
outside the repository (on PYTHONPATH), real local clusters (processes, loopback gRPC)."""
import json
import os
import re
import sys
import textwrap
import time

import numpy as np
import pytest

import envs
from envs import batch as env_batch
from local_cluster import LocalCluster
from tests.test_experiment import _free_base_port, _no_leftovers, _run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = "user_envs_of_the_tests"  # a name nothing else uses: it lives in a tmp folder
FAST = ["--agent_name=MLPAgent", "--batch_size=8", "--unroll_length=20", "--envs_per_actor=4",
        "--queue_capacity=16", "--entropy_cost=0.01", "--learning_rate=0.001", "--log_every_s=1"]

USER_ENVS = '''
"""Envs of a user's module, outside the repository."""
import os

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor of LENGTH cells: +1 there, and the episode ends."""
    LENGTH = 6

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def _obs(self):
        return np.array([self.pos / self.LENGTH, 1.0])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos == self.LENGTH
        return self._obs(), float(done), done, False, {}


class RaisesOnAction2(Corridor):
    """Action 2 raises (two lines of message: only the first may be logged)."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Discrete(3)

    def step(self, action):
        if action == 2:
            raise RuntimeError("bad action 2\\nsecond line of the message")
        return super().step(action)


_counts = {"steps": 0, "resets": 0}


def _note(what):
    with open(os.environ["CRASHY_LOG"], "a") as f:
        f.write(what + "\\n")


class Crashy(Corridor):
    """During the first CRASH_STEPS step calls of its process, one step in 50 and one reset in 25
    raise; each raise is written as a line to $CRASHY_LOG, the truth the learner's count is held to."""
    CRASH_STEPS = 3000

    def reset(self, seed=None, options=None):
        _counts["resets"] += 1
        if _counts["steps"] < self.CRASH_STEPS and _counts["resets"] % 25 == 5:
            _note("reset")
            raise ValueError("reset failed on purpose")
        return super().reset(seed=seed)

    def step(self, action):
        _counts["steps"] += 1
        if _counts["steps"] < self.CRASH_STEPS and _counts["steps"] % 50 == 17:
            _note("step")
            raise ValueError("step failed on purpose")
        return super().step(action)


class AlwaysCrashes(Corridor):
    def step(self, action):
        raise RuntimeError("boom: this env never steps\\nsecond line")


class DictObs(Corridor):
    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(0.0, 1.0, (1,)),
                                                  "goal": gym.spaces.Discrete(7)})


class Image(Corridor):
    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)

    def _obs(self):
        return np.full((36, 36, 3), self.pos * 40, np.uint8)


class Gray(Image):
    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)


class FromOne(Corridor):
    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Discrete(2, start=1)

    def step(self, action):
        assert action in (1, 2), action
        return super().step(action - 1)


gym.register(id="UserCorridor-v0", entry_point=Corridor, max_episode_steps=30)
gym.register(id="UserCrashy-v0", entry_point=Crashy, max_episode_steps=30)
gym.register(id="UserAlwaysCrashes-v0", entry_point=AlwaysCrashes, max_episode_steps=30)
gym.register(id="UserDictObs-v0", entry_point=DictObs)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The users' env module in a folder outside the repository, on PYTHONPATH for the processes the
    test starts and on sys.path for this one."""
    folder = tmp_path / "user_modules"
    folder.mkdir()
    (folder / (MODULE + ".py")).write_text(textwrap.dedent(USER_ENVS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("CRASHY_LOG", str(tmp_path / "raises.txt"))
    return folder


def _summary(logdir):
    return json.load(open(os.path.join(logdir, "summary.json")))


def _log(logdir, name="learner"):
    return open(os.path.join(logdir, "logs", name + ".log")).read()


def _train(logdir, flags, num_actors=1, timeout=120):
    """A local cluster run to its frame budget; returns the cluster (all its processes ended)."""
    c = LocalCluster(num_actors, _free_base_port(), flags, logdir).start()
    try:
        assert c.wait(timeout=timeout) == 0, _log(logdir)
    finally:
        c.stop()
    _no_leftovers(c)
    return c


# --------------------------------------------------------------------------- spaces and ids


def test_spaces_pick_the_kind_and_odd_spaces_are_refused(user_module):
    spec = envs.env_spec(MODULE + ":Image")  # an entry point, registered on the fly
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == ((36, 36, 3), np.uint8, 2)
    spec = envs.env_spec(MODULE + ":UserCorridor-v0")  # gymnasium's own module:id form
    assert (spec.obs_shape, spec.obs_dtype) == ((2,), np.float32)  # vectors reach the MLP as float32
    env = envs.make_env(MODULE + ":FromOne", seed=0)
    assert env.action_space.n == 2
    assert env.step(1)[0][0] == pytest.approx(1 / 6)  # the agent's action 1 is the env's 2: a step right
    for name, needle in (("DictObs", "observation space Dict("), ("Gray", "observation space Box(0, 255, (36, 36)")):
        with pytest.raises(envs.UnknownEnvError) as e:
            envs.env_spec(MODULE + ":" + name)
        assert needle in str(e.value) and "1-D Box" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(envs.UnknownEnvError, match="names neither an id its module registers nor a class"):
        envs.env_spec(MODULE + ":NoSuchClass")
    with pytest.raises(envs.UnknownEnvError, match="importing module 'no_such_module_xyz' failed"):
        envs.env_spec("no_such_module_xyz:Env")


@pytest.mark.parametrize("args,needle", [
    (["--env_module=" + MODULE, "--level_name=UserDictObs-v0"], "observation space Dict("),
    (["--level_name=%s:DictObs" % MODULE], "observation space Dict("),
    (["--env_module=no_such_module_xyz", "--level_name=CartPole-v1"],
     "--env_module=no_such_module_xyz: importing no_such_module_xyz failed (ModuleNotFoundError"),
    (["--level_name=UserCorridor-v0"], "not a registered gymnasium id"),  # the module not imported
    (["--level_name=%s:Image" % MODULE], "needs vector observations"),  # MLPAgent on images
])
def test_unsupported_envs_give_one_line_and_exit_code_2_with_nothing_started(user_module, tmp_path, args, needle):
    r = _run_experiment(args + ["--agent_name=MLPAgent", "--logdir=%s" % (tmp_path / "run")], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("experiment.py: error:")]
    assert len(errors) == 1 and needle in errors[0], r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "run"), "nothing may be started or written"


def test_a_module_outside_the_repository_registers_an_id_that_trains(user_module, tmp_path):
    logdir = str(tmp_path / "run")
    _train(logdir, FAST + ["--env_module=" + MODULE, "--level_name=UserCorridor-v0",
                           "--total_environment_frames=4000"])
    summary = _summary(logdir)
    assert summary["frames"] >= 4000 and summary["episodes"] > 0 and summary["env_crashes"] == 0
    assert json.load(open(os.path.join(logdir, "options.json")))["env_module"] == [MODULE]


def test_an_entry_point_id_trains(user_module, tmp_path):
    logdir = str(tmp_path / "run")
    _train(logdir, FAST + ["--level_name=%s:Corridor" % MODULE, "--total_environment_frames=4000"])
    assert _summary(logdir)["frames"] >= 4000
    assert "%s:Corridor" % MODULE in _log(logdir, "actor_0")


# The sandbox example learning through the README's own command: tests/test_readme.py.


# --------------------------------------------------------------------------- envs that crash


def test_a_crash_ends_the_episode_and_the_env_is_made_anew(user_module):
    logs = []
    batch = env_batch.PythonBatch(MODULE + ":RaisesOnAction2", 2, seed=0, log=logs.append)
    obs = np.zeros((2, 2), np.float32)
    batch.reset(obs)
    for _ in range(2):
        batch.send(np.array([1, 1]))
        batch.recv(obs)
    first_env = batch.envs[0]
    batch.send(np.array([2, 1]))
    r = batch.recv(obs)
    # a termination with reward 0 and no episode statistics; the new env's first observation
    assert r.done.tolist() == [True, False] and r.reward[0] == 0 and not r.episode_end[0]
    assert r.crashes.tolist() == [1, 0] and obs[0, 0] == 0 and obs[1, 0] == pytest.approx(3 / 6)
    assert batch.envs[0] is not first_env
    assert len(logs) == 1 and "env 0" in logs[0] and "RuntimeError: bad action 2" in logs[0]
    assert "second line" not in logs[0]
    for actions in ([2, 2], [2, 0]):  # env 1's first crash is logged, env 0's second is not
        batch.send(np.array(actions))
        r = batch.recv(obs)
    assert r.crashes.tolist() == [1, 0] and len(logs) == 2 and "env 1" in logs[1]
    assert batch.total_crashes == 4
    with pytest.raises(env_batch.EnvCrashLoop, match="100 env crashes in a row"):
        for _ in range(env_batch.MAX_CRASHES_IN_A_ROW):  # 2 a call: the 50th call gives up
            batch.send(np.array([2, 2]))
            batch.recv(obs)
    assert batch.total_crashes == 4 + 100  # counted from the last success, env 1's step of [2, 0]
    batch.close()


def test_crashing_envs_train_on_and_the_learner_counts_every_crash(user_module, tmp_path):
    """An actor steps an env that raises in 2 % of its steps and 4 % of its resets during the actor's
    first 3,000 steps, so that every unroll with a crash reaches the learner well before the frame
    budget (one actor: no other one can use up the budget first): the run goes on to its budget,
    and summary.json counts exactly the raises the envs wrote down; each env's first crash is
    logged once."""
    logdir = str(tmp_path / "run")
    _train(logdir, FAST + ["--env_module=" + MODULE, "--level_name=UserCrashy-v0",
                           "--total_environment_frames=16000"], timeout=150)
    raises = open(os.environ["CRASHY_LOG"]).read().split()
    assert raises.count("step") == 60 and raises.count("reset") >= 1, raises
    summary = _summary(logdir)
    assert summary["frames"] >= 16000 and summary["episodes"] > 0
    assert summary["env_crashes"] == len(raises), (summary["env_crashes"], len(raises))
    log = _log(logdir)
    assert re.search(r"\| \d+ env crashes\n", log) and "%d env crash(es)" % len(raises) in log, log
    logged = re.findall(r"actor 0: env (\d) \(UserCrashy-v0\) crashed in (\w+)", _log(logdir, "actor_0"))
    assert 1 <= len(logged) <= 4 and len(set(e for e, _ in logged)) == len(logged), logged  # once per env


def test_an_env_that_always_crashes_ends_its_actor_with_a_clear_message(user_module, tmp_path):
    logdir = str(tmp_path / "run")
    c = LocalCluster(1, _free_base_port(), FAST + ["--env_module=" + MODULE, "--level_name=UserAlwaysCrashes-v0",
                                                   "--total_environment_frames=100000"], logdir).start()
    try:
        deadline = time.time() + 90
        while c.actor_procs[0].poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert c.actor_procs[0].returncode == 6, _log(logdir, "actor_0")
    finally:
        c.stop()
    log = _log(logdir, "actor_0")
    assert "actor 0: ERROR: 100 env crashes in a row with no successful step between" in log, log
    assert "RuntimeError: boom: this env never steps" in log and "second line" not in log
    assert len(re.findall(r"crashed in step", log)) == 4, log  # once per env
    _no_leftovers(c)


def test_replay_contents_of_another_unroll_layout_are_not_restored(tmp_path):
    """Unrolls now carry env_crashes: replay contents checkpointed without that field (by an older
    version) would fail the first update, so a resume starts that replay afresh, with a warning."""
    from impala import replay, replay_files
    specs = replay.parse_replay_parameters('[{"type": "standard", "capacity": 8, "sample_ratio": 1}]')
    old = replay.ReplayMixer(specs, 2, seed=0)
    old.add([{"action": np.zeros(4, np.int32), "reward": np.zeros(4, np.float32)} for _ in range(3)], None)
    replay_files.save(old, str(tmp_path), 7, 0, contents=True, keep=3, log=lambda m: None)
    logs = []
    fields = ["action", "reward", "env_crashes"]
    assert not replay_files.load(replay.ReplayMixer(specs, 2, seed=0), str(tmp_path / "ckpt-7"), 0, logs.append, fields)
    assert "lack the fields ['env_crashes']" in logs[0] and "starts afresh" in logs[0]
    resumed = replay.ReplayMixer(specs, 2, seed=0)
    assert replay_files.load(resumed, str(tmp_path / "ckpt-7"), 0, logs.append, fields[:2])
    assert replay_files.stored_unrolls(resumed) == 3
