"""WALL-E's PPO: samplers (exact step counts, weights reach every sampler, dead
samplers reported, no orphans), GAE, the agent's bootstrapping, the rl-zoo
options (SB3 nets, reward normalisation, joint update, their flags), end-to-end
runs of both mains with progress.csv, and the plot scripts."""
import csv
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from walle import agent as agent_lib
from walle import cli
from walle import samplers
from walle import training
from nets.gaussian import GaussianPolicy, ValueNet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "Pendulum-v1"  # obs 3, act 1: cheap
OBS_DIM, ACT_DIM = 3, 1


def make_params(version, seed=0, logvar=-1.0):
    """Random numpy policy params of the shape nets/gaussian.py exports."""
    rng = np.random.default_rng(seed)
    widths = (OBS_DIM, 30, 17, 10, ACT_DIM)
    layers = [(rng.normal(0, 1 / np.sqrt(i), (i, o)).astype(np.float32), rng.normal(0, 0.1, o).astype(np.float32))
              for i, o in zip(widths[:-1], widths[1:])]
    return {"version": version, "layers": layers, "logvar": np.full(ACT_DIM, logvar, np.float32),
            "activation": "tanh", "obs_mean": np.zeros(OBS_DIM, np.float32),
            "obs_std": np.ones(OBS_DIM, np.float32), "obs_clip": samplers.OBS_CLIP}


def agent_args(**overrides):
    """Parsed flags; a True value is a bare switch (--norm_reward)."""
    parser = cli.make_parser("", 1000, 1)
    return parser.parse_args([ENV] + [f"--{k}" if v is True else f"--{k}={v}" for k, v in overrides.items()])


ZOO = {"loss": "clip", "value_fit": "joint", "hidden": "64,64", "activation": "relu", "log_std_init": -2,
       "norm_reward": True, "adam_eps": 1e-5, "vf_coef": 0.58, "clip": 0.1, "clip_epochs": 2}


