"""IMPALA learner: hosts the transport server, dequeues batches of unrolls,
computes the V-trace actor-critic loss (Espeholt et al. 2018, section 4.2) and
applies RMSProp. With K Horovod ranks, each rank serves its own actors and
gradients are averaged with allreduce, so all ranks hold identical weights;
the effective batch is K x batch_size unrolls per update with the same
learning rate (the loss is a sum over time and batch, as in scalable_agent).

Rank 0 alone writes checkpoints, TensorBoard and metric files.
"""
import collections
import hashlib
import json
import os
import pickle
import signal
import time

import numpy as np
import tensorflow as tf
import sonnet as snt

from impala import actor as actor_lib
from impala import batches
import nets
from impala import transport
from impala import replay as replay_lib
import vtrace

try:  # Horovod is optional for a single learner
    import horovod.tensorflow as hvd
except ImportError:  # pragma: no cover - install.sh always installs it
    hvd = None


# ---------------------------------------------------------------- the loss
def clip_rewards(rewards, mode):
    if mode == "abs_one":
        return tf.clip_by_value(rewards, -1.0, 1.0)
    if mode == "soft_asymmetric":
        squeezed = tf.tanh(rewards / 5.0)
        # Negative rewards count 0.3 as much: makes the agent less risk-averse.
        return tf.where(rewards < 0, 0.3 * squeezed, squeezed) * 5.0
    return rewards  # "none"


def vtrace_targets(agent_out, batch, flags):
    """V-trace's value targets vs and policy-gradient advantages for a time-major batch.
    With --clip_ratio_to=batch_start, V-trace corrects from the actors' policy mu to the
    learner's policy pi_old as the batch arrived (fixed for all the batch's gradient steps);
    otherwise to the current policy pi."""
    rewards = clip_rewards(batch["reward"], flags.reward_clipping)
    if "timeout_value" in batch:  # bootstrap where a time limit, not the task, ended the episode
        rewards += flags.discounting * batch["timeout_value"]
    discounts = tf.cast(~batch["done"], tf.float32) * flags.discounting
    anchor = batch.get("old_logits")
    return vtrace.from_logits(
        behaviour_policy_logits=batch["behaviour_logits"],
        target_policy_logits=agent_out.policy_logits[:-1] if anchor is None else anchor,
        actions=batch["action"], discounts=discounts, rewards=rewards, values=agent_out.baseline[:-1],
        bootstrap_value=agent_out.baseline[-1], lambda_=flags.vtrace_lambda)


def compute_losses(agent_out, batch, flags, value_scale=1.0):
    """V-trace actor-critic loss on one time-major batch; sums over [T, B]. `value_scale`:
    the running standard deviation of the returns (--normalize_returns), by which the
    baseline's error is measured (the loss of a head that predicts standardised returns)."""
    logits = agent_out.policy_logits[:-1]       # [T, B, A]
    values = agent_out.baseline[:-1]            # [T, B]
    anchor = batch.get("old_logits")
    vt = vtrace_targets(agent_out, batch, flags)
    advantages = vt.pg_advantages
    if flags.normalize_advantages:
        # PPO's per-minibatch standardisation: the policy-gradient scale no longer depends on
        # the reward scale, so the entropy cost means the same in every game.
        mean, var = tf.nn.moments(advantages, axes=[0, 1])
        advantages = (advantages - mean) / (tf.sqrt(var) + 1e-8)
    clip = flags.clip_param
    if clip > 0:
        # APPO (RLlib): PPO's clipped surrogate on the V-trace advantages. It bounds how far
        # one batch may move the policy when the learner reuses it (--num_sgd_iter > 1).
        # The ratio r_s = pi(a_s|x_s) / mu(a_s|x_s) is against the behaviour policy mu, or
        # (batch_start) pi / pi_old, which is exactly 1 at the batch's first step however far
        # the actors' policy lags behind.
        if anchor is None:
            ratio = tf.exp(vt.log_rhos)
        else:
            log_pi = vtrace.log_probs_from_logits_and_actions(logits, batch["action"])
            ratio = tf.exp(log_pi - vt.target_action_log_probs)
        pg_loss = -tf.reduce_sum(tf.minimum(
            ratio * advantages, tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * advantages))
    else:
        # Policy gradient: -sum log pi(a_s|x_s) * rho_s (r_s + gamma v_{s+1} - V(x_s)).
        pg_loss = tf.reduce_sum(-vt.target_action_log_probs * advantages)
    # Baseline: 1/2 sum ((v_s - V(x_s)) / value_scale)^2, weighted by baseline_cost.
    baseline_loss = 0.5 * tf.reduce_sum(tf.square((vt.vs - values) / value_scale)) * flags.baseline_cost
    # Entropy bonus: minimise -H(pi).
    policy = tf.nn.softmax(logits)
    log_policy = tf.nn.log_softmax(logits)
    entropy = -tf.reduce_sum(policy * log_policy, axis=-1)
    entropy_loss = -tf.reduce_sum(entropy) * flags.entropy_cost
    total = pg_loss + baseline_loss + entropy_loss
    return total, {"pg_loss": pg_loss, "baseline_loss": baseline_loss,
                   "entropy": tf.reduce_mean(entropy), "total_loss": total,
                   "mean_rho": tf.reduce_mean(tf.exp(vt.log_rhos))}


