"""One learner rank's training loop: dequeue -> batch (with replay) -> update -> publish, until the
frame budget, a signal, silent actors or another rank stops it; then the final checkpoint, the
bottleneck report and summary.json. The learner's state and update are learner.py; what the loop
reports goes through the Monitor it is given (monitor.py)."""
import hashlib
import json
import os
import time

import numpy as np
import tensorflow as tf

import nets
from impala import batches
from impala import learner as learner_lib
from impala import transport
from impala.monitor import Monitor, Stats, bottleneck_report
from impala.stopping import StopSignal
from tools import runlog

try:  # Horovod is optional for a single learner
    import horovod.tensorflow as hvd
except ImportError:  # pragma: no cover - install.sh always installs it
    hvd = None


NONFINITE_EXIT = 7  # the updates' gradients, or the weights, stopped being finite
NONFINITE_UPDATES_IN_A_ROW = 20  # updates whose every gradient step was refused before the run stops


class Trainer:
    """One learner rank's update loop: dequeue -> batch -> update -> publish, until the
    frame budget, a signal, silent actors, another rank or a run of non-finite gradients
    stops it."""

    def __init__(self, flags, learner, tp, stop, monitor, log):
        self.flags, self.learner, self.tp, self.stop, self.monitor, self.log = (
            flags, learner, tp, stop, monitor, log)
        self.rank, self.size = learner.rank, learner.size
        self.version = int(learner.update_step.numpy())  # as published by start_learner()
        self.timings = monitor.stats.timings
        self.start = time.time()
        self.start_frames = self.frames = int(learner.num_env_frames.numpy())
        monitor.progress.begin(self.start, self.start_frames)
        self.checkpoints = learner_lib.CheckpointTimer(learner, flags.checkpoint_every_s, self.rank, log, self.start)
        self.step_stats = {}
        self.steps_per_update = flags.num_sgd_iter * flags.num_minibatches
        self.skipped_before, self.refused_in_a_row, self.nonfinite = 0, 0, None
        self.weights = learner.flat_weights()  # as last published: check_finite reads them after each update
        self.last_batch = None  # the batch of the newest update (kept by reference, no copy)

    def run(self):
        """Trains until something stops it; returns (reason, exit code)."""
        self.batches = batches.make_batch_source(self.flags, self.learner, self.tp, Stats.FIELDS)
        try:
            while True:
                ready = self.wait_for_batch()
                stop, save = self.all_ranks_agree(ready is None, self.checkpoints.due(time.time()))
                if stop:
                    return self.stop_reason()
                self.update(ready)
                self.nonfinite = self.check_finite()
                if self.nonfinite is not None:
                    return self.nonfinite, NONFINITE_EXIT
                self.publish()
                now = time.time()
                self.monitor.after_update(now, self.figures)
                if save:
                    self.checkpoints.save(now)
        finally:
            self.close_batches()

    def wait_for_batch(self):
        """This rank's next batch, or None for a reason to stop; staying responsive meanwhile
        (the time spent here is the loop's "wait")."""
        self.frames = int(self.learner.num_env_frames.numpy())
        ready = None
        with self.timings.time("wait"):
            while (ready is None and not self.stop() and self.frames < self.flags.total_environment_frames
                   and not self.monitor.gave_up):
                ready = self.batches.poll()
                if ready is None:
                    self.monitor.waiting()
        return ready

    def all_ranks_agree(self, local_stop, local_save):
        """All ranks agree, once per update, whether to stop (a rank that looped back
        alone would deadlock the others' gradient allreduce) and whether to checkpoint
        after this update (each rank's replay file must belong to the same checkpoint)."""
        if self.size == 1:
            return local_stop, local_save
        both = hvd.allreduce(tf.constant([int(local_stop), int(local_save)]), op=hvd.Max, name="stop_flag")
        return bool(both[0]), bool(both[1])

    def stop_reason(self):
        if self.stop():
            return "stopped by signal %d" % self.stop.signum, 0
        if self.monitor.gave_up:
            return "no actors", 4
        if self.frames < self.flags.total_environment_frames:
            return "stopped because another learner rank stopped", 0
        return "frame budget reached", 0

    def update(self, ready):
        """Statistics of the live data, the training batch (with replay), one update."""
        with self.timings.time("learn"):
            self.monitor.got_batch(ready.live, self.version)
            tensors = ready.tensors
            if tensors is None:
                tensors = self.learner.to_tensors(self.learner.make_batch(ready.live))
            self.last_batch = tensors
            self.batches.top_up()  # the next batch's dequeue overlaps this update
            new_frames = tf.constant(self.size * ready.n_live * self.learner.frames_per_unroll, tf.int64)
            self.step_stats = self.learner._train_step(tensors, new_frames)

    def check_finite(self):
        """Why the run cannot go on (a string), or None. A gradient step whose gradients were
        not finite was not applied (learner._apply_if_finite); that is reported, and after
        NONFINITE_UPDATES_IN_A_ROW updates with every step refused the run stops. Weights that
        are not finite (a NaN observation reaching the normaliser, say) are never published
        or checkpointed. The ranks decide alike: their gradients and weights are the same."""
        skipped = int(self.step_stats["skipped_steps"])
        new, self.skipped_before = skipped - self.skipped_before, skipped
        if new:
            stats = self.step_stats
            self.log("[learner %d] WARNING: update %d: %d of %d gradient step(s) had non-finite gradients and "
                     "were not applied (%d so far; first step's loss %s, gradient norm %s)"
                     % (self.rank, self.version + 1, new, self.steps_per_update, skipped,
                        float(stats["total_loss"]), float(stats["grad_norm"])))
        self.refused_in_a_row = self.refused_in_a_row + 1 if new == self.steps_per_update else 0
        if self.refused_in_a_row >= NONFINITE_UPDATES_IN_A_ROW:
            return ("non-finite gradients in every step of %d updates in a row; the weights were kept as they "
                    "were before them" % self.refused_in_a_row)
        before, self.weights = self.weights, self.learner.flat_weights()  # publish() sends it: one read per update
        bad = None if np.isfinite(self.weights).all() else "the weights"
        if bad is None and not self.learner.reward_statistics_finite():  # not among the weights; NaN there
            bad = "the reward statistics (--normalize_rewards)"  # would refuse every later step
        if bad:
            path = self.keep_nonfinite_batch(before)
            return ("%s are not finite after update %d (were the observations or rewards NaN?); the weights "
                    "were not published, and no checkpoint is written; the batch and the weights it met are in %s"
                    % (bad, self.version + 1, path))
        return None

    def keep_nonfinite_batch(self, weights_before):
        """Writes the batch that made the weights non-finite and the weights it met (published
        order: experiment.py --mode=replay_nonfinite replays the update on them) to the run folder;
        returns the file's path."""
        path = os.path.join(self.learner.logdir, "nonfinite_batch_rank%d.npz" % self.rank)
        arrays = {"batch/" + k: np.asarray(v) for k, v in self.last_batch.items()}
        # Samples each normaliser had seen, after this update: the replay takes the batch's
        # off to weigh the batch as the run did (the counts are not among the weights).
        arrays.update({"count/" + n.name: n.count.numpy() for n in nets.normalisers(self.learner.agent)})
        rewards = self.learner.reward_normaliser  # --normalize_rewards: not among the weights either
        if rewards is not None:
            arrays.update({"reward_normaliser/" + k: getattr(rewards, k).numpy() for k in ("mean", "var", "count")})
        np.savez_compressed(path, version=self.version, weights_before=weights_before, **arrays)
        return path

    def publish(self):
        with self.timings.time("publish"):
            self.version += 1
            self.tp.publish(self.weights, self.version)

    def figures(self):
        """What the progress output reports besides the live-data statistics."""
        mixer = self.learner.mixer
        return {"frames": int(self.learner.num_env_frames.numpy()), "updates": int(self.learner.update_step.numpy()),
                "queue_fill": self.tp.size() / self.flags.queue_capacity, "step_stats": self.step_stats,
                "replay_nbytes": None if mixer is None else mixer.nbytes()}

    def close_batches(self):
        dropped = self.batches.close()
        if dropped:
            self.log("[learner %d] %d prefetched unroll(s) were dequeued but not trained on (the "
                     "batch in flight at the stop)" % (self.rank, dropped))


