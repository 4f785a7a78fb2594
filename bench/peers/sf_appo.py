"""Sample Factory 2 APPO on PongNoFrameskip-v4, as a throughput peer (runs in .peer-venv-sf/).

  .peer-venv-sf/bin/python bench/peers/sf_appo.py --seconds 60 --workers 2 --envs_per_worker 32

Runs Sample Factory's own Atari example (sf_examples.atari.train_atari: its wrappers, frame
skip 4, 84x84 gray, stack 4) in asynchronous APPO mode with V-trace on the CPU, for a fixed
time, and prints one JSON line with its frames/s. Sample Factory counts frames with the
frame skip (summaries_use_frameskip, its Atari default), as we do. Its network is
`--encoder_conv_architecture=convnet_simple` (conv 32-64-128 + FC 512), the smallest it
ships; ours is the shallow IMPALA net (conv 16-32 + FC 256): the table says so.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def make_pong(env_name, cfg, env_config, render_mode=None):
    """Sample Factory's own Atari env factory, after registering ale-py's ids: with
    gymnasium 0.29, ale-py 0.9 registers them only when asked, and Sample Factory makes its
    envs in spawned processes, where nothing of the parent's registry survives."""
    import ale_py.registration
    import gymnasium
    if "PongNoFrameskip-v4" not in gymnasium.registry:
        ale_py.registration.register_v0_v4_envs()
    from sf_examples.atari.atari_utils import make_atari_env
    return make_atari_env(env_name, cfg, env_config, render_mode)


def train(argv):
    """Sample Factory's train_atari main, with make_pong as the env factory."""
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl
    from sf_examples.atari.train_atari import parse_atari_args
    register_env("atari_pong", make_pong)
    return run_rl(parse_atari_args(argv))


def main():
    if "--_train" in sys.argv:
        return train([a for a in sys.argv[1:] if a != "--_train"])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs_per_worker", type=int, default=32)
    a = p.parse_args()
    train_dir = tempfile.mkdtemp(prefix="sf_peer_")
    cmd = [sys.executable, os.path.abspath(__file__), "--_train", "--env=atari_pong",
           "--experiment=pong_throughput", "--train_dir=" + train_dir, "--device=cpu",
           "--num_workers=%d" % a.workers, "--num_envs_per_worker=%d" % a.envs_per_worker,
           "--worker_num_splits=2", "--async_rl=True", "--with_vtrace=True", "--normalize_returns=False",
           "--rollout=32", "--batch_size=1024", "--num_epochs=1", "--num_batches_per_epoch=1",
           "--encoder_conv_architecture=convnet_simple", "--train_for_seconds=%d" % a.seconds,
           "--save_every_sec=100000", "--keep_checkpoints=1", "--with_wandb=False",
           "--experiment_summaries_interval=10"]
    t0 = time.time()
    # Its own --train_for_seconds is not always honoured (seen: a run whose learner took no
    # batch went on past it), so the whole process group ends at a hard limit.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=a.seconds + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        log += "\n[sf_appo] killed at the hard limit of %.0f s" % (a.seconds + 120)
    finally:
        wall = time.time() - t0
        shutil.rmtree(train_dir, ignore_errors=True)
    # Periodic lines: "Fps is (10 sec: X, 60 sec: Y, 300 sec: Z). Total num frames: N."
    periodic = [(float(m.group(1)), int(m.group(2)))  # (frames/s over the last 10 s, frames so far)
                for m in re.finditer(r"Fps is \(10 sec: ([\d.]+|nan), 60 sec: [\d.na]+, 300 sec: "
                                     r"[\d.na]+\)\. Total num frames: (\d+)", log)]
    final = re.findall(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)", log)
    if not periodic or periodic[-1][1] == 0:
        print(log[-3000:], file=sys.stderr)
        samples = re.findall(r"Samples: (\d+)", log)
        print(json.dumps({"peer": "sample_factory_appo", "error": "exit %s; it trained on no frames in %.0f s "
                          "(%s samples collected)" % (proc.returncode, wall, samples[-1] if samples else 0)}))
        return 1
    # The median of the 10-second windows after the first 20 s (start-up excluded), like ours.
    warm = [f for f, _ in periodic[2:]] or [f for f, _ in periodic]
    warm.sort()
    out = {"peer": "sample_factory_appo", "level": "PongNoFrameskip-v4", "workers": a.workers,
           "envs_per_worker": a.envs_per_worker, "frames_per_s": warm[len(warm) // 2],
           "frames": periodic[-1][1], "wall_s": wall,
           "final_fps_incl_startup": float(final[-1][1]) if final else None}
    import importlib.metadata as md
    out["sample_factory"] = md.version("sample-factory")
    out["torch"] = md.version("torch")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