def make_optimizer(flags, learning_rate, variables):
    """--optimizer with its slots created now (so that a restore fills them).

    rmsprop: TF1's tf.train.RMSPropOptimizer, which the original IMPALA used:
      ms <- decay ms + (1 - decay) g^2;  step = lr g / sqrt(ms + epsilon), with ms
      starting at ONE. Sonnet 2's RMSProp starts ms at zero, so its first steps are
      about 1/sqrt(1 - decay) = 10x lr in the sign of the gradient: on Pong that left
      14 of the 16 first-layer filters dead after 100 updates (measured; 5 of 16 with
      ms starting at one), so ms is set to one here.
    adam: Adam (beta1 0.9, beta2 0.999, --adam_epsilon), bias-corrected, so it has no
      such start-up burst; RLlib's IMPALA/APPO default.
    """
    if flags.optimizer == "adam":
        optimizer = snt.optimizers.Adam(learning_rate, epsilon=flags.adam_epsilon)
    else:
        optimizer = snt.optimizers.RMSProp(learning_rate, decay=flags.decay,
                                           momentum=flags.momentum, epsilon=flags.epsilon)
    # A zero update creates the slots and changes no weight.
    optimizer.apply([tf.zeros_like(v) for v in variables], variables)
    if flags.optimizer == "adam":
        optimizer.step.assign(0)  # the zero update counted as a step: undo for the bias correction
    else:
        for ms in optimizer.ms:
            ms.assign(tf.ones_like(ms))
    return optimizer


_STEP_FIELDS = ("observation", "first", "action", "reward", "done", "timeout_value", "behaviour_logits")


def _minibatch(batch, index):
    """The unrolls `index` (along B) of a time-major batch: the fields a gradient step reads."""
    mb = {k: tf.gather(batch[k], index, axis=1) for k in _STEP_FIELDS + ("old_logits",) if k in batch}
    mb.update({k: tf.gather(v, index, axis=0) for k, v in batch.items() if k.startswith("core_state")})
    return mb


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


_BATCH_MAJOR = {"actor_id", "policy_version", "actor_timing"}