def start_learner(flags, logdir, learner_address, num_actors, rank, size, log):
    """The learner (restored with --mode=train_w_load, rank 0's weights on every rank) and
    its transport server, with the initial weights published."""
    learner = learner_lib.Learner(flags, logdir, rank, size)
    if learner.compute_dtype_note:
        log("[learner %d] %s" % (rank, learner.compute_dtype_note))
    if flags.mode == "train_w_load":
        restored = learner.restore(flags.load_model_url)
        frames = int(learner.num_env_frames.numpy())
        log("[learner %d] resumed from %s at %d frames" % (rank, restored, frames))
        if learner.is_chief:  # before the Monitor appends to metrics.csv
            dropped = runlog.drop_rows_after(os.path.join(logdir, "metrics.csv"), "frames", frames)
            if dropped:
                log("[learner 0] metrics.csv: %d row(s) past %d frames removed (training after that checkpoint "
                    "was lost), so the curve goes on from the checkpoint" % (dropped, frames))
    learner_lib.broadcast(learner)
    tp = transport.LearnerTransport(learner_address, learner.spec, flags.queue_capacity, flags.batch_size)
    tp.publish(learner.flat_weights(), int(learner.update_step.numpy()))
    threads = tf.config.threading.get_intra_op_parallelism_threads()  # 0: TensorFlow's default, all cores
    log("[learner %d/%d] serving %s: %s, %s, batch %d x unroll %d, %d actor(s) assigned, %d new frames/update, "
        "TensorFlow threads: %s" % (rank, size, learner_address, flags.level_name, flags.agent_name, flags.batch_size,
                                    flags.unroll_length, num_actors, learner.live_frames_per_update, threads or "all"))
    return learner, tp


