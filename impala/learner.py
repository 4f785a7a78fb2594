"""IMPALA learner state: the agent, its optimizer, the frame and update counters, the replay mixer,
one update step (dequeued batch -> V-trace loss (loss.py) -> gradients, averaged over Horovod ranks ->
optimizer), and checkpoints of all of it. With K Horovod ranks, each rank serves its own actors and
gradients are averaged with allreduce, so all ranks hold identical weights; the effective batch is
K x batch_size unrolls per update with the same learning rate (the loss is a sum over time and
batch, as in scalable_agent). The loop around it is training.py.

Rank 0 alone writes checkpoints.
"""
import glob
import json
import os

import numpy as np
import sonnet as snt
import tensorflow as tf

import nets
from impala import agent as agent_lib
from impala import loss as loss_lib
from impala.optimizers import FusedAdam
from impala import precision
from impala import replay as replay_lib
from impala import replay_files
from impala import transport
from impala.batches import minibatch, step_fields, step_minibatch, to_time_major
from tools.files import write_json

try:  # Horovod is optional for a single learner
    import horovod.tensorflow as hvd
except ImportError:  # pragma: no cover - install.sh always installs it
    hvd = None


KEEP_CHECKPOINTS = 3  # the newest ones; an unreadable newest falls back to the next
EPISODES_SUFFIX = ".episodes.json"  # beside a checkpoint's prefix: the chief's recent episodes
REWARD_CLIP = 10.0  # --normalize_rewards: SB3 VecNormalize's clip_reward


def make_optimizer(flags, learning_rate, variables, adam=FusedAdam):
    """--optimizer with its slots created now (so that a restore fills them). `adam`: the class
    --optimizer=adam makes (bench/kernels.py's optimizer lever passes Sonnet's own).

    rmsprop: TF1's tf.train.RMSPropOptimizer, which the original IMPALA used:
      ms <- decay ms + (1 - decay) g^2;  step = lr g / sqrt(ms + epsilon), with ms
      starting at ONE. Sonnet 2's RMSProp starts ms at zero, so its first steps are
      about 1/sqrt(1 - decay) = 10x lr in the sign of the gradient, large enough to kill
      first-layer filters on Pong (bench/results/pong_diagnosis.md), so ms is set to one here.
    adam: Adam (beta1 0.9, beta2 0.999, --adam_epsilon), bias-corrected, so it has no
      such start-up burst; RLlib's IMPALA/APPO default. Sonnet's update, one fused kernel per
      variable (impala/optimizers.py).
    """
    if flags.optimizer == "adam":
        optimizer = adam(learning_rate, epsilon=flags.adam_epsilon)
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


def mean_over_ranks(times):
    """{name: seconds} averaged over the Horovod ranks (precision.resolve's `agree`)."""
    names = sorted(times)
    mean = hvd.allreduce(tf.constant([times[n] for n in names], tf.float64), op=hvd.Average,
                         name="compute_dtype_times")
    return dict(zip(names, (float(t) for t in mean.numpy())))


