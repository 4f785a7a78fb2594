"""RLlib (ray 2.60.0) APPO on Pong, new API stack, a peer of bench/run.py (runs in .peer-venv-rllib/).

  .peer-venv-rllib/bin/python bench/peers/rllib_appo.py throughput --seconds 60
  .peer-venv-rllib/bin/python bench/peers/rllib_appo.py pong --budget_s 7200 --frames 10000000

Follows RLlib's tuned Pong example (rllib/tuned_examples/appo/pong_appo.py): ALE/Pong-v5 made
like PongNoFrameskip-v4 (frameskip 1, repeat_action_probability 0, minimal action set),
RLlib's `wrap_atari_for_new_api_stack` (gray, resize, frame skip 4 with max-pool, noop reset
30, episodic life, FIRE reset, time limit), the 4-frame stack as its env-to-module and
learner connectors, rewards clipped, vf_loss_coeff 1.0, entropy 0.01, circular buffer of 4
batches x 2 iterations, lr 5e-4. On the CPU with a local learner (num_learners=0: updates
run in the driver process while the EnvRunner actors sample asynchronously), 2 EnvRunners
(one per core) and no aggregator actors (the example asks for 2; each would be one more
process on 2 cores).

throughput: 84x84 frames (ours; the tuned example uses 64x64) and our conv sizes:
  conv_filters [[16, 8, 4, "valid"], [32, 4, 2, "valid"]] is exactly our torso; RLlib's
  encoder then flattens, and head_fcnet_hiddens [256] puts one FC 256 in each of its policy
  and value heads (vf_share_layers shares the convs only), where ours has one shared FC 256:
  RLlib's net has two FC 256 layers. --env_runners x --envs_per_runner envs (sync vector
  env in each EnvRunner), rollout fragments of 32, train batch 1024 per update.
  Reports over the window that opens --warmup seconds after the first iteration in which
  the learner trained:
    frames_per_s          4 x delta(num_env_steps_sampled_lifetime) / delta(wall time)
    trained_frames_per_s  4 x delta(num_env_steps_trained_lifetime) / delta(wall time)
  They differ: the EnvRunners keep sampling while the learner is busy, batches that find
  the learner's queue full are dropped, and APPO's circular buffer lets the learner update
  on a batch up to 2 times (circular_buffer_iterations_per_batch), each counted as trained. RLlib counts steps of the wrapped env, each
  4 ALE frames (MaxAndSkipEnv), hence 4 x.
pong: the tuned example's settings as they are (64x64, conv [16,4,2],[32,4,2],[64,4,2],
  [128,4,2] + head 256, 2 envs per runner, batch 500, entropy 0.01 -> 0 over 3M steps,
  broadcast every 5 steps), until RLlib's episode_return_mean (its mean over the last 100
  episodes; Pong has no lives, so an episode is a whole game) reaches --target.

The run happens in a child process in its own session with ray's files in a private temp
dir; at the end (or at the hard limit) the child gets SIGINT, then SIGKILL goes to its
process group and to every process whose command line names that temp dir (raylet, GCS
server, workers), so no ray process outlives the run. Prints one JSON line; a run that
fails prints {"error": ...} with what was tried.
"""
import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

NET_OURS = ("conv 16 8x8/4, conv 32 4x4/2 (ours, valid padding), then FC 256 in each of the policy and value heads "
            "(ours: one shared FC 256)")
NET_TUNED = "conv 16-32-64-128 4x4/2 (same padding), FC 256 per head, 64x64 input (RLlib's tuned Pong example)"


# ------------------------------------------------------------------ the child: ray + RLlib
def env_creator(cfg):
    import ale_py
    import gymnasium as gym
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    gym.register_envs(ale_py)
    dim = cfg.get("dim", 84)
    return wrap_atari_for_new_api_stack(
        gym.make("ale_py:ALE/Pong-v5", frameskip=1, full_action_space=False, repeat_action_probability=0.0),
        dim=dim, framestack=None)


def env_to_module(*args, **kwargs):
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    return FrameStackingEnvToModule(num_frames=4)


def learner_connector(*args, **kwargs):
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    return FrameStackingLearner(num_frames=4)


