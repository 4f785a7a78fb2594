"""Experience collection for WALL-E's PPO: the agent collects itself (-n 1), or
N sampler processes collect in parallel (-n N).

    samplers = make_samplers("HalfCheetah-v5", num_samplers=4, seed=0)
    rollouts = samplers.collect(params, total_steps=1000)   # list, one per sampler
    samplers.close()

`params` is what the agent hands out each iteration (agent.PPO.params()):

    {"version": int, "layers": [(W, b), ...], "logvar": [A], "activation": "tanh" | "relu",
     "obs_mean": [D], "obs_std": [D], "obs_clip": float}

Parallel layout (WALL-E's figure 2):

    agent --policy queue (one per sampler): (params, num_steps) or None--> sampler k
    agent <--experience queue (shared): ("ready" | "rollout" | "error", rank, payload)-- sampler k

Each iteration the agent sends the same params to every sampler, with an equal
share of the step budget (the first `total % N` samplers take one step more),
and waits for exactly N rollouts, checking each one's policy version. While it
waits it checks every sampler process is alive, so a sampler that crashes or is
killed is reported with its rank and exit code instead of hanging the run.

Samplers import numpy and gymnasium only (never TensorFlow): the policy is a
few numpy matmuls on the weights they receive. Processes are started with the
"spawn" method (TF and fork do not mix); the script that starts them must keep
its TensorFlow imports out of module level, since spawn re-imports it in each
child. Each sampler keeps its env between iterations: an episode cut by the
step budget goes on next iteration, and the cut step is marked `truncated`
with the observation to bootstrap from, as for a time-limit truncation.

Rollout (one per sampler and iteration), numpy, T = its step share:
    obs [T, D] float32 (raw, before normalisation), action [T, A] float32
    (as sampled, before clipping to the action bounds), reward [T] float32,
    terminated [T] bool (no bootstrap), truncated [T] bool (time limit or the
    cut at T: bootstrap from V(bootstrap_obs)), bootstrap_obs [K, D] (one row
    per truncated step, in order), cut bool (the last step is only the cut at
    T: its episode goes on in this sampler's next rollout), episode_returns /
    episode_lengths (episodes that finished in this rollout), version, rank,
    collect_s.
"""
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
import traceback

import numpy as np

import envs

OBS_CLIP = 10.0  # default of --obs_clip
WAIT_POLL_S = 0.5  # how often the agent checks sampler liveness while it waits
PARENT_POLL_S = 1.0  # how often an idle sampler checks the agent is alive
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class SamplerError(RuntimeError):
    """A sampler process failed, died, or stopped answering."""


# ---------------------------------------------------------------------------
# The policy in numpy.


ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}  # as nets/gaussian.py's


def normalise_obs(obs, mean, std, clip=OBS_CLIP):
    return np.clip((obs - mean) / std, -clip, clip).astype(np.float32)


def policy_mean(layers, x, activation="tanh"):
    """The Gaussian policy's mean: `activation` hidden layers, linear output (nets/gaussian.py)."""
    act = ACTIVATIONS[activation]
    for w, b in layers[:-1]:
        x = act(x @ w + b)
    w, b = layers[-1]
    return x @ w + b


def evaluate(env_id, params, episodes, seed):
    """Returns of `episodes` whole episodes acting with the policy's mean (no exploration
    noise), as rl-baselines3-zoo evaluates (deterministic=True); env seeds seed, seed + 1, ..."""
    env, returns = envs.make_env(env_id, seed=seed), []
    try:
        low, high = env.action_space.low, env.action_space.high
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                x = normalise_obs(obs, params["obs_mean"], params["obs_std"], params["obs_clip"])
                mean = policy_mean(params["layers"], x, params["activation"])
                obs, reward, terminated, truncated, _ = env.step(np.clip(mean, low, high))
                total, done = total + float(reward), terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns


def split_steps(total_steps, num_samplers):
    """Step shares that add up to exactly `total_steps`."""
    base, extra = divmod(total_steps, num_samplers)
    return [base + (1 if k < extra else 0) for k in range(num_samplers)]


# ---------------------------------------------------------------------------
# One sampler: an env plus a numpy copy of the policy.