def children():
    """Our child processes, less multiprocessing's resource tracker (one per process, long-lived)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]


def wait_gone(procs, timeout=10.0):
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


@pytest.fixture
def no_orphans():
    before = {p.pid for p in children()}
    yield
    leftover = [p for p in children() if p.pid not in before]
    assert not wait_gone(leftover), f"processes left behind: {leftover}"


# ---------------------------------------------------------------------------
# Samplers.


def test_split_steps_adds_up():
    for total, n in [(1000, 10), (1001, 3), (7, 7), (20000, 6)]:
        shares = samplers.split_steps(total, n)
        assert sum(shares) == total and max(shares) - min(shares) <= 1 and len(shares) == n


def test_numpy_policy_matches_sonnet_policy():
    policy = GaussianPolicy(17, 6)
    assert policy.widths == (170, 101, 60)
    obs = np.random.default_rng(0).normal(size=(5, 17)).astype(np.float32)
    mean, logvar = policy(obs)
    params = policy.numpy_params()
    np.testing.assert_allclose(samplers.policy_mean(params["layers"], obs), mean.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(params["logvar"], np.full(6, -1.0), atol=1e-6)


def test_numpy_policy_matches_sonnet_policy_relu_sb3_nets():
    policy = GaussianPolicy(17, 6, hidden=(256, 256), activation="relu", log_std_init=-2.0)
    assert policy.widths == (256, 256)
    obs = np.random.default_rng(0).normal(size=(5, 17)).astype(np.float32)
    mean, _ = policy(obs)
    params = policy.numpy_params()
    assert params["activation"] == "relu"
    np.testing.assert_allclose(samplers.policy_mean(params["layers"], obs, "relu"), mean.numpy(), rtol=1e-4, atol=1e-5)
    assert not np.allclose(samplers.policy_mean(params["layers"], obs, "tanh"), mean.numpy(), atol=1e-3)
    np.testing.assert_allclose(params["logvar"], np.full(6, -4.0), atol=1e-6)  # logvar = 2 log_std
    assert any("log_std" in v.name for v in policy.trainable_variables)
    for (w, b), fan_in in zip(params["layers"], (17, 256, 256)):  # torch.nn.Linear's default init
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and np.abs(b).max() > bound / 2
        assert np.abs(w).max() > 0.9 * bound  # uniform over the whole range, not N(0, 1/fan_in)
    value = ValueNet(17, hidden=(256, 256), activation="relu")
    assert value.widths == (256, 256) and value(obs).shape == (5,)


def test_local_sampler_exact_steps_and_bootstrap():
    s = samplers.LocalSampler(ENV, seed=3)
    try:
        for b in (1, 250, 333):  # Pendulum episodes are 200 steps: truncations inside and at the cut
            (r,) = s.collect(make_params(7), b)
            assert len(r["reward"]) == len(r["obs"]) == len(r["action"]) == b
            assert r["truncated"][-1] or r["terminated"][-1]
            assert len(r["bootstrap_obs"]) == r["truncated"].sum()
            assert r["version"] == 7
    finally:
        s.close()


def test_rollout_cut_tells_budget_cut_from_episode_end():
    s = samplers.LocalSampler(ENV, seed=3)
    try:
        cuts = []
        for b in (200, 50, 150):  # Pendulum: the time limit ends the 1st and 3rd rollouts exactly
            (r,) = s.collect(make_params(0), b)
            assert r["truncated"][-1]
            cuts.append(r["cut"])
        assert cuts == [False, True, False]
    finally:
        s.close()


def test_parallel_samplers_exact_steps_versions_and_weights(no_orphans):
    pool = samplers.ParallelSamplers(ENV, 3, seed=0)
    try:
        assert all(not info["tensorflow_imported"] for info in pool.info)  # numpy-only samplers
        for version, b in enumerate([1000, 7, 3, 301]):
            # logvar -40: actions are the policy means, so they show which weights each sampler ran
            params = make_params(version, seed=version, logvar=-40.0)
            rollouts = pool.collect(params, b)
            assert [r["rank"] for r in rollouts] == [0, 1, 2]
            assert [len(r["reward"]) for r in rollouts] == samplers.split_steps(b, 3)
            assert sum(len(r["obs"]) for r in rollouts) == b
            for r in rollouts:
                assert r["version"] == version
                expected = samplers.policy_mean(params["layers"], r["obs"])
                np.testing.assert_allclose(r["action"], expected, rtol=1e-4, atol=1e-4)
        # samplers are seeded differently (seed + rank)
        firsts = [r["obs"][0] for r in pool.collect(make_params(9), 3)]
        assert not np.allclose(firsts[0], firsts[1])
        with pytest.raises(ValueError, match="must be >= -n"):
            pool.collect(make_params(10), 2)
    finally:
        pool.close()
    assert not any(p.is_alive() for p in pool.processes)


def test_killed_sampler_is_reported(no_orphans):
    pool = samplers.ParallelSamplers(ENV, 2, seed=0)
    try:
        pool.collect(make_params(0), 10)
        victim = pool.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(samplers.SamplerError, match=r"sampler 1 \(pid \d+\) died with exit code -9"):
            pool.collect(make_params(1), 10)
    finally:
        pool.close()
    assert not any(p.is_alive() for p in pool.processes)


def test_sampler_error_carries_traceback(no_orphans):
    pool = samplers.ParallelSamplers(ENV, 2, seed=0)
    try:
        bad = make_params(0)
        bad["layers"] = bad["layers"][:1]  # wrong shapes: the sampler raises
        with pytest.raises(samplers.SamplerError, match="sampler [01] (failed|.*died)"):
            pool.collect(bad, 10)
    finally:
        pool.close()


def test_unknown_env_reported_by_sampler(no_orphans):
    with pytest.raises(samplers.SamplerError, match="NoSuchEnv-v0"):
        samplers.ParallelSamplers("NoSuchEnv-v0", 2, seed=0)


# ---------------------------------------------------------------------------
# GAE and the agent.


def direct_gae(rewards, next_values, values, dones, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, summed up to the end of t's episode."""
    deltas = rewards + gamma * next_values - values
    adv = np.zeros(len(rewards))
    for t in range(len(rewards)):
        end = t
        while end < len(rewards) - 1 and not dones[end]:
            end += 1
        adv[t] = sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, end + 1))
    return adv


