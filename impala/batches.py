"""The learner's input: dequeue -> batch. Each update loop asks a batch source for its next
batch: SyncBatches dequeues between updates, PrefetchBatches in a background thread while the
update trains (as scalable_agent staged its batches); make_batch_source picks one by
--prefetch_batches. Batches arrive batch-major [B, T, ...] (as actors send unrolls); the update
reads them time-major [T, B, ...] (to_time_major) and in minibatches of unrolls (minibatch) or
of single steps (step_fields, step_minibatch)."""
import queue
import threading
import time
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from impala import transport

# The fields a gradient step reads, per step ([T(+1), B, ...] once time-major).
STEP_FIELDS = ("observation", "first", "action", "reward", "done", "timeout_value", "behaviour_logits")
# [T, B] fields the learner adds once per batch (--vtrace_targets=batch_start: V-trace's targets).
BATCH_START_PREFIX = "batch_start/"
# Fields with one value per unroll, never made time-major.
_BATCH_MAJOR = {"actor_id", "policy_version", "actor_timing", "env_crashes", "actor_host", "actor_cpu",
                "actor_rss_mb", "cut_observation", "cut_frame", "cut_step"}


def to_time_major(batch, names):
    """[B, T(+1), ...] -> [T(+1), B, ...] for the per-step fields; unrolls sent as newest
    frames get their stacked "observation" back (transport.stack_frames)."""
    out = {}
    if "frames" in names:
        out["observation"] = transport.stack_frames(batch["frames"], batch["stack_reset"])
        names = [k for k in names if k not in ("frames", "stack_reset")]
    for k in names:
        v = batch[k]
        time_major = v.ndim >= 2 and k not in _BATCH_MAJOR and not k.startswith("core_state")
        out[k] = np.swapaxes(v, 0, 1) if time_major else v
    return out


def read_by_steps(name):
    """Whether a gradient step reads the field `name` ([T(+1), B, ...] time-major)."""
    return name in STEP_FIELDS or name == "old_logits" or name.startswith(BATCH_START_PREFIX)


def minibatch(batch, index):
    """The unrolls `index` (along B) of a time-major batch: the fields a gradient step reads."""
    mb = {k: tf.gather(v, index, axis=1) for k, v in batch.items() if read_by_steps(k)}
    mb.update({k: tf.gather(v, index, axis=0) for k, v in batch.items() if k.startswith("core_state")})
    return mb


def step_fields(batch):
    """The fields of a time-major batch that a gradient step on single steps reads
    (--minibatch_over=steps), flattened from [T(+1), B, ...] to [T*B, ...]. The bootstrap row
    of "observation" and "first" is dropped: with V-trace's targets fixed at the batch's start
    no step reads its neighbours."""
    flat = {}
    for k, v in batch.items():
        if read_by_steps(k):
            steps = v[:-1] if k in ("observation", "first") else v
            flat[k] = tf.reshape(steps, tf.concat([[-1], tf.shape(steps)[2:]], 0))
    return flat


def step_minibatch(flat, index):
    """The steps `index` of step_fields' output as a time-major batch of one unroll [n, 1, ...],
    with a copy of the last observation standing in for the bootstrap row that the agent's
    unroll expects and nothing reads."""
    mb = {k: tf.gather(v, index)[:, None] for k, v in flat.items()}
    for k in ("observation", "first"):
        if k in mb:
            mb[k] = tf.concat([mb[k], mb[k][-1:]], 0)
    return mb


class Ready(NamedTuple):
    """A batch for one update: the dequeued unrolls ([B, ...] arrays, for the statistics and
    the replay mixer), how many were fresh, and the update's tensors when already made."""
    live: dict
    n_live: int
    tensors: Optional[dict]


class SyncBatches:
    """--prefetch_batches=0: the update loop dequeues each batch itself, between updates."""

    def __init__(self, learner, tp):
        self.learner, self.tp = learner, tp

    def top_up(self):
        pass  # nothing is fetched ahead

    def poll(self):
        """The next batch, or None after a short sleep when fewer unrolls wait."""
        n_live = self.learner.live_needed()
        live = self.tp.try_dequeue(n_live)
        if live is None:
            time.sleep(0.005)
            return None
        return Ready(live, n_live, None)

    def close(self):
        """Returns the unrolls dequeued but not handed out: none here."""
        return 0