class Sampler:

    def __init__(self, env_id, seed, rank):
        self.rank = rank
        self.env = envs.make_env(env_id, seed=seed + rank)
        space = self.env.action_space
        if not hasattr(space, "low") or len(space.shape) != 1:
            raise ValueError(f"{env_id} has action space {space}; PPO here needs a 1-D Box (continuous)")
        self.low, self.high = space.low, space.high
        self.act_dim = space.shape[0]
        self.rng = np.random.default_rng([seed, rank])
        self.obs, _ = self.env.reset()

    def collect(self, params, num_steps):
        t_start = time.perf_counter()
        layers, std = params["layers"], np.exp(0.5 * params["logvar"])
        activation, obs_clip = params["activation"], params["obs_clip"]
        obs_mean, obs_std = params["obs_mean"], params["obs_std"]
        obs_buf = np.empty((num_steps,) + self.obs.shape, np.float32)
        act_buf = np.empty((num_steps, self.act_dim), np.float32)
        rew_buf = np.empty(num_steps, np.float32)
        terminated_buf = np.zeros(num_steps, bool)
        truncated_buf = np.zeros(num_steps, bool)
        bootstrap_obs, episode_returns, episode_lengths, cut_only = [], [], [], False
        for t in range(num_steps):
            mean = policy_mean(layers, normalise_obs(self.obs, obs_mean, obs_std, obs_clip), activation)
            action = mean + std * self.rng.standard_normal(self.act_dim)
            next_obs, reward, terminated, truncated, info = self.env.step(
                np.clip(action, self.low, self.high))
            obs_buf[t], act_buf[t], rew_buf[t] = self.obs, action, reward
            if "episode" in info:
                episode_returns.append(float(info["episode"]["r"]))
                episode_lengths.append(int(info["episode"]["l"]))
            cut = t == num_steps - 1
            cut_only = cut and not (terminated or truncated)
            if terminated:
                terminated_buf[t] = True
            elif truncated or cut:
                truncated_buf[t] = True
                bootstrap_obs.append(next_obs)
            if terminated or truncated:
                self.obs, _ = self.env.reset()
            else:
                self.obs = next_obs
        return {
            "obs": obs_buf, "action": act_buf, "reward": rew_buf,
            "terminated": terminated_buf, "truncated": truncated_buf, "cut": cut_only,
            "bootstrap_obs": np.asarray(bootstrap_obs, np.float32).reshape((-1,) + self.obs.shape),
            "episode_returns": episode_returns, "episode_lengths": episode_lengths,
            "version": params["version"], "rank": self.rank,
            "collect_s": time.perf_counter() - t_start,
        }

    def close(self):
        self.env.close()


class LocalSampler:
    """-n 1: the agent's own process collects."""

    num_samplers = 1

    def __init__(self, env_id, seed):
        self.sampler = Sampler(env_id, seed, rank=0)

    def collect(self, params, total_steps):
        if total_steps < 1:
            raise ValueError(f"-b/--batch_size must be >= 1, got {total_steps}")
        return [self.sampler.collect(params, total_steps)]

    def close(self):
        self.sampler.close()


# ---------------------------------------------------------------------------
# N sampler processes.


