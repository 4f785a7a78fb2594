"""WALL-E's PPO: samplers (exact step counts, weights reach every sampler, dead
samplers reported, no orphans), GAE, the agent's bootstrapping, end-to-end runs
of both mains with progress.csv, and the plot scripts."""
import csv
import glob
import os
import signal
import subprocess
import sys
import time
import types

import numpy as np
import psutil
import pytest

import ppo
import samplers
from nets.gaussian import GaussianPolicy

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
    parser = ppo.add_arguments(ppo.argparse.ArgumentParser(), 1000, 1)
    return parser.parse_args([ENV] + [f"--{k}={v}" for k, v in overrides.items()])


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
    adv, ret = ppo.compute_gae(rewards, values, next_values, dones, 0.9, 0.8)
    np.testing.assert_allclose(adv, direct_gae(rewards, next_values, values, dones, 0.9, 0.8), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, adv + values, rtol=1e-6)
    # lambda 1 with next_values[t] = values[t + 1] inside an episode: discounted reward sums
    next_values[:-1] = np.where(dones[:-1] == 1, next_values[:-1], values[1:])
    adv1, _ = ppo.compute_gae(rewards, values, next_values, dones, 0.9, 1.0)
    np.testing.assert_allclose(adv1[7], rewards[7] + 0.9 * rewards[8] + 0.81 * next_values[8] - values[7], rtol=1e-5)


def test_agent_bootstraps_truncations_and_zeroes_terminations():
    agent = ppo.PPO(OBS_DIM, ACT_DIM, agent_args())
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
    rms = ppo.RunningMeanStd(4)
    for b in batches:
        rms.update(b)
    all_x = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, all_x.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, all_x.var(axis=0), rtol=1e-10)


@pytest.mark.parametrize("loss", ["kl", "clip"])
def test_update_moves_policy_and_bumps_version(loss):
    agent = ppo.PPO(OBS_DIM, ACT_DIM, agent_args(loss=loss))
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
    """A 3-iteration run of each main; shared by the plot tests."""
    base = tmp_path_factory.mktemp("ppo_runs")
    runs = {}
    for name, script, extra in [("single", "ppo_main.py", ["-b", "300"]),
                                ("parallel", "ppo_parallel_main.py", ["-b", "301", "-n", "2", "--loss", "clip"]),
                                ("parallel_again", "ppo_parallel_main.py", ["-b", "301", "-n", "2", "--loss", "clip"])]:
        logdir = str(base / name)
        proc = run_main(script, [ENV, "-it", "3", "--logdir", logdir] + extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = (logdir, proc)
    return runs


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
    p1 = run_main("plotcurve.py", ["-x", "steps", "-i", single, parallel, "-o", out1])
    p2 = run_main("plotcurve_cmp.py", ["-x", "time", "-i", parallel, "-b", single, "-o", out2])
    for proc, out in ((p1, out1), (p2, out2)):
        assert proc.returncode == 0, proc.stderr
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    bad = run_main("plotcurve.py", ["-x", "no_such_column", "-i", single, "-o", out1])
    assert bad.returncode == 2 and "no column 'no_such_column'" in bad.stderr


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