def test_gae_matches_direct_sum():
    rng = np.random.default_rng(1)
    rewards, values, next_values = (rng.normal(size=9).astype(np.float32) for _ in range(3))
    dones = np.array([0, 0, 1, 0, 0, 0, 1, 0, 1], np.float32)
    adv, ret = agent_lib.compute_gae(rewards, values, next_values, dones, 0.9, 0.8)
    np.testing.assert_allclose(adv, direct_gae(rewards, next_values, values, dones, 0.9, 0.8), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, adv + values, rtol=1e-6)
    # lambda 1 with next_values[t] = values[t + 1] inside an episode: discounted reward sums
    next_values[:-1] = np.where(dones[:-1] == 1, next_values[:-1], values[1:])
    adv1, _ = agent_lib.compute_gae(rewards, values, next_values, dones, 0.9, 1.0)
    np.testing.assert_allclose(adv1[7], rewards[7] + 0.9 * rewards[8] + 0.81 * next_values[8] - values[7], rtol=1e-5)


def test_agent_bootstraps_truncations_and_zeroes_terminations():
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args())
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(6, OBS_DIM)).astype(np.float32)
    boot = rng.normal(size=(2, OBS_DIM)).astype(np.float32)
    rollout = {"obs": obs, "action": rng.normal(size=(6, ACT_DIM)).astype(np.float32),
               "reward": rng.normal(size=6).astype(np.float32),
               "terminated": np.array([0, 1, 0, 0, 0, 0], bool), "truncated": np.array([0, 0, 0, 1, 0, 1], bool),
               "bootstrap_obs": boot, "version": 0, "rank": 0}
    params = agent.params()
    _, _, adv, ret, values = agent._advantages([rollout], params)
    v = agent.value(obs).numpy()
    vb = agent.value(boot).numpy()
    next_v = np.array([v[1], 0.0, v[3], vb[0], v[5], vb[1]])
    dones = rollout["terminated"] | rollout["truncated"]
    g = agent.args.gamma
    expected = direct_gae(rollout["reward"] * (1 - g), next_v, v, dones, g, agent.args.lam)
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-6)


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(2)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 100, 37)]
    rms = agent_lib.RunningMeanStd(4)
    for b in batches:
        rms.update(b)
    all_x = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, all_x.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, all_x.var(axis=0), rtol=1e-10)


def rollout(rank, rewards, terminated=(), truncated=(), cut=False):
    n = len(rewards)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    term[list(terminated)], trunc[list(truncated)] = True, True
    trunc[-1] |= cut
    return {"rank": rank, "reward": np.array(rewards, np.float32), "terminated": term, "truncated": trunc, "cut": cut}


def test_reward_normaliser_matches_hand_computed_running_std():
    norm = agent_lib.RewardNormaliser(gamma=0.5)
    iteration1 = [rollout(0, [1, 2, 3], terminated=[1], cut=True), rollout(1, [-1, 2], cut=True)]
    iteration2 = [rollout(0, [4, 5], truncated=[1]), rollout(1, [1, 1, 1], cut=True)]
    # Discounted returns, reset after an episode's end (not at a cut), in update order (step t of each rollout):
    # rank 0: 1, 2.5 (ends), 3 | cut, goes on: 5.5, 7.75 (time limit); rank 1: -1, 1.5 | 1.75, 1.875, 1.9375
    updates = [[1, -1], [2.5, 1.5], [3], [5.5, 1.75], [7.75, 1.875], [1.9375]]
    rewards = [[1, -1], [2, 2], [3], [4, 1], [5, 1], [1]]

    def std_after(k):  # prior: count 1e-4 of mean 0, variance 1 (SB3's RunningMeanStd), then all returns so far
        x = np.concatenate([np.array(u, np.float64) for u in updates[:k + 1]])
        c, m = 1e-4, x.sum() / (1e-4 + len(x))
        return np.sqrt((c * (1 + m ** 2) + ((x - m) ** 2).sum()) / (c + len(x)) + 1e-8)

    expected = [[r / std_after(k) for r in rs] for k, rs in enumerate(rewards)]
    out1, out2 = norm(iteration1), norm(iteration2)
    got = [[out1[0][0], out1[1][0]], [out1[0][1], out1[1][1]], [out1[0][2]],
           [out2[0][0], out2[1][0]], [out2[0][1], out2[1][1]], [out2[1][2]]]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5)
    assert norm.returns == {0: 0.0, 1: 1.9375}
    for reward, clipped in ((3.0, 10.0), (-300.0, -10.0)):  # a first step: std ~ 0.01 * |reward|, clipped
        assert agent_lib.RewardNormaliser(gamma=0.5)([rollout(0, [reward], cut=True)])[0][0] == clipped