def finish(learner, tp, trainer, reason, exit_code, logdir, log):
    """The final checkpoint (exit code 5 when the chief could not save it), the report
    and summary.json; returns the exit code."""
    rank, st = learner.rank, trainer.monitor.stats
    trainer.monitor.final(time.time(), trainer.figures)  # before tp.close(): it reads the queue's size
    if exit_code == NONFINITE_EXIT and not np.isfinite(learner.flat_weights()).all():
        path = None  # the newest checkpoint on disk stays the newest: resume from it
        log("[learner %d] ERROR: %s; the newest checkpoint is still %s" % (rank, reason, learner.manager.latest_checkpoint))
    else:
        path = learner_lib.save_or_report(learner, log, rank)
        if path is None and learner.is_chief:
            exit_code = 5
    tp.close()
    elapsed = time.time() - trainer.start
    frames = int(learner.num_env_frames.numpy())
    report = bottleneck_report(st, elapsed, frames - trainer.start_frames)
    log("[learner %d] %s after %d frames (%.0f s); checkpoint %s" % (rank, reason, frames, elapsed, path))
    log("[learner %d] final weights sha256 %s" % (rank, hashlib.sha256(learner.flat_weights().tobytes()).hexdigest()))
    if learner.reward_normaliser is not None:  # not among the weights; the ranks must agree on it too
        log("[learner %d] final reward statistics mean %r var %r" % (
            rank, float(learner.reward_normaliser.mean.numpy()), float(learner.reward_normaliser.var.numpy())))
    log(report["text"])
    if tp.repeats.dropped:
        log("[learner %d] %d repeated unroll(s) dropped (re-sent after an enqueue timed out)" % (rank, tp.repeats.dropped))
    if st.env_crashes:
        log("[learner %d] %d env crash(es) in its actors' envs (each ended an episode early; the actor logs show "
            "why)" % (rank, st.env_crashes))
    if learner.is_chief:
        summary = {"reason": reason, "frames": frames, "elapsed_s": elapsed, "mean_return_20": st.mean_return(),
                   "episodes": st.episodes, "checkpoint": path, "time_breakdown": report["numbers"],
                   "repeated_unrolls_dropped": tp.repeats.dropped, "env_crashes": st.env_crashes}
        write_summary(learner, summary, logdir, log)
    trainer.monitor.close()
    # Give actors a moment to see the closed queue before the server goes away.
    time.sleep(0.5)
    return exit_code


def write_summary(learner, summary, logdir, log):
    if learner.mixer is not None:
        summary["replay"] = learner.mixer.stats()
        log("[learner] replay: %s" % json.dumps(summary["replay"], default=float))
    with open(os.path.join(logdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)


def train(flags, logdir, learner_address, num_actors, rank=0, size=1, log=print, actor_ids=None):
    """Serves the actors of this rank and trains until the frame budget, a signal
    (SIGINT/SIGTERM) or silent actors stop it; returns the exit code."""
    stop = StopSignal()
    learner, tp = start_learner(flags, logdir, learner_address, num_actors, rank, size, log)
    monitor = Monitor(flags, logdir, rank, num_actors, actor_ids, learner.is_chief, log,
                      frames_per_unroll=learner.frames_per_unroll)
    if learner.restored_episodes is not None:
        monitor.stats.resume(learner.restored_episodes)
    learner.episode_record = monitor.stats.record
    t0 = time.time()
    learner.warm_up()  # while the actors start up
    log("[learner %d] update traced in %.1f s" % (rank, time.time() - t0))
    trainer = Trainer(flags, learner, tp, stop, monitor, log)
    reason, exit_code = trainer.run()
    return finish(learner, tp, trainer, reason, exit_code, logdir, log)
