"""What a learner rank reports while it trains, as one object the update loop is given (as Acme's
learners are given a logger and a counter): running figures of the live data, which actors are
alive, the progress line, metrics.csv and TensorBoard (on the chief), and the bottleneck report."""
import collections
import os
import time

import numpy as np

from impala.telemetry import Telemetry, verdict
from impala.timings import Timings
from tools.runlog import RunLog

# New columns go at the end: a resumed run folder's metrics.csv is widened to them (tools.runlog).
# The figures after `bottleneck` tell a run that stalls from one that learns (docs/training.md):
# how many published versions old the actors' weights were, the value loss, the mean importance
# ratio and the rate the step used.
METRICS_COLUMNS = ("time_s", "frames", "updates", "fps", "mean_return_20", "episodes", "queue_fill",
                   "total_loss", "entropy", "grad_norm", "mean_return_100", "bottleneck", "policy_lag",
                   "baseline_loss", "mean_rho", "learning_rate")
# TensorBoard tags of the figures outside the update's own (those go under losses/).
METRICS_TAGS = {"mean_return_20": "charts/episode_return_mean20", "learning_rate": "charts/learning_rate",
                "fps": "perf/frames_per_second", "queue_fill": "perf/queue_fill", "policy_lag": "perf/policy_lag",
                "replay_nbytes": "perf/replay_nbytes", "env_crashes": "charts/env_crashes"}


class Stats:
    """Running figures of the live unrolls for the progress line, TensorBoard and the report."""

    # The fields of a batch that add_batch() reads.
    FIELDS = ("episode_end", "episode_return", "episode_length", "actor_id", "actor_timing", "policy_version",
              "env_crashes", "actor_host", "actor_cpu", "actor_rss_mb")

    def __init__(self):
        self.returns = collections.deque(maxlen=100)
        self.lengths = collections.deque(maxlen=100)
        self.episodes = 0
        self.env_crashes = 0  # exceptions of the actors' envs, each ending an episode early
        self.timings = Timings("wait", "learn", "publish")  # the update loop's
        self.actor_time = np.zeros(3)  # env, inference, transfer (impala.actor.PHASES), summed over unrolls
        self.actor_unrolls = 0
        self.last_seen = {}
        self.lag = collections.deque(maxlen=200)

    def add_batch(self, batch, version):
        ends = batch["episode_end"]
        if ends.any():
            self.returns.extend(batch["episode_return"][ends].tolist())
            self.lengths.extend(batch["episode_length"][ends].tolist())
            self.episodes += int(ends.sum())
        now = time.time()
        for a in np.unique(batch["actor_id"]):
            self.last_seen[int(a)] = now
        self.actor_time += batch["actor_timing"].sum(axis=0)
        self.env_crashes += int(batch["env_crashes"].sum())
        self.actor_unrolls += len(batch["actor_id"])
        self.lag.extend((version - batch["policy_version"]).tolist())

    def record(self):
        """What a checkpoint keeps of the episodes (Learner.save), so that a resumed run's mean
        returns and counts go on from where it stopped instead of from its first new game."""
        return {"returns": list(self.returns), "lengths": list(self.lengths), "episodes": self.episodes,
                "env_crashes": self.env_crashes}

    def resume(self, record):
        self.returns.extend(record["returns"])
        self.lengths.extend(record["lengths"])
        self.episodes, self.env_crashes = int(record["episodes"]), int(record["env_crashes"])

    def mean_return(self, n=20):
        if not self.returns:
            return float("nan")
        return float(np.mean(list(self.returns)[-n:]))

    def mean_lag(self):
        return float(np.mean(self.lag)) if self.lag else 0.0


class Heartbeats:
    """Per-actor liveness from the unrolls themselves: an actor whose last unroll is
    older than --actor_timeout_s (or that never sent one) is reported once as dead or
    stalled, and again when it comes back."""

    def __init__(self, actor_ids, timeout_s, rank, log):
        self.actor_ids, self.timeout_s, self.rank, self.log = list(actor_ids), timeout_s, rank, log
        self.start = time.time()
        self.silent = set()
        self.next_check = 0.0

    def check(self, last_seen):
        now = time.time()
        if now < self.next_check:
            return
        self.next_check = now + 1.0
        for a in self.actor_ids:
            seen = last_seen.get(a)
            quiet = now - (seen if seen is not None else self.start)
            if quiet > self.timeout_s and a not in self.silent:
                self.silent.add(a)
                self.log("[learner %d] WARNING: actor %d %s for %.0f s: dead or stalled (--actor_timeout_s=%g)"
                         % (self.rank, a, "has sent nothing" if seen is not None else "has not connected",
                            quiet, self.timeout_s))
            elif quiet <= self.timeout_s and a in self.silent:
                self.silent.discard(a)
                self.log("[learner %d] actor %d is sending again" % (self.rank, a))

    def alive(self, last_seen):
        """Actors heard from within --actor_timeout_s (the window the warnings use)."""
        now = time.time()
        return sum(1 for a in self.actor_ids
                   if a in last_seen and now - last_seen[a] <= self.timeout_s)