def joint_batch(agent, n=64, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, OBS_DIM)).astype(np.float32)
    act = rng.normal(size=(n, ACT_DIM)).astype(np.float32)
    mean, logvar = agent.policy(obs)
    old_logp = agent_lib.gaussian_log_prob(act, mean, logvar).numpy()
    return [agent_lib.tf.constant(x) for x in (obs, act, rng.normal(size=n).astype(np.float32), old_logp,
                                          rng.normal(2.0, 1.0, size=n).astype(np.float32))]


def test_joint_update_decreases_its_loss_on_a_fixed_batch():
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args(**dict(ZOO, policy_lr=1e-3)))
    batch = joint_batch(agent)
    before = [v.numpy() for v in agent.policy.trainable_variables + agent.value.trainable_variables]
    loss0, value_loss0 = (float(x) for x in agent._joint_loss(*batch))
    for _ in range(30):
        agent._joint_epoch(*batch, agent_lib.tf.constant(np.arange(64).reshape(1, 64)))
    loss1, value_loss1 = (float(x) for x in agent._joint_loss(*batch))
    assert loss1 < loss0 - 0.1 and value_loss1 < value_loss0
    after = agent.policy.trainable_variables + agent.value.trainable_variables
    assert all(not np.allclose(b, a.numpy()) for b, a in zip(before, after))  # one Adam moved both nets


def test_a_joint_epoch_in_one_call_equals_its_minibatch_steps_one_by_one():
    args = agent_args(**dict(ZOO, policy_lr=1e-3))
    one_call, by_step = agent_lib.PPO(OBS_DIM, ACT_DIM, args), agent_lib.PPO(OBS_DIM, ACT_DIM, args)
    batch = joint_batch(one_call)
    minibatches = np.random.default_rng(3).permutation(64).reshape(4, 16)
    losses = one_call._joint_epoch(*batch, agent_lib.tf.constant(minibatches)).numpy()
    step = agent_lib.tf.function(by_step._joint_step_impl)
    expected = [float(step(*(agent_lib.tf.gather(x, idx) for x in batch))[1]) for idx in minibatches]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    for a, b in zip(one_call.policy.trainable_variables + one_call.value.trainable_variables,
                    by_step.policy.trainable_variables + by_step.value.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_joint_loss_normalises_advantages_per_minibatch():
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args(**ZOO))
    obs, act, adv, old_logp, ret = joint_batch(agent)
    a = agent._joint_loss(obs, act, adv, old_logp, ret)
    b = agent._joint_loss(obs, act, 3.0 * adv + 5.0, old_logp, ret)
    np.testing.assert_allclose([float(x) for x in a], [float(x) for x in b], rtol=1e-5)


@pytest.mark.parametrize("flags", [{"loss": "kl"}, {"loss": "clip"}, ZOO], ids=["kl", "clip", "zoo"])
def test_update_moves_policy_and_bumps_version(flags):
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, agent_args(**flags))
    s = samplers.LocalSampler(ENV, seed=0)
    try:
        params = agent.params()
        stats = agent.update(s.collect(params, 400), params)
    finally:
        s.close()
    assert agent.version == 1 and stats["kl"] > 0 and np.isfinite(stats["value_loss"])
    assert not np.allclose(agent.params()["layers"][0][0], params["layers"][0][0])
    assert not np.allclose(agent.params()["obs_mean"], params["obs_mean"])  # normaliser moved
    with pytest.raises(ValueError, match="version"):
        agent.update([{"rank": 0, "version": 0}], agent.params())  # params are version 1 now