class PrefetchBatches:
    """--prefetch_batches=N: a background thread dequeues (and, without replay, converts)
    up to N batches ahead while the update loop trains, as scalable_agent staged its batches.

    The update loop asks for each batch with top_up(), which counts the fresh unrolls
    (learner.live_needed(), in the loop's thread: it reads the replay mixer) and stops
    asking once the batches asked for reach --total_environment_frames, so at the frame
    budget nothing was dequeued that is not trained on. At any other stop (signal, silent
    actors, another rank) the batches in flight, at most N, were taken from the queue and
    are dropped untrained, like the unrolls still in the closed queue: close() says how many.
    """

    def __init__(self, learner, tp, depth, convert, frames_per_unroll, keep=None):
        self.learner, self.tp, self.depth, self.convert = learner, tp, depth, convert
        self.keep = keep  # with convert: the fields of the arrays the update loop still reads
        self.frames_per_unroll = frames_per_unroll  # all ranks' frames per fresh unroll of this rank
        self.total = learner.flags.total_environment_frames
        self.planned = int(learner.num_env_frames.numpy())  # frames once all asked-for batches trained
        self.pending = 0  # batches asked for and not yet handed out
        self.requests, self.ready = queue.Queue(), queue.Queue()
        self.halt = threading.Event()
        # A daemon, and joined by close(): it never keeps the process alive.
        self.thread = threading.Thread(target=self._fetch_loop, name="learner-prefetch", daemon=True)
        self.thread.start()

    def top_up(self):
        """Asks for batches up to `depth` ahead, none past the frame budget. With replay the
        next batch's size is known only after make_batch() of the previous one: 1 ahead."""
        while self.pending < self.depth and self.planned < self.total:
            if self.learner.mixer is not None and self.pending > 0:
                return
            n_live = self.learner.live_needed()
            self.requests.put(n_live)
            self.pending += 1
            self.planned += n_live * self.frames_per_unroll

    def poll(self):
        """The next ready batch, or None after waiting up to 5 ms for it."""
        self.top_up()
        try:
            item = self.ready.get(timeout=0.005)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item  # the thread failed (e.g. the transport): the loop fails the same way
        self.pending -= 1
        return item

    def _fetch_loop(self):
        try:
            while not self.halt.is_set():
                try:
                    n_live = self.requests.get(timeout=0.05)
                except queue.Empty:
                    continue
                live = self._dequeue(n_live)
                if live is None:
                    return  # halted while waiting: nothing was taken from the queue
                if self.convert is None:
                    self.ready.put(Ready(live, n_live, None))
                else:  # the statistics' fields are all the loop still needs of the arrays
                    tensors = self.convert(live)
                    self.ready.put(Ready({k: live[k] for k in self.keep}, n_live, tensors))
        except BaseException as e:  # handed to the update loop, which raises it
            self.ready.put(e)

    def _dequeue(self, n_live):
        while not self.halt.is_set():
            live = self.tp.try_dequeue(n_live)
            if live is not None:
                return live
            time.sleep(0.005)
        return None

    def close(self):
        """Stops and joins the thread; returns the unrolls dequeued but never handed out."""
        self.halt.set()
        self.thread.join(timeout=30)
        if self.thread.is_alive():  # stuck in a transport call; a daemon, so exit goes on
            print("[learner] WARNING: the prefetch thread did not stop within 30 s", flush=True)
        dropped = 0
        while not self.ready.empty():
            item = self.ready.get()
            dropped += item.n_live if isinstance(item, Ready) else 0
        return dropped


def make_batch_source(flags, learner, tp, keep):
    """SyncBatches with --prefetch_batches=0, else PrefetchBatches; `keep`: the fields of a
    converted batch's arrays that the update loop reads (its statistics).

    Without replay make_batch() returns the live unrolls as they are, so the thread also
    does the time-major numpy conversion and the tensor copies. With replay
    (learner.mixer) make_batch() is not thread safe: ReplayMixer.sample()/add() change
    the mixer's RNG, rounding carry, buffers and carried unrolls, which live_needed(),
    save() (state_dict) and the progress line (nbytes) read in the update loop's thread,
    and prioritised strategies call learner.features(), i.e. the current policy on the
    weights the update is changing. So with replay only the dequeue is prefetched; the
    mixing and the conversion stay in the update loop, before the update, as without
    prefetching.
    """
    if flags.prefetch_batches == 0:
        return SyncBatches(learner, tp)
    convert = learner.to_tensors if learner.mixer is None else None
    return PrefetchBatches(learner, tp, flags.prefetch_batches, convert,
                           learner.size * learner.frames_per_unroll, keep)