def build(a):
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env
    register_env("pong", env_creator)
    tuned = a.suite == "pong"
    config = (
        APPOConfig()
        .environment("pong", env_config={"dim": 64 if tuned else 84}, clip_rewards=True)
        .env_runners(num_env_runners=a.env_runners, num_envs_per_env_runner=a.envs_per_runner,
                     env_to_module_connector=env_to_module, num_cpus_per_env_runner=1,
                     **({} if tuned else {"rollout_fragment_length": 32}))
        .learners(num_learners=0, num_aggregator_actors_per_learner=0, learner_connector=learner_connector)
        .training(vf_loss_coeff=1.0,
                  lr=0.0005, target_network_update_freq=2, circular_buffer_num_batches=4,
                  circular_buffer_iterations_per_batch=2,
                  **(dict(train_batch_size_per_learner=500, entropy_coeff=[[0, 0.01], [3000000, 0.0]],
                          broadcast_interval=5) if tuned else
                     dict(train_batch_size_per_learner=1024, entropy_coeff=0.01)))
        .rl_module(model_config=DefaultModelConfig(
            vf_share_layers=True, conv_activation="relu", head_fcnet_hiddens=[256],
            conv_filters=([[16, 4, 2], [32, 4, 2], [64, 4, 2], [128, 4, 2]] if tuned else
                          [[16, 8, 4, "valid"], [32, 4, 2, "valid"]])))
        .reporting(min_time_s_per_iteration=5)
        .debugging(seed=a.seed)
    )
    return config.build_algo() if hasattr(config, "build_algo") else config.build()


def find(d, key):
    """The first value of `key` anywhere in the nested result dict (RLlib moves them between versions)."""
    if isinstance(d, dict):
        if key in d and not isinstance(d[key], dict):
            return d[key]
        for v in d.values():
            got = find(v, key)
            if got is not None:
                return got
    return None


def child(a):
    import ray
    ray.init(num_cpus=a.cpus, include_dashboard=False, _temp_dir=a.ray_tmp, log_to_driver=False,
             configure_logging=True, logging_level="WARNING")
    t0 = time.time()
    algo = build(a)
    t_built = time.time()
    rows = []  # (wall time, sampled steps, trained steps, episode_return_mean)
    out = {}
    try:
        while True:
            r = algo.train()
            now = time.time()
            rows.append((now, find(r, "num_env_steps_sampled_lifetime") or 0,
                         find(r, "num_env_steps_trained_lifetime") or 0, find(r, "episode_return_mean")))
            print("[rllib_appo] %.0f s: sampled %d, trained %d, return %s" % ((now - t0,) + rows[-1][1:]),
                  file=sys.stderr, flush=True)
            first = next((t for t, _, tr, _ in rows if tr > 0), None)
            if a.suite == "throughput":
                window = [r for r in rows if first is not None and r[0] >= first + a.warmup]
                if len(window) >= 2 and window[-1][0] - window[0][0] >= a.seconds - 0.5:
                    break
            else:
                ret = rows[-1][3]
                if ret is not None and ret >= a.target:
                    out["hit"] = (now - first, now - t0, rows[-1][1])
                    break
                if rows[-1][1] * 4 >= a.frames or now - t0 > a.budget_s:
                    break
        first = next((t for t, _, tr, _ in rows if tr > 0), None)
        out.update(rows=rows, t0=t0, built_s=t_built - t0, first=first)
        out["versions"] = {"ray": md.version("ray"), "torch": md.version("torch"),
                           "gymnasium": md.version("gymnasium"), "ale_py": md.version("ale-py")}
        print("RESULT " + json.dumps(out), flush=True)
    finally:
        try:
            algo.stop()
        finally:
            ray.shutdown()
    return 0


# ------------------------------------------------------------------ the parent: limits and cleanup
def ray_processes(tag):
    """Pids of processes whose command line names our private ray temp dir."""
    pids = []
    # isdigit() alone passes '¹', which int() refuses; tools/digits.py is not importable in the peer's venv
    for pid in os.listdir("/proc"):
        if pid.isascii() and pid.isdigit() and int(pid) != os.getpid():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if tag.encode() in f.read():
                        pids.append(int(pid))
            except OSError:
                pass
    return pids