def test_linear_lr_decay_scales_each_update_by_the_budget_left():
    args = agent_args(loss="clip", lr_decay="linear", max_steps=1000, policy_lr=1e-3)
    assert [training.lr_scale(args, done) for done in (0, 250, 1000)] == [1.0, 0.75, 0.0]
    assert training.lr_scale(agent_args(), 5000) == 1.0  # --lr_decay none
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, args)
    s = samplers.LocalSampler(ENV, seed=0)
    try:
        params = agent.params()
        agent.update(s.collect(params, 400), params, lr_scale=training.lr_scale(args, 250))
    finally:
        s.close()
    assert float(agent.lr.numpy()) == pytest.approx(0.75e-3)


# ---------------------------------------------------------------------------
# The mains, end to end (subprocesses, as a user runs them).


def run_main(script, args, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, script)] + args, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, **kw)


def read_progress(logdir):
    with open(os.path.join(logdir, "progress.csv"), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """A 3-iteration run of each main, the three at once (each mostly waits on its start-up and its
    samplers); shared by the plot tests. A seeded run repeats itself whatever runs beside it."""
    base = tmp_path_factory.mktemp("ppo_runs")
    runs = {}
    for name, script, extra in [("single", "ppo_main.py", ["-b", "300"]),
                                ("parallel", "ppo_parallel_main.py", ["-b", "301", "-n", "2", "--loss", "clip",
                                                                      "--eval_episodes", "2"]),
                                ("parallel_again", "ppo_parallel_main.py", ["-b", "301", "-n", "2", "--loss", "clip"])]:
        logdir = str(base / name)
        runs[name] = (logdir, subprocess.Popen([sys.executable, os.path.join(ROOT, script), ENV, "-it", "3",
                                                "--logdir", logdir] + extra, cwd=ROOT, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True))
    for name, (logdir, p) in runs.items():
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        runs[name] = (logdir, subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return runs


def test_eval_episodes_writes_the_final_policys_deterministic_returns(trained_runs):
    logdir, proc = trained_runs["parallel"]
    with open(os.path.join(logdir, "eval.json")) as f:
        result = json.load(f)
    assert result["steps"] == 3 * 301 and result["episodes"] == len(result["returns"]) == 2
    assert all(-2000 < r <= 0 for r in result["returns"])  # Pendulum: 200 steps of reward in [-16.3, 0]
    assert result["return_mean"] == pytest.approx(np.mean(result["returns"]))
    assert "eval after 903 steps" in proc.stdout
    assert not os.path.exists(os.path.join(trained_runs["single"][0], "eval.json"))  # off by default


def test_evaluate_acts_with_the_policy_mean_and_is_repeatable():
    params = make_params(0, logvar=3.0)  # wide noise that the evaluation must not use
    first = samplers.evaluate(ENV, params, 2, seed=5)
    assert len(first) == 2 and first == samplers.evaluate(ENV, params, 2, seed=5)


def test_mains_write_progress_and_tensorboard(trained_runs):
    for name, b in (("single", 300), ("parallel", 301)):
        logdir, proc = trained_runs[name]
        rows = read_progress(logdir)
        assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
        assert [int(r["steps"]) for r in rows] == [b, 2 * b, 3 * b]
        for r in rows:
            assert float(r["collect_time"]) > 0 and float(r["learn_time"]) > 0
            assert abs(float(r["collect_share"]) + float(r["learn_share"]) - 1) < 1e-3
            assert float(r["kl"]) >= 0 and r["entropy"] != ""
        assert any(r["return_mean"] != "" for r in rows)  # Pendulum episodes (200 steps) finished
        assert glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
        assert proc.stdout.count("it ") >= 3


def test_same_seed_same_run(trained_runs):
    columns = ("steps", "return_mean", "kl", "entropy", "policy_loss", "value_loss")
    a, b = (read_progress(trained_runs[name][0]) for name in ("parallel", "parallel_again"))
    assert [[r[c] for c in columns] for r in a] == [[r[c] for c in columns] for r in b]


def test_plot_scripts_write_png(trained_runs, tmp_path):
    single, parallel = trained_runs["single"][0], trained_runs["parallel"][0]
    out1, out2 = str(tmp_path / "fig.png"), str(tmp_path / "cmp.png")
    p1 = run_main("tools/plotcurve.py", ["-x", "steps", "-i", single, parallel, "-o", out1])
    p2 = run_main("tools/plotcurve_cmp.py", ["-x", "time", "-i", parallel, "-b", single, "-o", out2])
    for proc, out in ((p1, out1), (p2, out2)):
        assert proc.returncode == 0, proc.stderr
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    bad = run_main("tools/plotcurve.py", ["-x", "no_such_column", "-i", single, "-o", out1])
    assert bad.returncode == 2 and "no column 'no_such_column'" in bad.stderr


def checked_args(argv):
    """Flags through add_arguments and check_arguments, as the mains do (SystemExit 2 on a bad one)."""
    parser = cli.make_parser("", 1000, 1)
    args = parser.parse_args(argv)
    cli.check_arguments(parser, args)
    return args


@pytest.mark.parametrize("argv, message", [
    (["--hidden", "256,x"], "--hidden must be comma-separated positive widths such as 256,256, got '256,x'"),
    (["--hidden", "256,0"], "--hidden must be comma-separated positive widths"),
    (["--hidden", ","], "--hidden must be comma-separated positive widths"),
    (["--log_std_init", "-2"], "--log_std_init needs --hidden"),
    (["--value_fit", "joint"], "--value_fit joint needs --loss clip, got --loss kl"),
    (["--loss", "clip", "--value_fit", "joint", "--clip_minibatch", "1"], "--clip_minibatch must be >= 2"),
    (["--obs_clip", "0"], "--obs_clip must be > 0, got 0.0"),
    (["--vf_coef", "-1"], "--vf_coef must be > 0, got -1.0"),
    (["--adam_eps", "0"], "--adam_eps must be > 0"),
    (["--lr_decay", "linear"], "--lr_decay linear needs --max_steps"),
    (["--activation", "gelu"], "invalid choice: 'gelu'"),
    (["--value_fit", "both"], "invalid choice: 'both'"),
    # int() and float() read these as 34, 256 and 0.99; isdigit() passes '¹²', which int() refuses
    (["--hidden", "64,¹²"], "got '64,¹²' ('¹' is SUPERSCRIPT ONE)"),
    (["--hidden", "２５６,２５６"], "got '２５６,２５６' ('２' is FULLWIDTH DIGIT TWO)"),
    (["-b", "٣٤"], "argument -b/--batch_size: '٣٤' is not an integer; write ASCII digits 0-9"),
    (["--gamma", "０.９９"], "argument -g/--gamma: '０.９９' is not a number; write ASCII digits 0-9"),
])
def test_new_flags_get_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        checked_args([ENV] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_defaults_keep_walle_nets_rewards_and_update():
    args = checked_args([ENV])
    assert (args.hidden, args.activation, args.log_std_init, args.norm_reward, args.obs_clip, args.value_fit,
            args.adam_eps) == ("", "tanh", None, False, 10.0, "separate", 1e-8)
    agent = agent_lib.PPO(OBS_DIM, ACT_DIM, args)
    assert agent.reward_normaliser is None and agent.policy.log_std is None and agent.policy.widths == (30, 17, 10)
    assert agent.params()["activation"] == "tanh" and agent.params()["obs_clip"] == 10.0
    assert hasattr(agent, "value_opt") and not hasattr(agent, "joint_opt")


def load_bench():
    spec = importlib.util.spec_from_file_location("ppo_halfcheetah", os.path.join(ROOT, "bench", "ppo_halfcheetah.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_zoo_variant_is_the_rl_zoo_recipe():
    """rl-baselines3-zoo hyperparams/ppo.yml, HalfCheetah-v3/v4, in our flags: configs/ppo_halfcheetah.args,
    which bench/ppo_halfcheetah.py's zoo variant and the README's WALL-E command read."""
    bench = load_bench()
    args = checked_args([ENV, "-n", str(bench.VARIANT_SAMPLERS["zoo"])] + bench.VARIANTS["zoo"])
    got = {k: getattr(args, k) for k in ("batch_size", "num_samplers", "loss", "value_fit", "clip_minibatch",
                                         "clip_epochs", "gamma", "lam", "policy_lr", "ent_coef", "clip",
                                         "max_grad_norm", "vf_coef", "adam_eps", "target_kl", "hidden",
                                         "activation", "log_std_init", "norm_reward", "obs_clip")}
    assert got == {"batch_size": 512, "num_samplers": 2, "loss": "clip", "value_fit": "joint", "clip_minibatch": 64,
                   "clip_epochs": 20, "gamma": 0.98, "lam": 0.92, "policy_lr": 2.0633e-05, "ent_coef": 0.000401762,
                   "clip": 0.1, "max_grad_norm": 0.8, "vf_coef": 0.58096, "adam_eps": 1e-5, "target_kl": 0.0,
                   "hidden": "256,256", "activation": "relu", "log_std_init": -2.0, "norm_reward": True,
                   "obs_clip": 10.0}
    assert (args.max_steps, args.iterations) == (1_000_000, 100_000)  # the recipe's budget: 1M steps


def test_bad_flags_get_one_clear_error():
    proc = run_main("ppo_parallel_main.py", [ENV, "-b", "2", "-n", "3"])
    assert proc.returncode == 2 and "-b/--batch_size (2) must be >= -n/--num_samplers (3)" in proc.stderr
    proc = run_main("ppo_main.py", ["CartPole-v1"])
    assert proc.returncode == 2 and "continuous actions" in proc.stderr


def start_main(args, logdir):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "ppo_parallel_main.py"), ENV, "-it", "100000",
                             "-b", "200", "--logdir", logdir] + args, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_iterations(proc, logdir, count, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        path = os.path.join(logdir, "progress.csv")
        if os.path.exists(path) and len(read_progress(logdir)) >= count:
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {count} iterations within {timeout} s")


@pytest.mark.slow  # a WALL-E run and a killed sampler, about 10 s
def test_sigkilled_sampler_stops_the_run_cleanly(tmp_path):
    logdir = str(tmp_path / "run")
    proc = start_main(["-n", "2"], logdir)
    try:
        wait_for_iterations(proc, logdir, 2)
        sampler_procs = psutil.Process(proc.pid).children(recursive=True)
        assert len(sampler_procs) >= 2
        victim = next(p for p in sampler_procs if "spawn_main" in " ".join(p.cmdline()))
        victim.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "died with exit code -9" in err and "stopping the run" in err
    assert not wait_gone(sampler_procs), "sampler processes outlived the agent"


def test_ctrl_c_stops_agent_and_samplers(tmp_path):
    logdir = str(tmp_path / "run")
    proc = start_main(["-n", "2"], logdir)
    try:
        wait_for_iterations(proc, logdir, 2)
        sampler_procs = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert not wait_gone(sampler_procs), "sampler processes outlived the agent"


@pytest.mark.slow  # a WALL-E run and a killed agent, about 10 s
def test_samplers_exit_when_agent_is_killed(tmp_path):
    logdir = str(tmp_path / "run")
    proc = start_main(["-n", "2"], logdir)
    try:
        wait_for_iterations(proc, logdir, 2)
        sampler_procs = [p for p in psutil.Process(proc.pid).children(recursive=True)
                         if "spawn_main" in " ".join(p.cmdline())]
        assert len(sampler_procs) == 2
        proc.kill()  # SIGKILL: no chance to stop its samplers
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not wait_gone(sampler_procs, timeout=15), "samplers outlived a killed agent"


def test_the_hopper_recipe_is_cleanrls():
    """configs/ppo_hopper.args: CleanRL's ppo_continuous_action settings for MuJoCo, 1M steps
    (docs/results.md#continuous-control has its Hopper-v5 runs)."""
    args = checked_args(["Hopper-v5", "@" + os.path.join(ROOT, "configs", "ppo_hopper.args"), "-n", "2"])
    want = {"batch_size": 2048, "loss": "clip", "value_fit": "joint", "clip_minibatch": 64, "clip_epochs": 10,
            "gamma": 0.99, "lam": 0.95, "policy_lr": 3e-4, "lr_decay": "linear", "clip": 0.2, "max_grad_norm": 0.5,
            "vf_coef": 0.5, "adam_eps": 1e-5, "hidden": "64,64", "activation": "tanh", "log_std_init": 0.0,
            "norm_reward": True, "obs_clip": 10.0, "max_steps": 1_000_000}
    assert {k: getattr(args, k) for k in want} == want
