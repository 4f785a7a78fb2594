"""Where TensorFlow runs: learners on a GPU when one is visible, actors on the CPU.

A learner rank sees the GPUs CUDA_VISIBLE_DEVICES leaves it (the workers CSV's
cuda_visible_devices column, passed by the frontend's mpirun with -x) and takes the one
at its local rank (Horovod's usual pinning when several ranks share a host and see the
same GPUs); with none visible, its model and update stay on the CPU. Actors step
environments and run a small batched policy; they hide every GPU so that they neither
grab GPU memory nor wait on the GPU beside a learner.

All of them must run before TensorFlow creates its devices (the first op).
"""
import os

import tensorflow as tf


def pick(gpu_names, local_rank) -> int:
    """Index into gpu_names of the GPU for this rank, or -1 for the CPU."""
    if not gpu_names:
        return -1
    return local_rank % len(gpu_names)


def setup_learner(local_rank=0, log=print, prefix="[learner]") -> str:
    """Pin this rank to its GPU (memory growth on) -> the device string, '/GPU:0' or '/CPU:0'."""
    gpus = tf.config.list_physical_devices("GPU")
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    i = pick([g.name for g in gpus], local_rank)
    if i < 0:
        log("%s no GPU visible (CUDA_VISIBLE_DEVICES=%s): model and update on the CPU" % (prefix, cvd))
        return "/CPU:0"
    tf.config.set_visible_devices([gpus[i]], "GPU")
    tf.config.experimental.set_memory_growth(gpus[i], True)
    log("%s model and update on %s (CUDA_VISIBLE_DEVICES=%s, %d GPU(s) visible, local rank %d)"
        % (prefix, gpus[i].name, cvd, len(gpus), local_rank))
    return "/GPU:0"


def set_threads(n):
    """n TensorFlow threads (intra- and inter-op) in this process; 0 leaves TensorFlow's default
    (all cores). Before TensorFlow runs its first op."""
    if n > 0:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)


def hide_gpus_from_actor():
    """Actors run on the CPU only."""
    tf.config.set_visible_devices([], "GPU")