class Learner:
    """One rank's model, optimizer, counters and replay, with its update step and checkpoints."""

    def __init__(self, flags, logdir, rank=0, size=1):
        self.flags = flags
        self.logdir = logdir
        self.rank, self.size = rank, size
        self.is_chief = rank == 0
        tf.random.set_seed(flags.seed * 7919 + 100000 + rank)
        self.agent, self.spec, self.env_spec = agent_lib.build_from_flags(flags)
        self.variables = self.agent.trainable_variables
        if flags.weight_init == "orthogonal":  # before anything is published: actors get these too
            nets.orthogonal_init(self.agent, seed=flags.seed)
        # before the update is traced; timed on one minibatch, the unit of the update's work
        self.compute_dtype_note = precision.resolve(
            flags, self.agent, self.env_spec, max(1, flags.batch_size * flags.unroll_length // flags.num_minibatches),
            train=True, agree=mean_over_ranks if size > 1 else None)
        self.frames_per_step = flags.num_action_repeats or (4 if self.env_spec.is_atari else 1)
        self.num_env_frames = tf.Variable(0, dtype=tf.int64, trainable=False, name="num_env_frames")
        self.update_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="update_step")
        self.learning_rate = tf.Variable(flags.learning_rate, dtype=tf.float32, trainable=False)
        # Gradient steps refused because their gradients were not finite (see _step); not in
        # checkpoints: a resumed run counts afresh.
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.optimizer = make_optimizer(flags, self.learning_rate, self.variables)
        # --normalize_rewards: the running variance of the envs' discounted returns. The learner's
        # alone (the actors send returns, not scaled rewards), so it is saved here, not in the agent.
        self.reward_normaliser = nets.RunningNormaliser((), "reward_normaliser") if flags.normalize_rewards else None
        extra = {} if self.reward_normaliser is None else {"reward_normaliser": self.reward_normaliser}
        self.ckpt = tf.train.Checkpoint(agent=self.agent, optimizer=self.optimizer,
                                        num_env_frames=self.num_env_frames,
                                        update_step=self.update_step, **extra)
        self.ckpt_dir = os.path.join(logdir, "checkpoints")
        self.manager = tf.train.CheckpointManager(self.ckpt, self.ckpt_dir, max_to_keep=KEEP_CHECKPOINTS)
        # The chief's episode statistics ride beside each checkpoint as <prefix>.episodes.json (a
        # file, not checkpoint variables, so checkpoints written before them still restore):
        # `episode_record` gives them to save(), `restored_episodes` holds what restore() found.
        self.episode_record, self.restored_episodes = None, None
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
        """The update's input: time-major tensors of a [B, ...] batch, with "fresh" [B]: the
        unrolls trained on for the first time (all of them without replay)."""
        tensors = {k: tf.constant(v) for k, v in to_time_major(batch, self.spec.names).items()}
        fresh = batch.get("fresh")
        tensors["fresh"] = tf.ones([len(batch["action"])], tf.bool) if fresh is None else tf.constant(fresh)
        return tensors

    def make_batch(self, live):
        """The training batch ([B, ...] arrays) from the live unrolls (and replay); with
        replay, "fresh" [B] marks the unrolls that come from the queue, not from a buffer."""
        if self.mixer is None:
            return live
        items = replay_lib.split_batch(live)
        chosen = self.mixer.sample(items, self._features_fn)
        self.mixer.add(items, self._features_fn)
        return dict(replay_lib.stack_items(chosen), fresh=np.array(self.mixer.last_fresh, bool))

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
        first step, is fixed. Returns the batch (with "old_logits", and V-trace's targets with
        --vtrace_targets=batch_start) and the error scale of the baseline (compute_losses'
        value_scale). Only the fresh unrolls move the statistics: a replayed one was counted
        when it was new. Its stages are methods so that impala/diagnose.py can replay them
        one by one."""
        average = (lambda t: hvd.allreduce(t, op=hvd.Average)) if self.size > 1 else None
        self.move_observation_statistics(batch, average)
        batch = self.scale_rewards(batch, average)
        batch = self.bootstrap_at_cuts(batch)
        if self.needs_batch_start_unroll():
            out, _ = self.agent.unroll(batch["observation"], batch["first"], self._core_state(batch))
            batch, targets = self.fix_batch_start(batch, out)
            self.move_return_statistics(batch, targets, average)
        return batch, self.value_scale()

    def move_observation_statistics(self, batch, average=None):
        if self.agent.obs_normaliser is not None:
            self.agent.obs_normaliser.update(nets.preprocess_observation(batch["observation"][:-1]), average,
                                             batch.get("fresh"))

    def scale_rewards(self, batch, average=None):
        """--normalize_rewards: the batch with its rewards divided by the running standard deviation
        of the envs' discounted returns, clipped to +-REWARD_CLIP (SB3's VecNormalize and CleanRL's
        reward scaling; the mean is not taken off, so a reward's sign stays). The statistics take
        the fresh unrolls' returns first, once per batch, so that every gradient step, and a
        replayed unroll, reads rewards on the current scale. Unchanged without the flag."""
        if self.reward_normaliser is None:
            return batch
        self.reward_normaliser.update(batch["discounted_return"], average, batch.get("fresh"))
        scaled = batch["reward"] / self.reward_normaliser.std()
        return dict(batch, reward=tf.clip_by_value(scaled, -REWARD_CLIP, REWARD_CLIP))

    def reward_statistics_finite(self):
        """Whether --normalize_rewards' statistics are finite (True without it)."""
        norm = self.reward_normaliser
        return norm is None or bool(np.isfinite(norm.mean.numpy()) and np.isfinite(norm.var.numpy()))

    def bootstrap_at_cuts(self, batch):
        """The batch with its "timeout_value" [T, B] at each row's last time-limit cut (its
        "cut_step" [B], -1 where none) replaced by the current net's value of that episode's last
        observation (shipped by the actor, transport.put_cut_observation), without gradient: the
        actor's value came from its older weights, and a replayed unroll's from far older ones.
        Normalisation and frame stacking are the agent's own, as for every observation; a
        recurrent agent's core state is the one its current net carries out of the cut's step.
        Earlier cuts in the same row keep the actor's value. Once per batch, after the
        observation statistics moved: all its gradient steps bootstrap from it. Unchanged
        without cut fields (an unroll spec from before them)."""
        if "cut_step" not in batch:
            return batch
        cut_step = tf.cast(batch["cut_step"], tf.int32)
        timeout_value = batch["timeout_value"]

        def fresh():
            if "cut_frame" in batch:
                last = transport.cut_stack(batch["observation"], cut_step, batch["cut_frame"])
            else:
                last = batch["cut_observation"]
            out, _ = self.agent(last, tf.zeros_like(cut_step, tf.bool), self._state_at_cuts(batch, cut_step))
            at = tf.equal(tf.range(tf.shape(timeout_value)[0])[:, None], cut_step[None, :])  # [T, B]
            return tf.where(at, tf.stop_gradient(out.baseline)[None, :], timeout_value)

        return dict(batch, timeout_value=tf.cond(tf.reduce_any(cut_step >= 0), fresh, lambda: timeout_value))

    def _state_at_cuts(self, batch, cut_step):
        """Each row's core state out of step cut_step [B] of the batch, from its stored start state
        through the current net, without gradient (a feed-forward agent's empty state)."""
        n = tf.shape(cut_step)[0]
        if not tf.nest.flatten(self.agent.initial_state(1)):
            return self.agent.initial_state(n)
        states = self.agent.core_states(batch["observation"][:-1], batch["first"][:-1], self._core_state(batch))
        at = tf.stack([tf.maximum(cut_step, 0), tf.range(n)], -1)
        return tf.nest.map_structure(lambda s: tf.stop_gradient(tf.gather_nd(s, at)), states)

    def anchored(self):
        """Whether the clipped surrogate's ratio is taken against pi_old (--clip_ratio_to)."""
        return self.flags.clip_param > 0 and self.flags.clip_ratio_to in ("batch_start", "fresh_batch_start")

    def needs_batch_start_targets(self):
        return self.flags.vtrace_targets == "batch_start" or self.agent.return_normaliser is not None

    def needs_batch_start_unroll(self):
        return self.anchored() or self.needs_batch_start_targets()

    def fix_batch_start(self, batch, out):
        """(the batch with what its gradient steps keep from the unroll `out` as the batch
        arrived, V-trace's targets then in return units, or None where nothing reads them)."""
        if self.anchored():
            batch = dict(batch, old_logits=tf.stop_gradient(out.policy_logits[:-1]))
            if self.flags.clip_ratio_to == "fresh_batch_start":
                batch = dict(batch, **loss_lib.fresh_steps(batch))
        if not self.needs_batch_start_targets():
            return batch, None
        targets = loss_lib.vtrace_targets(out, batch, self.flags)
        if self.flags.vtrace_targets == "batch_start":
            # The statistics' move that follows keeps the values in return units where they
            # are (--preserve_value_outputs), so targets fixed now stay valid.
            batch = dict(batch, **loss_lib.fixed_targets(targets))
        return batch, targets

    def move_return_statistics(self, batch, targets, average=None):
        if self.agent.return_normaliser is not None:
            self.agent.update_return_statistics(tf.stop_gradient(targets.vs), average, batch.get("fresh"),
                                                self.flags.preserve_value_outputs)

    def action_bounds(self):
        """(low, high) of a Box action space, for compute_losses' --action_bound_cost; None for Discrete."""
        return None if self.env_spec.discrete else (self.env_spec.action_low, self.env_spec.action_high)

    def value_scale(self):
        return 1.0 if self.agent.return_normaliser is None else self.agent.return_normaliser.std()

    def scheduled_learning_rate(self):
        """--learning_rate, falling linearly to 0 at --total_environment_frames with
        --learning_rate_decay=linear, at the frames counted so far."""
        if self.flags.learning_rate_decay != "linear":
            return tf.constant(self.flags.learning_rate, tf.float32)
        frac = 1.0 - tf.cast(self.num_env_frames, tf.float32) / float(self.flags.total_environment_frames)
        return self.flags.learning_rate * tf.maximum(frac, 0.0)

    def _step(self, batch, new_frames):
        self.learning_rate.assign(self.scheduled_learning_rate())
        batch, value_scale = self._batch_start(batch)
        # --num_sgd_iter passes over the batch, each in --num_minibatches gradient steps on
        # disjoint random subsets of it (1 x 1: IMPALA; more: APPO-style reuse, with
        # V-trace correcting for the policy having moved since the actors acted).
        passes, parts = self.flags.num_sgd_iter, self.flags.num_minibatches
        take = self._minibatches(batch, passes, parts)

        def sgd_step(i):
            mb = take(i)
            with tf.GradientTape() as tape:
                out, _ = self.agent.unroll(mb["observation"], mb["first"], self._core_state(mb))
                loss, step_stats = loss_lib.compute_losses(out, mb, self.flags, value_scale, self.action_bounds())
            if self.size > 1:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, self.variables)
            grad_norm = tf.linalg.global_norm(grads)
            if self.flags.gradients_clipping > 0:
                grads, _ = tf.clip_by_global_norm(grads, self.flags.gradients_clipping, use_norm=grad_norm)
            self.skipped_steps.assign_add(self._apply_if_finite(grads, grad_norm))
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
        stats["skipped_steps"] = self.skipped_steps.read_value()  # after every step's assign_add
        return stats

    def _minibatches(self, batch, passes, parts):
        """i -> the minibatch of gradient step i: the (i % parts)-th slice of pass i // parts's
        random order of the batch's unrolls (--minibatch_over=unrolls) or of its single steps
        (steps: PPO's minibatches, whose steps come from many unrolls and times)."""
        if parts == 1 and self.flags.minibatch_over == "unrolls":
            return lambda i: batch
        if self.flags.minibatch_over == "steps":
            source, n, gather = step_fields(batch), batch["action"].shape[0] * batch["action"].shape[1], step_minibatch
        else:
            source, n, gather = batch, batch["action"].shape[1], minibatch
        size = n // parts
        orders = tf.stack([tf.random.shuffle(tf.range(n)) for _ in range(passes)])
        return lambda i: gather(source, orders[i // parts, (i % parts) * size:(i % parts + 1) * size])

    def _apply_if_finite(self, grads, grad_norm):
        """Applies the gradients unless one is NaN or infinite (their global norm is then not
        finite); returns 1 for a refused step, else 0. One non-finite step would otherwise make
        every weight NaN for good, and the actors act on what is published. With several ranks
        the norm is of the allreduced gradients, so every rank decides the same."""
        def apply():
            self.optimizer.apply(grads, self.variables)
            return tf.constant(0, tf.int64)
        return tf.cond(tf.math.is_finite(grad_norm), apply, lambda: tf.constant(1, tf.int64))

    def zero_batch(self, batch_size=None):
        """A time-major batch of zeros with every field the transport delivers, as the
        training loop passes it to the update."""
        b = self.flags.batch_size if batch_size is None else batch_size
        return dict(to_time_major({f.name: np.zeros((b,) + f.shape, f.dtype) for f in self.spec.fields},
                                  self.spec.names), fresh=np.ones(b, bool))

    def warm_up(self):
        """Traces the update for a batch of the run's shapes without running it (no weight
        moves), so the first real batch does not wait for TensorFlow to build the graph."""
        self._train_step.get_concrete_function(
            {k: tf.TensorSpec(v.shape, v.dtype) for k, v in self.zero_batch().items()},
            tf.TensorSpec([], tf.int64))

    # -- checkpoints ----------------------------------------------------
    def restore(self, path):
        """Restores agent, optimizer and counters; returns the prefix used. The learning rate
        is the one flag value a checkpoint carries (the optimizer's variable): the command
        line wins over it, as for every flag."""
        prefix = restore_newest_readable(self.ckpt, path, full=True)
        saved_rate = float(self.learning_rate.numpy())
        self.learning_rate.assign(self.scheduled_learning_rate())
        if abs(saved_rate - self.flags.learning_rate) > 1e-12 and self.flags.learning_rate_decay == "none":
            print("[learner %d] learning rate %g from --learning_rate (the checkpoint had %g)"
                  % (self.rank, self.flags.learning_rate, saved_rate), flush=True)
        if self.mixer is not None:
            replay_files.load(self.mixer, prefix, self.rank, fields=self.spec.names)
        if self.is_chief and os.path.exists(prefix + EPISODES_SUFFIX):
            with open(prefix + EPISODES_SUFFIX) as f:
                self.restored_episodes = json.load(f)
        return prefix

    def save(self):
        """Every rank saves its replay state (when it has replay), named after the
        checkpoint it belongs to; rank 0 alone then writes the checkpoint (the weights are
        the same on every rank). Returns the checkpoint's prefix on rank 0, else None."""
        step = int(self.update_step.numpy())
        if self.mixer is not None:  # first: a checkpoint never lacks the replay state it names
            replay_files.save(self.mixer, self.ckpt_dir, step, self.rank, self.flags.checkpoint_replay,
                              KEEP_CHECKPOINTS)
        if not self.is_chief:
            return None
        if self.episode_record is not None:  # before the index names the checkpoint, as the replay files
            os.makedirs(self.ckpt_dir, exist_ok=True)
            write_json(os.path.join(self.ckpt_dir, "ckpt-%d" % step) + EPISODES_SUFFIX, self.episode_record())
        # CheckpointManager writes data files first and then atomically
        # replaces the `checkpoint` index, so a torn write is never newest.
        prefix = self.manager.save(checkpoint_number=step)
        kept = set(self.manager.checkpoints)
        for path in glob.glob(os.path.join(self.ckpt_dir, "ckpt-*" + EPISODES_SUFFIX)):
            if path[:-len(EPISODES_SUFFIX)] not in kept:
                os.remove(path)
        return prefix

    def flat_weights(self):
        return agent_lib.published_weights(self.agent)


def checkpoint_candidates(path):
    """Checkpoint prefixes under a run folder / checkpoint dir, newest first, or [path]."""
    if path and os.path.isdir(path):
        sub = os.path.join(path, "checkpoints")
        state = tf.train.get_checkpoint_state(sub if os.path.isdir(sub) else path)
        return list(reversed(state.all_model_checkpoint_paths)) if state else []
    return [path] if path else []


class CheckpointMismatch(Exception):
    """A checkpoint that reads but does not fit the agent the flags built. Not a ValueError: the
    search for a readable checkpoint must not skip it as unreadable and try an older one."""


# agent attribute -> the flag that builds it: the normalisers' statistics (nets.normalisers) and the
# layer norm before a recurrent agent's LSTM (nets/base.py, LSTMAgent)
OPTIONAL_PARTS = {"obs_normaliser": "normalize_observations", "return_normaliser": "normalize_returns",
                  "_input_norm": "lstm_input_norm"}


def check_optional_parts(agent, prefix):
    """Raises CheckpointMismatch, naming the checkpoint and the flag, when it holds one of the
    agent's optional parts (OPTIONAL_PARTS) that the agent was built without, or lacks one the agent
    has: a partial restore (test mode's expect_partial) would drop it, or leave the part's initial
    values, silently, and the policy would see observations standardised unlike in training (or not
    at all), or its LSTM read features normalised unlike in training."""
    saved = {name.split("/")[1] for name, _ in tf.train.list_variables(prefix)
             if name.startswith("agent/") and name.count("/") >= 2}
    for attr, flag in OPTIONAL_PARTS.items():
        built = getattr(agent, attr, None) is not None
        if attr in saved and not built:
            raise CheckpointMismatch("checkpoint %s holds agent/%s, but the agent was built without it (the "
                                     "run's options.json is missing or does not say --%s): pass --%s"
                                     % (prefix, attr, flag, flag))
        if built and attr not in saved:
            raise CheckpointMismatch("checkpoint %s has no agent/%s (it was trained without --%s), but the agent "
                                     "was built with it: pass --no%s" % (prefix, attr, flag, flag))


def restored_agent(flags, source):
    """(agent, env spec, checkpoint prefix): the agent the run's flags build, the newest readable
    checkpoint of `source` in it, as --mode=test plays it and --mode=export saves it."""
    agent, spec = untrained_agent(flags)
    prefix = restore_newest_readable(tf.train.Checkpoint(agent=agent), source, full=False)
    return agent, spec, prefix


def untrained_agent(flags):
    """(agent, env spec): the agent the run's flags build, with the weights it starts training from."""
    agent, _, spec = agent_lib.build_agent(flags.level_name, flags.agent_name, flags.unroll_length,
                                           agent_lib.frame_size_of(flags),
                                           normalize_observations=flags.normalize_observations,
                                           normalize_returns=flags.normalize_returns,
                                           net=agent_lib.net_options(flags))
    return agent, spec


def restore_newest_readable(ckpt, path, full):
    """Restores the newest checkpoint that reads; a corrupt newest one is skipped
    with a warning. `full` requires every saved object to match (training);
    otherwise only the agent is needed (testing). Either way the agent's optional
    parts, the normalisers and the LSTM's layer norm, must match (check_optional_parts)."""
    candidates = checkpoint_candidates(path)
    last = None
    for prefix in candidates:
        try:
            check_optional_parts(ckpt.agent, prefix)  # reads the index only: an unreadable one raises OpError
            status = ckpt.restore(prefix)
            if full:
                status.assert_existing_objects_matched()
            else:
                status.expect_partial()
            return prefix
        # A truncated data file surfaces as IndexError ('Read less bytes than requested').
        except (tf.errors.OpError, AssertionError, ValueError, IndexError, KeyError, OSError) as e:
            last = unreadable_reason(prefix, e)
            print("WARNING: checkpoint %s is unreadable (%s); trying an older one"
                  % (prefix, str(e).splitlines()[0][:200] if str(e) else type(e).__name__), flush=True)
    raise no_readable_checkpoint(path, candidates, last)


def unreadable_reason(prefix, e):
    """'prefix: the first line of why it could not be read', for no_readable_checkpoint."""
    return "%s: %s" % (prefix, (str(e).splitlines() or [type(e).__name__])[0][:200])


def no_readable_checkpoint(path, candidates, last):
    """The one-line error for --load_model_url=path when none of its checkpoint candidates
    read (last: unreadable_reason of the last one tried), or none is listed at all."""
    if not candidates:
        where = os.path.join(path, "checkpoints") if path and os.path.isdir(os.path.join(path, "checkpoints")) else path
        return FileNotFoundError("--load_model_url=%s: no checkpoint listed there (%s has no readable `checkpoint` "
                                 "index file); give a run folder the learner wrote, or a checkpoint prefix such "
                                 "as %s" % (path, where, os.path.join(str(where), "ckpt-1")))
    return FileNotFoundError("--load_model_url=%s: no readable checkpoint there (looked at %d; the last, %s); "
                             "give a run folder whose checkpoint files (.index and .data-*) are whole"
                             % (path, len(candidates), last))


def broadcast(learner):
    """Start from rank 0's weights, optimizer state and counters."""
    if learner.size > 1:
        hvd.broadcast_variables(list(learner.variables) + list(learner.optimizer.variables)
                                + [v for n in nets.normalisers(learner.agent) for v in n.variables]
                                + [learner.num_env_frames, learner.update_step], root_rank=0)


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


class CheckpointTimer:
    """A checkpoint every --checkpoint_every_s (a failed save is reported; training goes on).
    The ranks agree on when (training.Trainer), so each rank's replay file is written for the
    same checkpoint."""

    def __init__(self, learner, every_s, rank, log, start):
        self.learner, self.every_s, self.rank, self.log, self.last = learner, every_s, rank, log, start

    def due(self, now):
        return now - self.last >= self.every_s

    def save(self, now):
        save_or_report(self.learner, self.log, self.rank)
        self.last = now