class IdleWatch:
    """Time since the last unroll: a warning once after --actor_timeout_s, and with
    --exit_when_no_actors_s > 0 `gave_up` (the run ends with exit code 4)."""

    def __init__(self, flags, rank, num_actors, log):
        self.flags, self.rank, self.num_actors, self.log = flags, rank, num_actors, log
        self.last_data = time.time()
        self.said = self.gave_up = False

    def got_data(self):
        self.last_data = time.time()
        self.said = False

    def check(self):
        idle = time.time() - self.last_data
        if idle > self.flags.actor_timeout_s and not self.said:
            self.log("[learner %d] WARNING: no unroll from any of its %d actor(s) for %.0f s; waiting "
                     "(--exit_when_no_actors_s=%g)" % (self.rank, self.num_actors, idle,
                                                       self.flags.exit_when_no_actors_s))
            self.said = True
        if self.flags.exit_when_no_actors_s > 0 and idle > self.flags.exit_when_no_actors_s:
            self.log("[learner %d] ERROR: no actor has sent anything for %.0f s; stopping" % (self.rank, idle))
            self.gave_up = True


class Progress:
    """The progress line every --log_every_s and, on the chief, metrics.csv and TensorBoard."""

    def __init__(self, flags, logdir, rank, num_actors, is_chief, log):
        self.flags, self.rank, self.num_actors, self.log = flags, rank, num_actors, log
        self.rows = RunLog(os.path.join(logdir, "metrics.csv"), METRICS_COLUMNS, logdir,
                           METRICS_TAGS) if is_chief else None
        self.start = self.last_log = time.time()
        self.last_log_frames = 0

    def begin(self, start, frames):
        self.start = self.last_log = start
        self.last_log_frames = frames

    def due(self, now):
        return now - self.last_log >= self.flags.log_every_s

    def write(self, now, figures, st, alive, bottleneck=None):
        """figures: frames, updates, queue_fill, replay_nbytes (or None) and the update's stats;
        bottleneck: the period's verdict (telemetry.verdict)."""
        frames = figures["frames"]
        fps = (frames - self.last_log_frames) / (now - self.last_log)
        self.log(progress_line(self.rank, frames, self.flags.total_environment_frames, fps, st, figures,
                               now - self.start, alive, self.num_actors))
        if self.rows is not None:
            for k in figures["step_stats"]:
                if k not in METRICS_TAGS:
                    self.rows.tag(k, "losses/" + k)
            row = dict({k: float(v) for k, v in figures["step_stats"].items()}, time_s=now - self.start,
                       frames=frames, updates=figures["updates"], fps=fps, queue_fill=figures["queue_fill"],
                       mean_return_20=st.mean_return(), mean_return_100=st.mean_return(100),
                       episodes=st.episodes, policy_lag=st.mean_lag(), env_crashes=st.env_crashes,
                       replay_nbytes=figures["replay_nbytes"], bottleneck=bottleneck)
            self.rows.write(row, step=frames)
        self.last_log, self.last_log_frames = now, frames

    def close(self):
        if self.rows is not None:
            self.rows.close()