def sampler_process(rank, env_id, seed, policy_queue, experience_queue):
    """Body of sampler process `rank`: collect with each params it is sent, until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the agent's to handle
    parent = mp.parent_process()
    sampler = None
    try:
        sampler = Sampler(env_id, seed, rank)
        experience_queue.put(("ready", rank, {
            "pid": os.getpid(), "tensorflow_imported": "tensorflow" in sys.modules}))
        while True:
            try:
                message = policy_queue.get(timeout=PARENT_POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():  # agent gone: do not linger
                    experience_queue.cancel_join_thread()
                    return
                continue
            if message is None:
                return
            params, num_steps = message
            experience_queue.put(("rollout", rank, sampler.collect(params, num_steps)))
    except Exception:  # noqa: BLE001 -- report anything to the agent, then exit non-zero
        experience_queue.put(("error", rank, traceback.format_exc()))
        sys.exit(1)
    finally:
        if sampler is not None:
            sampler.close()


class ParallelSamplers:
    """N sampler processes, a policy queue to each, one shared experience queue."""

    def __init__(self, env_id, num_samplers, seed, timeout_s=600.0):
        if num_samplers < 2:
            raise ValueError(f"ParallelSamplers needs -n >= 2, got {num_samplers} (use LocalSampler)")
        self.num_samplers, self.timeout_s = num_samplers, timeout_s
        ctx = mp.get_context("spawn")
        self.policy_queues = [ctx.Queue() for _ in range(num_samplers)]
        self.experience_queue = ctx.Queue()
        self.processes = []
        saved = {k: os.environ.get(k) for k in ONE_THREAD}
        os.environ.update(ONE_THREAD)  # one BLAS thread per sampler: they run side by side
        try:
            for rank in range(num_samplers):
                p = ctx.Process(target=sampler_process, name=f"sampler-{rank}", daemon=True,
                                args=(rank, env_id, seed, self.policy_queues[rank], self.experience_queue))
                p.start()
                self.processes.append(p)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.info = [None] * num_samplers  # each sampler's "ready" payload
        try:
            while None in self.info:
                kind, rank, payload = self._receive({r for r, i in enumerate(self.info) if i is None})
                if kind != "ready":
                    raise SamplerError(f"sampler {rank} sent {kind!r} before 'ready'")
                self.info[rank] = payload
        except BaseException:
            self.close()
            raise

    def _receive(self, waiting_for):
        """Next message from the experience queue; raises SamplerError if a sampler
        reports an error, dies, or nothing arrives within timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                kind, rank, payload = self.experience_queue.get(timeout=WAIT_POLL_S)
            except queue.Empty:
                dead = [(r, p) for r, p in enumerate(self.processes) if not p.is_alive()]
                if dead:
                    self._raise_dead(dead)
                if time.monotonic() > deadline:
                    raise SamplerError(
                        f"no message from sampler(s) {sorted(waiting_for)} within {self.timeout_s:.0f} s "
                        f"(alive but stuck?)")
                continue
            if kind == "error":
                raise SamplerError(f"sampler {rank} failed:\n{payload}")
            return kind, rank, payload

    def _raise_dead(self, dead):
        errors = []  # a sampler that raised puts its traceback before it exits: show it
        try:
            while True:
                kind, rank, payload = self.experience_queue.get(timeout=0.2)
                if kind == "error":
                    errors.append(f"sampler {rank} failed:\n{payload}")
        except queue.Empty:
            pass
        lines = [f"sampler {r} (pid {p.pid}) died with exit code {p.exitcode}"
                 + (f" (killed by signal {-p.exitcode})" if p.exitcode is not None and p.exitcode < 0 else "")
                 for r, p in dead]
        raise SamplerError("\n".join(lines + errors))

    def collect(self, params, total_steps):
        if total_steps < self.num_samplers:
            raise ValueError(f"-b/--batch_size ({total_steps}) must be >= -n/--num_samplers "
                             f"({self.num_samplers}): every sampler needs at least one step")
        for q, steps in zip(self.policy_queues, split_steps(total_steps, self.num_samplers)):
            q.put((params, steps))
        rollouts = [None] * self.num_samplers
        while None in rollouts:
            kind, rank, rollout = self._receive({r for r, x in enumerate(rollouts) if x is None})
            if kind != "rollout" or rollouts[rank] is not None:
                raise SamplerError(f"unexpected {kind!r} message from sampler {rank}")
            if rollout["version"] != params["version"]:
                raise SamplerError(f"sampler {rank} collected with policy version {rollout['version']}, "
                                   f"expected {params['version']}")
            rollouts[rank] = rollout
        return rollouts

    def close(self, timeout_s=5.0):
        """Sentinel to each sampler, join with a timeout, then terminate; no orphans."""
        for q in self.policy_queues:
            try:
                q.put_nowait(None)
            except (ValueError, OSError):  # queue already closed
                pass
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
            try:  # drain, so no sampler blocks on a full pipe while it exits
                while True:
                    self.experience_queue.get_nowait()
            except (queue.Empty, ValueError, OSError, EOFError):
                pass
            for p in self.processes:
                p.join(timeout=0.05)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for q in self.policy_queues + [self.experience_queue]:
            q.cancel_join_thread()  # a dead reader must not hang our exit on a half-written message
            q.close()


def make_samplers(env_id, num_samplers, seed, timeout_s=600.0):
    """LocalSampler for -n 1, ParallelSamplers for -n >= 2."""
    if not isinstance(num_samplers, int) or num_samplers < 1:
        raise ValueError(f"-n/--num_samplers must be an integer >= 1, got {num_samplers!r}")
    if num_samplers == 1:
        return LocalSampler(env_id, seed)
    return ParallelSamplers(env_id, num_samplers, seed, timeout_s)
