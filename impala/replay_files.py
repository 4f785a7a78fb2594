"""The replay's part of a checkpoint: one file per checkpoint and learner rank beside the
TensorFlow checkpoint it belongs to (`checkpoints/replay-<N>-rank<r>.lz4` for `ckpt-<N>`),
so that a resume that falls back to an older checkpoint gets that checkpoint's replay RNG,
rounding carry and schedules, and each rank gets its own RNG stream back.

With --checkpoint_replay the stored unrolls (and the queue's carried ones) come too, so a
resumed replay run samples from the same buffer; without it the buffers start empty and
refill from live unrolls (replay.ReplayMixer.state_dict). The file is a pickle streamed
through lz4 (written to a temporary name and renamed, so a torn write is never read)."""
import glob
import hashlib
import os
import pickle
import re
import time

import lz4.frame
import numpy as np



def path_for(ckpt_dir, step, rank):
    return os.path.join(ckpt_dir, "replay-%d-rank%d.lz4" % (step, rank))


def save(mixer, ckpt_dir, step, rank, contents, keep, log=print):
    """Writes this rank's replay state for checkpoint `step` and removes this rank's files
    older than the newest `keep` (as the TensorFlow checkpoints are kept)."""
    t0 = time.time()
    os.makedirs(ckpt_dir, exist_ok=True)
    path = path_for(ckpt_dir, step, rank)
    tmp = path + ".tmp"
    state = mixer.state_dict(include_contents=contents)
    with lz4.frame.open(tmp, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    if contents:
        log("[learner %d] replay contents of ckpt-%d checkpointed: %d unrolls, %.1f MB in memory, %.1f MB on disk, "
            "%.2f s, digest %s" % (rank, step, stored_unrolls(mixer), mixer.nbytes() / 1e6, os.path.getsize(path) / 1e6,
                           time.time() - t0, digest(mixer)))
    _prune(ckpt_dir, rank, keep)
    return path


def _prune(ckpt_dir, rank, keep):
    steps = sorted(_step_of(p) for p in glob.glob(os.path.join(ckpt_dir, "replay-*-rank%d.lz4" % rank)))
    for step in steps[:-keep] if keep > 0 else []:
        try:
            os.remove(path_for(ckpt_dir, step, rank))
        except OSError:
            pass  # already gone: nothing to keep tidy


def _step_of(path):
    return int(re.search(r"replay-(\d+)-rank", os.path.basename(path)).group(1))


def load(mixer, prefix, rank, log=print, fields=None):
    """Restores this rank's replay state saved with checkpoint `prefix` (".../ckpt-<N>");
    False, with a warning, when there is none or it does not fit this run (`fields`: the names
    of this run's unroll fields, which stored unrolls must have)."""
    match = re.search(r"-([0-9]+)$", prefix)  # --load_model_url's: \d would take 'ckpt-٣' as 3
    path = path_for(os.path.dirname(prefix), int(match.group(1)), rank) if match else None
    if path is None or not os.path.exists(path):
        log("[learner %d] WARNING: no replay state for checkpoint %s on this rank (%s); the replay starts "
            "afresh" % (rank, prefix, path))
        return False
    try:
        with lz4.frame.open(path, "rb") as f:  # a local file this program wrote
            state = pickle.load(f)
        _check_fields(state, fields)
        mixer.load_state_dict(state)
    except (OSError, ValueError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
        log("[learner %d] WARNING: %s not used (%s); the replay starts afresh" % (rank, path, e))
        return False
    log("[learner %d] replay state of %s restored: %d unrolls stored%s" % (
        rank, os.path.basename(prefix), stored_unrolls(mixer),
        ", digest %s" % digest(mixer) if stored_unrolls(mixer) else ""))
    return True


def _check_fields(state, fields):
    """ValueError when the stored unrolls' fields are not this run's (saved by a version of the
    program with another unroll layout): training on them would fail."""
    if fields is None:
        return
    for source in state.get("sources", []):
        for item in list(source.get("slots") or []) + list(source.get("carry") or []):
            if item is not None and set(item) != set(fields):
                raise ValueError("its unrolls lack the fields %s and have the fields %s of another unroll layout"
                                 % (sorted(set(fields) - set(item)), sorted(set(item) - set(fields))))


def stored_unrolls(mixer):
    return sum(len(b) for b in mixer.buffers) + (len(mixer.queue.carry) if mixer.queue else 0)


def digest(mixer):
    """A short hash of what the buffers hold, slot by slot, and of the queue's carried
    unrolls: equal before a checkpoint and after its resume when the contents came back."""
    h = hashlib.sha256()
    for b in mixer.buffers:
        h.update(np.ascontiguousarray(b.counts[:len(b)]).tobytes())
        for slot in range(len(b)):
            _hash_item(h, b.item(slot))
    for item in (mixer.queue.carry if mixer.queue else []):
        _hash_item(h, item)
    return h.hexdigest()[:16]


def _hash_item(h, item):
    for k in sorted(item):
        h.update(k.encode())
        h.update(np.ascontiguousarray(item[k]).tobytes())