def progress_line(rank, frames, total, fps, st, figures, elapsed, alive, num_actors):
    eta_s = int(min((total - frames) / max(fps, 1e-9), 99 * 3600))
    return ("[learner %d] frames %s/%s (%4.1f%%) | %6.0f fps | return %7.2f (last 20 of %d eps) | "
            "queue %3.0f%% | lag %.1f | actors %d/%d | loss %.3f | %s elapsed, %s left"
            % (rank, _si(frames), _si(total), 100.0 * frames / total, fps, st.mean_return(), st.episodes,
               100 * figures["queue_fill"], st.mean_lag(), alive, num_actors,
               float(figures["step_stats"].get("total_loss", float("nan"))),
               time.strftime("%H:%M:%S", time.gmtime(elapsed)),
               "%02d:%02d:%02d" % (eta_s // 3600, eta_s % 3600 // 60, eta_s % 60))
            + (" | %d env crashes" % st.env_crashes if st.env_crashes else ""))


def _si(n):
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return "%.2f%s" % (n / div, unit)
    return str(n)


def bottleneck_report(st, elapsed, frames):
    """Where time went, and which side limited throughput: {"text": ..., "numbers": {...}}."""
    t = st.timings
    n = max(st.actor_unrolls, 1)
    env_s, inf_s, tx_s = st.actor_time / n  # per unroll, per env
    actor_total = max(env_s + inf_s + tx_s, 1e-9)
    elapsed = max(elapsed, 1e-9)
    wait_frac = t["wait"] / elapsed
    if verdict(wait_frac) == "actors":
        said = "actors (the learner waited for data %.0f%% of the time)" % (100 * wait_frac)
    else:
        said = "learner (busy %.0f%% of the time; actors block on a full queue)" % (
            100 * (t["learn"] + t["publish"]) / elapsed)
    numbers = {"learner_wait_s": t["wait"], "learner_learn_s": t["learn"],
               "learner_publish_s": t["publish"], "elapsed_s": elapsed, "frames": frames,
               "actor_env_share": env_s / actor_total, "actor_inference_share": inf_s / actor_total,
               "actor_transfer_share": tx_s / actor_total, "bottleneck": said}
    text = ("[learner] where time went: learner %.0f%% learning, %.0f%% publishing weights, %.0f%% "
            "waiting for data | actors %.0f%% env steps, %.0f%% inference, %.0f%% transfer "
            "(incl. waiting on a full queue) | bottleneck: %s"
            % (100 * t["learn"] / elapsed, 100 * t["publish"] / elapsed, 100 * wait_frac,
               100 * numbers["actor_env_share"], 100 * numbers["actor_inference_share"],
               100 * numbers["actor_transfer_share"], said))
    return {"text": text, "numbers": numbers}


class Monitor:
    """The update loop's reporter: live-data statistics, actor liveness, the progress output."""

    def __init__(self, flags, logdir, rank, num_actors, actor_ids, is_chief, log, frames_per_unroll=1):
        self.stats = Stats()
        self.rank, self.log, self.said = rank, log, None
        self.telemetry = Telemetry(logdir, rank, frames_per_unroll, flags.batch_size * flags.unroll_length,
                                   flags.log_every_s) if flags.telemetry else None
        self.beats = Heartbeats(actor_ids if actor_ids is not None else range(num_actors),
                                flags.actor_timeout_s, rank, log)
        self.idle = IdleWatch(flags, rank, num_actors, log)
        self.progress = Progress(flags, logdir, rank, num_actors, is_chief, log)

    @property
    def gave_up(self):
        return self.idle.gave_up

    def waiting(self):
        """Called while the loop waits for data: warns about silent actors."""
        self.beats.check(self.stats.last_seen)
        self.idle.check()

    def got_batch(self, live, version):
        """A batch arrived: its live unrolls move the statistics (replayed ones do not)."""
        self.idle.got_data()
        self.stats.add_batch(live, version)
        if self.telemetry is not None:
            self.telemetry.add_batch(live)
        self.beats.check(self.stats.last_seen)

    def after_update(self, now, figures):
        """Writes the progress output when --log_every_s has passed; figures() is called only
        then, since it reads the queue's size from the transport server."""
        if self.progress.due(now):
            f = figures()
            self.progress.write(now, f, self.stats, self.beats.alive(self.stats.last_seen), self.period_verdict(now, f))

    def final(self, now, figures):
        """The last row at the stop, when frames moved since the last one: a short run (or the
        tail of a long one) ends in metrics.csv at the frames it reached."""
        f = figures()
        if f["frames"] > self.progress.last_log_frames and now > self.progress.last_log:
            self.progress.write(now, f, self.stats, self.beats.alive(self.stats.last_seen), self.period_verdict(now, f))

    def period_verdict(self, now, f):
        """The telemetry table of the period, and its bottleneck verdict, said when it changes."""
        if self.telemetry is None:
            return None
        said = self.telemetry.write(now, f["frames"], f["updates"], self.stats.timings, f["queue_fill"])
        if said != self.said:
            self.log("[learner %d] bottleneck now: %s (the learner waited for data %s of the last period)"
                     % (self.rank, said, "over a quarter" if said == "actors" else "under a quarter"))
            self.said = said
        return said

    def close(self):
        self.progress.close()
        if self.telemetry is not None:
            self.telemetry.close()