def run_child(a, argv):
    ray_tmp = tempfile.mkdtemp(prefix="rp_", dir="/tmp")  # short: ray's socket paths live under it
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--ray_tmp", ray_tmp] + argv
    limit = a.hard_limit or (a.start_limit + a.warmup + a.seconds + 60 if a.suite == "throughput"
                             else a.budget_s + 300)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stopped = "exited by itself"
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stopped = "SIGINT at the hard limit of %.0f s" % limit
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stopped += ", then SIGKILL"
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
    finally:
        left = []
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(3):  # raylet/GCS may sit in their own groups: find them by the temp dir
            pids = ray_processes(ray_tmp)
            left += pids
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(1)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    res = next((json.loads(ln[7:]) for ln in reversed(stdout.splitlines()) if ln.startswith("RESULT ")), None)
    return res, stderr, proc.returncode, time.time() - t0, stopped, sorted(set(left))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("suite", nargs="?", default="throughput", choices=["throughput", "pong"])
    p.add_argument("--seconds", type=float, default=60, help="throughput: measuring window")
    p.add_argument("--warmup", type=float, default=20)
    p.add_argument("--start_limit", type=float, default=180)
    p.add_argument("--hard_limit", type=float, default=0, help="0: start_limit + warmup + seconds + 60")
    p.add_argument("--env_runners", type=int, default=None, help="default 2: one per core")
    p.add_argument("--envs_per_runner", type=int, default=None, help="default 16 (throughput), 2 (pong)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2,
                   help="ray's CPU count (each EnvRunner asks for 1; the local learner for none)")
    p.add_argument("--target", type=float, default=18)
    p.add_argument("--frames", type=int, default=10_000_000)
    p.add_argument("--budget_s", type=float, default=7200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ray_tmp", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.env_runners is None:
        a.env_runners = 2
    if a.envs_per_runner is None:
        a.envs_per_runner = 16 if a.suite == "throughput" else 2
    return a


def failure(res, stderr, rc, wall, stopped, what):
    """The error line of a run that gave no result or trained on nothing."""
    lines = stderr.splitlines()
    err = [ln.strip() for ln in lines if re.match(r"\w*(Error|Exception|Interrupt)\b", ln.strip())]
    progress = [ln for ln in lines if ln.startswith("[rllib_appo]")]
    return "%s after %.0f s (exit %s, %s; tried: %s): %s%s" % (
        "no result" if res is None else "the learner trained on nothing", wall, rc, stopped, what,
        err[-1][:300] if err else stderr.strip()[-300:],
        "; last progress: " + progress[-1] if progress else "; no training iteration finished")


def throughput_figures(a, rows, first, what):
    """Sampled and trained frames/s over the window after --warmup."""
    window = [r for r in rows if r[0] >= first + a.warmup] or rows[-2:]
    if len(window) < 2:
        window = rows[-2:]
    (t1, s1, tr1, _), (t2, s2, tr2, _) = window[0], window[-1]
    return dict(level="ALE/Pong-v5 (as NoFrameskip-v4)", frames_per_s=4 * (s2 - s1) / (t2 - t1),
                trained_frames_per_s=4 * (tr2 - tr1) / (t2 - t1), window_s=t2 - t1, warmup_s=a.warmup,
                sampled_steps=s2, trained_steps=tr2, net=NET_OURS, config=what,
                notes="RLlib's Atari wrappers (wrap_atari_for_new_api_stack, 84x84 gray, frame skip 4, "
                      "stack 4 in its connectors); frames = 4 x env steps; trained counts every update on a "
                      "batch (its circular buffer reuses a batch up to 2 times) and misses dropped batches")


def pong_figures(a, res, what):
    """Time and frames to --target and the curve."""
    rows, hit = res["rows"], res.get("hit")
    return dict(target=a.target, reached=hit is not None, seed=a.seed,
                time_to_target_s=hit[0] if hit else float("nan"),
                from_launch_s=hit[1] if hit else float("nan"),
                frames_to_target=4 * hit[2] if hit else None, frames=4 * rows[-1][1],
                last_mean_return=rows[-1][3], net=NET_TUNED, config=what,
                # per iteration: seconds from launch, frames sampled, frames trained (a starved
                # learner trains far fewer than it samples), mean return
                curve=[(round(t - res["t0"], 1), 4 * s, 4 * tr, ret) for t, s, tr, ret in rows],
                notes="return = RLlib's episode_return_mean (last 100 games); training seconds from the "
                      "first iteration in which the learner trained")


def main():
    a = parse_args()
    if a._child:
        return child(a)
    argv = [x for x in sys.argv[1:]]
    what = "APPO, num_learners=0, %d EnvRunner(s) x %d envs, %s" % (
        a.env_runners, a.envs_per_runner, "rollout 32, batch 1024, our conv sizes at 84x84" if a.suite == "throughput"
        else "RLlib's tuned Pong settings")
    res, stderr, rc, wall, stopped, left = run_child(a, argv)
    base = {"peer": "rllib_appo", "suite": a.suite}
    if res is None or (a.suite == "throughput" and res.get("first") is None):
        print(stderr[-4000:], file=sys.stderr)
        base["error"] = failure(res, stderr, rc, wall, stopped, what)
        print(json.dumps(base), flush=True)
        return 1
    first = res["first"]
    base.update(res["versions"])
    base.update(env_runners=a.env_runners, envs_per_runner=a.envs_per_runner, wall_s=wall, stopped_by=stopped,
                build_s=res["built_s"], startup_s=(first - res["t0"]) if first else None,
                leftover_ray_processes_killed=len(left))
    base.update(throughput_figures(a, res["rows"], first, what) if a.suite == "throughput"
                else pong_figures(a, res, what))
    print(json.dumps(base), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
