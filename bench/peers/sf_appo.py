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
import subprocess
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs_per_worker", type=int, default=32)
    a = p.parse_args()
    train_dir = tempfile.mkdtemp(prefix="sf_peer_")
    cmd = [sys.executable, "-m", "sf_examples.atari.train_atari", "--env=atari_pong",
           "--experiment=pong_throughput", "--train_dir=" + train_dir, "--device=cpu",
           "--num_workers=%d" % a.workers, "--num_envs_per_worker=%d" % a.envs_per_worker,
           "--worker_num_splits=2", "--async_rl=True", "--with_vtrace=True",
           "--rollout=32", "--batch_size=1024", "--num_epochs=1", "--num_batches_per_epoch=1",
           "--encoder_conv_architecture=convnet_simple", "--train_for_seconds=%d" % a.seconds,
           "--save_every_sec=100000", "--keep_checkpoints=1", "--with_wandb=False",
           "--experiment_summaries_interval=10"]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.seconds + 600)
    finally:
        wall = time.time() - t0
        shutil.rmtree(train_dir, ignore_errors=True)
    log = proc.stdout + proc.stderr
    # Periodic lines: "Fps is (10 sec: X, 60 sec: Y, 300 sec: Z). Total num frames: N."
    periodic = [(float(m.group(1)), float(m.group(2)) if m.group(2) != "nan" else None, int(m.group(3)))
                for m in re.finditer(r"Fps is \(10 sec: ([\d.]+|nan), 60 sec: ([\d.]+|nan), 300 sec: "
                                     r"[\d.na]+\)\. Total num frames: (\d+)", log)]
    final = re.findall(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)", log)
    if proc.returncode != 0 or not periodic:
        print(log[-3000:], file=sys.stderr)
        print(json.dumps({"peer": "sample_factory_appo", "error": "exit %d, %d fps lines" % (
            proc.returncode, len(periodic))}))
        return 1
    # The median of the 10-second windows after the first 20 s (start-up excluded), like ours.
    warm = [f for f, _, _ in periodic[2:]] or [f for f, _, _ in periodic]
    warm.sort()
    out = {"peer": "sample_factory_appo", "level": "PongNoFrameskip-v4", "workers": a.workers,
           "envs_per_worker": a.envs_per_worker, "frames_per_s": warm[len(warm) // 2],
           "frames": periodic[-1][2], "wall_s": wall,
           "final_fps_incl_startup": float(final[-1][1]) if final else None}
    import importlib.metadata as md
    out["sample_factory"] = md.version("sample-factory")
    out["torch"] = md.version("torch")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