# ---------------------------------------------------------------- the learner
class Learner:
    def __init__(self, flags, logdir, rank=0, size=1):
        self.flags = flags
        self.logdir = logdir
        self.rank, self.size = rank, size
        self.is_chief = rank == 0
        tf.random.set_seed(flags.seed * 7919 + 100000 + rank)
        self.agent, self.spec, self.env_spec = actor_lib.build_agent(
            flags.level_name, flags.agent_name, flags.unroll_length, actor_lib.screen(flags), flags.compute_dtype,
            actor_lib.sends_frames(flags), flags.normalize_observations, flags.normalize_returns)
        self.variables = self.agent.trainable_variables
        if flags.weight_init == "orthogonal":  # before anything is published: actors get these too
            nets.orthogonal_init(self.agent, seed=flags.seed)
        self.frames_per_step = flags.num_action_repeats or (4 if self.env_spec.is_atari else 1)
        self.num_env_frames = tf.Variable(0, dtype=tf.int64, trainable=False, name="num_env_frames")
        self.update_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="update_step")
        self.learning_rate = tf.Variable(flags.learning_rate, dtype=tf.float32, trainable=False)
        self.optimizer = make_optimizer(flags, self.learning_rate, self.variables)
        self.ckpt = tf.train.Checkpoint(agent=self.agent, optimizer=self.optimizer,
                                        num_env_frames=self.num_env_frames,
                                        update_step=self.update_step)
        self.ckpt_dir = os.path.join(logdir, "checkpoints")
        self.manager = tf.train.CheckpointManager(self.ckpt, self.ckpt_dir, max_to_keep=3)
        # autograph=False: nothing here branches on tensors, and autograph's conversion of every
        # function the update calls was most of CartPole's 4 s trace (bench/results/<machine>/startup.md).
        self._train_step = tf.function(self._step, autograph=False)
        self._logits_fn = tf.function(self._policy_logits, autograph=False)
        self.frames_per_unroll = flags.unroll_length * self.frames_per_step
        # Replay (--replay_parameters): None when the batch is all live unrolls.
        specs = replay_lib.parse_replay_parameters(flags.replay_parameters)
        self.mixer = None
        live_share = sum(s.sample_ratio for s in specs if s.type == "queue")
        # New env frames per update once replay is full (all ranks): what the counters advance by.
        self.live_frames_per_update = size * max(1, round(live_share * flags.batch_size)) * self.frames_per_unroll
        if not (len(specs) == 1 and specs[0].type == "queue"):
            self.mixer = replay_lib.ReplayMixer(
                specs, flags.batch_size, seed=flags.seed * 1000 + rank,
                total_updates=max(1, flags.total_environment_frames // self.live_frames_per_update))
        self.replay_state_path = os.path.join(self.ckpt_dir, "replay_state.pkl")
        # Prioritised sampling/insertion needs the current policy's features; uniform does not.
        self._features_fn = self.features if self.mixer is not None and any(
            b.spec.sample_strategy != "uniform" or b.spec.insert_strategy != "fifo"
            for b in self.mixer.buffers) else None

    def live_needed(self):
        """Fresh unrolls the next update takes from the queue: the queue's share of the
        batch, plus what replay buffers still filling up lack (at least one, so the
        actors always move the run forward)."""
        if self.mixer is None:
            return self.flags.batch_size
        return max(1, self.mixer.live_needed())

    def to_tensors(self, batch):
        """The update's input: time-major tensors of a [B, ...] batch."""
        return {k: tf.constant(v) for k, v in to_time_major(batch, self.spec.names).items()}

    def make_batch(self, live):
        """The training batch ([B, ...] arrays) from the live unrolls (and replay)."""
        if self.mixer is None:
            return live
        items = replay_lib.split_batch(live)
        chosen = self.mixer.sample(items, self._features_fn)
        self.mixer.add(items, self._features_fn)
        return replay_lib.stack_items(chosen)

    # -- one update -----------------------------------------------------
    def _core_state(self, batch):
        template = self.agent.initial_state(1)
        return tf.nest.pack_sequence_as(
            template, [batch["core_state_%d" % i] for i in range(len(tf.nest.flatten(template)))])

    def _policy_logits(self, batch):
        """Current-policy logits [T, B, A] for a time-major batch (replay features)."""
        out, _ = self.agent.unroll(batch["observation"], batch["first"], self._core_state(batch))
        return out.policy_logits[:-1]

    def features(self, items):
        """Replay's features_fn: the current policy's [T, A] logits for each unroll."""
        obs = ("frames", "stack_reset") if "frames" in self.spec.names else ("observation",)
        batch = to_time_major(replay_lib.stack_items(items), obs + ("first",) + tuple(
            n for n in self.spec.names if n.startswith("core_state")))
        logits = self._logits_fn({k: tf.constant(v) for k, v in batch.items()}).numpy()
        return [logits[:, i] for i in range(len(items))]

    def _batch_start(self, batch):
        """Once per batch, before any gradient step: the running statistics move
        (--normalize_observations, --normalize_returns; with several ranks by their mean
        moments), and with --clip_ratio_to=batch_start pi_old, the policy before this batch's
        first step, is fixed. Returns the batch (with "old_logits") and the error scale of the
        baseline (compute_losses' value_scale)."""
        average = (lambda t: hvd.allreduce(t, op=hvd.Average)) if self.size > 1 else None
        obs_norm, ret_norm = self.agent.obs_normalizer, self.agent.return_normalizer
        if obs_norm is not None:
            obs_norm.update(nets.preprocess_observation(batch["observation"][:-1]), average)
        anchored = self.flags.clip_param > 0 and self.flags.clip_ratio_to == "batch_start"
        if anchored or ret_norm is not None:
            out, _ = self.agent.unroll(batch["observation"], batch["first"], self._core_state(batch))
            if anchored:
                batch = dict(batch, old_logits=tf.stop_gradient(out.policy_logits[:-1]))
            if ret_norm is not None:  # the value targets as the batch arrived
                ret_norm.update(tf.stop_gradient(vtrace_targets(out, batch, self.flags).vs), average)
        return batch, 1.0 if ret_norm is None else ret_norm.std()

    def _step(self, batch, new_frames):
        if self.flags.learning_rate_decay == "linear":  # to 0 over total_environment_frames
            frac = 1.0 - tf.cast(self.num_env_frames, tf.float32) / float(self.flags.total_environment_frames)
            self.learning_rate.assign(self.flags.learning_rate * tf.maximum(frac, 0.0))
        batch, value_scale = self._batch_start(batch)
        # --num_sgd_iter passes over the batch, each in --num_minibatches gradient steps on
        # disjoint random subsets of its unrolls (1 x 1: IMPALA; more: APPO-style reuse, with
        # V-trace correcting for the policy having moved since the actors acted).
        passes, parts = self.flags.num_sgd_iter, self.flags.num_minibatches
        size = batch["action"].shape[1] // parts
        # One random order of the unrolls per pass; step i takes the (i % parts)-th slice.
        orders = None if parts == 1 else tf.stack(
            [tf.random.shuffle(tf.range(batch["action"].shape[1])) for _ in range(passes)])

        def sgd_step(i):
            mb = batch if parts == 1 else _minibatch(
                batch, orders[i // parts, (i % parts) * size:(i % parts + 1) * size])
            with tf.GradientTape() as tape:
                out, _ = self.agent.unroll(mb["observation"], mb["first"], self._core_state(mb))
                loss, step_stats = compute_losses(out, mb, self.flags, value_scale)
            if self.size > 1:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, self.variables)
            grad_norm = tf.linalg.global_norm(grads)
            if self.flags.gradients_clipping > 0:
                grads, _ = tf.clip_by_global_norm(grads, self.flags.gradients_clipping, use_norm=grad_norm)
            self.optimizer.apply(grads, self.variables)
            return dict(step_stats, grad_norm=grad_norm)

        # The figures of the first step: the batch (or its first minibatch) as it arrived. The
        # other steps run in a graph loop, so tracing costs the same for 2 steps as for 32.
        stats = sgd_step(tf.constant(0))

        def loop_body(i):
            sgd_step(i)
            return i + 1
        tf.while_loop(lambda i: i < passes * parts, loop_body, [tf.constant(1)])
        self.num_env_frames.assign_add(new_frames)
        self.update_step.assign_add(1)
        stats["learning_rate"] = self.learning_rate
        return stats

    def zero_batch(self, batch_size=None):
        """A time-major batch of zeros with every field the transport delivers, as the
        training loop passes it to the update."""
        b = self.flags.batch_size if batch_size is None else batch_size
        return to_time_major({f.name: np.zeros((b,) + f.shape, f.dtype) for f in self.spec.fields},
                             self.spec.names)

    def warm_up(self):
        """Traces the update for a batch of the run's shapes without running it (no weight
        moves), so the first real batch does not wait for TensorFlow to build the graph."""
        self._train_step.get_concrete_function(
            {k: tf.TensorSpec(v.shape, v.dtype) for k, v in self.zero_batch().items()},
            tf.TensorSpec([], tf.int64))

    # -- checkpoints ----------------------------------------------------
    def restore(self, path):
        """Restores agent, optimizer and counters; returns the prefix used."""
        prefix = restore_newest_readable(self.ckpt, path, full=True)
        replay_state = os.path.join(os.path.dirname(prefix), "replay_state.pkl")
        if self.mixer is not None and os.path.exists(replay_state):
            try:
                with open(replay_state, "rb") as f:  # a local file this program wrote
                    self.mixer.load_state_dict(pickle.load(f))
            except (OSError, ValueError, EOFError, pickle.UnpicklingError) as e:
                print("WARNING: %s not used (%s); replay starts empty" % (replay_state, e), flush=True)
        return prefix

    def save(self):
        if self.is_chief:
            # CheckpointManager writes data files first and then atomically
            # replaces the `checkpoint` index, so a torn write is never newest.
            path = self.manager.save(checkpoint_number=int(self.update_step.numpy()))
            if self.mixer is not None:
                # Counters, RNG and schedules of the replay (not its contents).
                tmp = self.replay_state_path + ".tmp"
                with open(tmp, "wb") as f:
                    pickle.dump(self.mixer.state_dict(), f)
                os.replace(tmp, self.replay_state_path)
            return path
        return None

    def flat_weights(self):
        return actor_lib.flatten_weights(nets.published_variables(self.agent)).numpy()


def checkpoint_candidates(path):
    """Checkpoint prefixes under a run folder / checkpoint dir, newest first, or [path]."""
    if path and os.path.isdir(path):
        sub = os.path.join(path, "checkpoints")
        state = tf.train.get_checkpoint_state(sub if os.path.isdir(sub) else path)
        return list(reversed(state.all_model_checkpoint_paths)) if state else []
    return [path] if path else []


def restore_newest_readable(ckpt, path, full):
    """Restores the newest checkpoint that reads; a corrupt newest one is skipped
    with a warning. `full` requires every saved object to match (training);
    otherwise only the agent is needed (testing)."""
    candidates = checkpoint_candidates(path)
    for prefix in candidates:
        try:
            status = ckpt.restore(prefix)
            if full:
                status.assert_existing_objects_matched()
            else:
                status.expect_partial()
            return prefix
        # A truncated data file surfaces as IndexError ('Read less bytes than requested').
        except (tf.errors.OpError, AssertionError, ValueError, IndexError, KeyError, OSError) as e:
            print("WARNING: checkpoint %s is unreadable (%s); trying an older one"
                  % (prefix, str(e).splitlines()[0][:200]), flush=True)
    raise FileNotFoundError("--load_model_url=%s: no readable checkpoint there (looked at %d)"
                            % (path, len(candidates)))


def broadcast(learner):
    """Start from rank 0's weights, optimizer state and counters."""
    if learner.size > 1:
        hvd.broadcast_variables(list(learner.variables) + list(learner.optimizer.variables)
                                + [v for n in nets.normalizers(learner.agent) for v in n.variables]
                                + [learner.num_env_frames, learner.update_step], root_rank=0)


class Stats:
    """Running figures for the progress line, TensorBoard and the final report."""

    # The fields of a batch that add_batch() reads.
    FIELDS = ("episode_end", "episode_return", "episode_length", "actor_id", "actor_timing", "policy_version")

    def __init__(self):
        self.returns = collections.deque(maxlen=100)
        self.lengths = collections.deque(maxlen=100)
        self.episodes = 0
        self.t_wait = self.t_learn = self.t_publish = 0.0
        self.actor_time = np.zeros(3)  # env, inference, transfer (summed over unrolls)
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
        self.actor_unrolls += len(batch["actor_id"])
        self.lag.extend((version - batch["policy_version"]).tolist())

    def mean_return(self, n=20):
        if not self.returns:
            return float("nan")
        return float(np.mean(list(self.returns)[-n:]))


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


def save_or_report(learner, log, rank):
    """A checkpoint, or None with an error line naming the folder when the disk is full or
    read-only; the previous checkpoint stays intact and training goes on."""
    try:
        return learner.save()
    except (OSError, tf.errors.OpError) as e:
        previous = learner.manager.latest_checkpoint
        log("[learner %d] ERROR: could not write a checkpoint to %s (%s); the previous one (%s) is "
            "intact" % (rank, learner.ckpt_dir, str(e).splitlines()[0][:200], previous or "none"))
        return None


# ---------------------------------------------------------------- the training loop
class StopRequest:
    """SIGINT/SIGTERM set `flag` (remembering the signal): the loop stops between updates."""

    def __init__(self):
        self.flag, self.signal = False, None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.flag, self.signal = True, signum


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

    COLUMNS = "time_s,frames,updates,fps,mean_return_20,episodes,queue_fill,total_loss,entropy,grad_norm"

    def __init__(self, flags, learner, tp, logdir, rank, num_actors, log):
        self.flags, self.learner, self.tp, self.rank, self.num_actors, self.log = (
            flags, learner, tp, rank, num_actors, log)
        self.writer = tf.summary.create_file_writer(logdir) if learner.is_chief else None
        self.metrics = self._open_metrics(os.path.join(logdir, "metrics.csv")) if learner.is_chief else None
        self.start = self.last_log = time.time()
        self.start_frames = self.last_log_frames = 0

    def _open_metrics(self, path):
        new_file = not os.path.exists(path)
        metrics = open(path, "a", buffering=1)
        if new_file:
            metrics.write(self.COLUMNS + "\n")
        return metrics

    def begin(self, start, frames):
        self.start = self.last_log = start
        self.start_frames = self.last_log_frames = frames

    def maybe_write(self, now, st, beats, step_stats):
        if now - self.last_log < self.flags.log_every_s:
            return
        frames = int(self.learner.num_env_frames.numpy())
        fps = (frames - self.last_log_frames) / (now - self.last_log)
        fill = self.tp.size() / self.flags.queue_capacity
        total = self.flags.total_environment_frames
        _log_progress(self.log, self.rank, frames, total, fps, st, fill, now - self.start,
                      (total - frames) / max(fps, 1e-9), step_stats, self.num_actors, beats.alive(st.last_seen))
        if self.learner.is_chief:
            self._tensorboard(frames, fps, fill, st, step_stats)
            self._csv_row(now, frames, fps, fill, st, step_stats)
        self.last_log, self.last_log_frames = now, frames

    def _tensorboard(self, frames, fps, fill, st, step_stats):
        with self.writer.as_default(step=frames):
            tf.summary.scalar("frames_per_second", fps)
            tf.summary.scalar("queue_fill", fill)
            tf.summary.scalar("policy_lag", np.mean(st.lag) if st.lag else 0.0)
            if st.returns:
                tf.summary.scalar("episode_return_mean20", st.mean_return())
            for k, v in step_stats.items():
                tf.summary.scalar(k, v)
            if self.learner.mixer is not None:
                tf.summary.scalar("replay_nbytes", self.learner.mixer.nbytes())

    def _csv_row(self, now, frames, fps, fill, st, step_stats):
        self.metrics.write("%.1f,%d,%d,%.1f,%.3f,%d,%.3f,%.4f,%.4f,%.4f\n" % (
            now - self.start, frames, int(self.learner.update_step.numpy()), fps, st.mean_return(),
            st.episodes, fill, float(step_stats["total_loss"]), float(step_stats["entropy"]),
            float(step_stats["grad_norm"])))

    def close(self):
        if self.learner.is_chief:
            self.metrics.close()
            self.writer.close()


class CheckpointTimer:
    """A checkpoint every --checkpoint_every_s (a failed save is reported; training goes on)."""

    def __init__(self, learner, every_s, rank, log, start):
        self.learner, self.every_s, self.rank, self.log, self.last = learner, every_s, rank, log, start

    def maybe_save(self, now):
        if now - self.last >= self.every_s:
            save_or_report(self.learner, self.log, self.rank)
            self.last = now


class Trainer:
    """One learner rank's update loop: dequeue -> batch -> update -> publish, until the
    frame budget, a signal, silent actors or another rank stops it."""

    def __init__(self, flags, learner, tp, stop, progress, num_actors, log, actor_ids=None):
        self.flags, self.learner, self.tp, self.stop, self.progress, self.log = (
            flags, learner, tp, stop, progress, log)
        self.rank, self.size = learner.rank, learner.size
        self.version = int(learner.update_step.numpy())  # as published by start_learner()
        self.st = Stats()
        self.beats = Heartbeats(actor_ids if actor_ids is not None else range(num_actors),
                                flags.actor_timeout_s, self.rank, log)
        self.start = time.time()
        self.start_frames = self.frames = int(learner.num_env_frames.numpy())
        progress.begin(self.start, self.start_frames)
        self.idle = IdleWatch(flags, self.rank, num_actors, log)
        self.checkpoints = CheckpointTimer(learner, flags.checkpoint_every_s, self.rank, log, self.start)
        self.step_stats = {}

    def run(self):
        """Trains until something stops it; returns (reason, exit code)."""
        self.batches = batches.make_batch_source(self.flags, self.learner, self.tp, Stats.FIELDS)
        try:
            while True:
                ready = self.wait_for_batch()
                if self.all_ranks_stop(ready is None):
                    return self.stop_reason()
                self.update(ready)
                self.publish()
                now = time.time()
                self.progress.maybe_write(now, self.st, self.beats, self.step_stats)
                self.checkpoints.maybe_save(now)
        finally:
            self.close_batches()

    def wait_for_batch(self):
        """This rank's next batch, or None for a reason to stop; staying responsive meanwhile.
        st.t_wait is the time the update loop waited here."""
        self.frames = int(self.learner.num_env_frames.numpy())
        t0 = time.perf_counter()
        ready = None
        while (ready is None and not self.stop.flag and self.frames < self.flags.total_environment_frames
               and not self.idle.gave_up):
            ready = self.batches.poll()
            if ready is None:
                self.beats.check(self.st.last_seen)
                self.idle.check()
        self.st.t_wait += time.perf_counter() - t0
        return ready

    def all_ranks_stop(self, local_stop):
        """All ranks agree, once per update, whether to stop (a rank that looped back
        alone would deadlock the others' gradient allreduce)."""
        if self.size == 1:
            return local_stop
        return bool(hvd.allreduce(tf.constant(int(local_stop)), op=hvd.Max, name="stop_flag").numpy())

    def stop_reason(self):
        if self.stop.flag:
            return "stopped by signal %d" % self.stop.signal, 0
        if self.idle.gave_up:
            return "no actors", 4
        if self.frames < self.flags.total_environment_frames:
            return "stopped because another learner rank stopped", 0
        return "frame budget reached", 0

    def update(self, ready):
        """Statistics of the live data, the training batch (with replay), one update."""
        self.idle.got_data()
        t1 = time.perf_counter()
        self.st.add_batch(ready.live, self.version)  # statistics of live data only
        self.beats.check(self.st.last_seen)
        tensors = ready.tensors
        if tensors is None:
            tensors = self.learner.to_tensors(self.learner.make_batch(ready.live))
        self.batches.top_up()  # the next batch's dequeue overlaps this update
        new_frames = tf.constant(self.size * ready.n_live * self.learner.frames_per_unroll, tf.int64)
        self.step_stats = self.learner._train_step(tensors, new_frames)
        self.st.t_learn += time.perf_counter() - t1

    def publish(self):
        t2 = time.perf_counter()
        self.version += 1
        self.tp.publish(self.learner.flat_weights(), self.version)
        self.st.t_publish += time.perf_counter() - t2

    def close_batches(self):
        dropped = self.batches.close()
        if dropped:
            self.log("[learner %d] %d prefetched unroll(s) were dequeued but not trained on (the "
                     "batch in flight at the stop)" % (self.rank, dropped))


def start_learner(flags, logdir, learner_address, num_actors, rank, size, log):
    """The learner (restored with --mode=train_w_load, rank 0's weights on every rank) and
    its transport server, with the initial weights published."""
    learner = Learner(flags, logdir, rank, size)
    if flags.mode == "train_w_load":
        restored = learner.restore(flags.load_model_url)
        log("[learner %d] resumed from %s at %d frames" % (rank, restored, int(learner.num_env_frames.numpy())))
    broadcast(learner)
    tp = transport.LearnerTransport(learner_address, learner.spec, flags.queue_capacity, flags.batch_size)
    tp.publish(learner.flat_weights(), int(learner.update_step.numpy()))
    threads = tf.config.threading.get_intra_op_parallelism_threads()  # 0: TensorFlow's default, all cores
    log("[learner %d/%d] serving %s: %s, %s, batch %d x unroll %d, %d actor(s) assigned, %d new frames/update, "
        "TensorFlow threads: %s" % (rank, size, learner_address, flags.level_name, flags.agent_name, flags.batch_size,
                                    flags.unroll_length, num_actors, learner.live_frames_per_update, threads or "all"))
    return learner, tp


def finish(learner, tp, trainer, progress, reason, exit_code, logdir, log):
    """The final checkpoint (exit code 5 when the chief could not save it), the report
    and summary.json; returns the exit code."""
    rank = learner.rank
    path = save_or_report(learner, log, rank)
    if path is None and learner.is_chief:
        exit_code = 5
    tp.close()
    elapsed = time.time() - trainer.start
    frames = int(learner.num_env_frames.numpy())
    report = _bottleneck_report(trainer.st, elapsed, frames - trainer.start_frames, learner.frames_per_step)
    log("[learner %d] %s after %d frames (%.0f s); checkpoint %s" % (rank, reason, frames, elapsed, path))
    log("[learner %d] final weights sha256 %s" % (rank, hashlib.sha256(learner.flat_weights().tobytes()).hexdigest()))
    log(report["text"])
    if learner.is_chief:
        summary = {"reason": reason, "frames": frames, "elapsed_s": elapsed,
                   "mean_return_20": trainer.st.mean_return(), "episodes": trainer.st.episodes,
                   "checkpoint": path, "time_breakdown": report["numbers"]}
        write_summary(learner, summary, logdir, log)
        progress.close()
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
    stop = StopRequest()
    learner, tp = start_learner(flags, logdir, learner_address, num_actors, rank, size, log)
    progress = Progress(flags, learner, tp, logdir, rank, num_actors, log)
    t0 = time.time()
    learner.warm_up()  # while the actors start up
    log("[learner %d] update traced in %.1f s" % (rank, time.time() - t0))
    trainer = Trainer(flags, learner, tp, stop, progress, num_actors, log, actor_ids)
    reason, exit_code = trainer.run()
    return finish(learner, tp, trainer, progress, reason, exit_code, logdir, log)


def _log_progress(log, rank, frames, total, fps, st, fill, elapsed, eta, step_stats, num_actors, alive):
    eta_s = int(min(eta, 99 * 3600))
    log("[learner %d] frames %s/%s (%4.1f%%) | %6.0f fps | return %7.2f (last 20 of %d eps) | "
        "queue %3.0f%% | lag %.1f | actors %d/%d | loss %.3f | %s elapsed, %s left"
        % (rank, _si(frames), _si(total), 100.0 * frames / total, fps, st.mean_return(), st.episodes,
           100 * fill, np.mean(st.lag) if st.lag else 0.0, alive, num_actors,
           float(step_stats.get("total_loss", float("nan"))),
           time.strftime("%H:%M:%S", time.gmtime(elapsed)),
           "%02d:%02d:%02d" % (eta_s // 3600, eta_s % 3600 // 60, eta_s % 60)))


def _si(n):
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return "%.2f%s" % (n / div, unit)
    return str(n)


def _bottleneck_report(st, elapsed, frames, frames_per_step):
    """Where time went, and which side limited throughput."""
    learner_busy = st.t_learn + st.t_publish
    n = max(st.actor_unrolls, 1)
    env_s, inf_s, tx_s = st.actor_time / n  # per unroll, per env
    actor_total = env_s + inf_s + tx_s
    wait_frac = st.t_wait / max(elapsed, 1e-9)
    if wait_frac > 0.25:
        verdict = "actors (the learner waited for data %.0f%% of the time)" % (100 * wait_frac)
    else:
        verdict = "learner (busy %.0f%% of the time; actors block on a full queue)" % (
            100 * learner_busy / max(elapsed, 1e-9))
    numbers = {"learner_wait_s": st.t_wait, "learner_learn_s": st.t_learn,
               "learner_publish_s": st.t_publish, "elapsed_s": elapsed, "frames": frames,
               "actor_env_share": env_s / max(actor_total, 1e-9),
               "actor_inference_share": inf_s / max(actor_total, 1e-9),
               "actor_transfer_share": tx_s / max(actor_total, 1e-9), "bottleneck": verdict}
    text = ("[learner] where time went: learner %.0f%% learning, %.0f%% publishing weights, %.0f%% "
            "waiting for data | actors %.0f%% env steps, %.0f%% inference, %.0f%% transfer "
            "(incl. waiting on a full queue) | bottleneck: %s"
            % (100 * st.t_learn / max(elapsed, 1e-9), 100 * st.t_publish / max(elapsed, 1e-9),
               100 * wait_frac, 100 * numbers["actor_env_share"], 100 * numbers["actor_inference_share"],
               100 * numbers["actor_transfer_share"], verdict))
    return {"text": text, "numbers": numbers}
