"""Actor -> learner transport over TensorFlow's distributed runtime.

Each learner hosts a `tf.distribute.Server`. On it live two shared resources,
created by a small TF1-style graph that is kept for the transport alone (the
models and the learner step are TF2/eager, see learner.py):

  * a bounded FIFO queue of unrolls (`shared_name="unrolls"`): actors enqueue,
    the learner dequeues batches. A full queue blocks the actors: that is the
    backpressure that bounds the policy lag and the memory.
  * a flat float32 weights variable and a version counter: the learner assigns
    after each update, actors read when the version changed.

Actors are plain gRPC *clients* of the learner's server (`Session("grpc://ip:port")`)
rather than members of its ClusterSpec, as DeepMind's scalable_agent had them.
Measured reason: a client needs no server of its own and no entry in the
learner's cluster, so actors can come, go and restart without restarting the
learner, and feeds travel inside the RunStep request (one hop). See README.

Both sides build the same graph from the same `UnrollSpec`; if an actor's
spec differs (other env or agent flags) TF refuses the shared queue and the
actor exits with a clear message.

Security: TF's gRPC servers are unauthenticated and listen on all interfaces
of their port. Run them on a private network (or SSH tunnels), never exposed.
"""
import threading
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

import envs
from nets import distributions
from impala import telemetry

v1 = tf.compat.v1


class Field(NamedTuple):
    name: str
    dtype: np.dtype
    shape: tuple


class UnrollSpec(NamedTuple):
    """Shapes and dtypes of one queue element (one environment's unroll)."""
    fields: tuple  # of Field, in a fixed order
    weights_size: int

    @property
    def names(self):
        return [f.name for f in self.fields]

    def nbytes(self):
        return sum(int(np.prod(f.shape)) * np.dtype(f.dtype).itemsize for f in self.fields)


def _observation_fields(obs_shape, obs_dtype, T, newest_frames):
    if newest_frames:
        *hw, C = obs_shape
        return [Field("frames", np.dtype(obs_dtype), (T + C,) + tuple(hw)),
                Field("stack_reset", np.dtype(bool), (T + 1,))]
    return [Field("observation", np.dtype(obs_dtype), (T + 1,) + tuple(obs_shape))]


def _cut_fields(obs_shape, obs_dtype, newest_frames):
    if newest_frames:
        obs = Field("cut_frame", np.dtype(obs_dtype), tuple(obs_shape[:-1]))
    else:
        obs = Field("cut_observation", np.dtype(obs_dtype), tuple(obs_shape))
    return [obs, Field("cut_step", np.dtype(np.int32), ())]


def make_unroll_spec(obs_shape, obs_dtype, actions, unroll_length, core_state_shapes,
                     weights_size, newest_frames=False, cut_observation=False, discounted_return=False):
    """actions: a number of discrete actions or a nets.distributions policy, which sets the
    action field's shape and dtype and the width of the behaviour policy's parameters.
    newest_frames: stacked frames [H, W, C] travel as the C frames of the first observation
    and then only each step's newest frame (C times fewer bytes; see stack_frames).
    cut_observation: each unroll also carries the last observation of its last episode cut by a
    time limit ("cut_observation", or with newest_frames only its newest frame "cut_frame": the
    older ones are observation cut_step's, see cut_stack) and that cut's step ("cut_step", -1
    where none), so that the learner bootstraps from its current value there, not the actor's.
    discounted_return: each step also carries its env's discounted return so far (the actor's
    running sum over the unrolls, 0 again after each episode end), from which the learner scales
    rewards with --normalize_rewards."""
    T = unroll_length
    policy = distributions.make(actions)
    fields = _observation_fields(obs_shape, obs_dtype, T, newest_frames) + [
        Field("first", np.dtype(bool), (T + 1,)),
        Field("action", np.dtype(policy.action_dtype.as_numpy_dtype), (T,) + policy.action_shape),
        Field("reward", np.dtype(np.float32), (T,)),
    ] + ([Field("discounted_return", np.dtype(np.float32), (T,))] if discounted_return else []) + [
        Field("done", np.dtype(bool), (T,)),
        # The actor's baseline V(x) of the last observation of an episode cut by a time
        # limit (truncated, not terminated), at that step; 0 elsewhere. The learner adds
        # gamma * V(x) to the reward there: a time limit is not a terminal state. With the
        # cut_* fields the learner replaces it at the row's last cut by its current V(x).
        Field("timeout_value", np.dtype(np.float32), (T,)),
    ]
    if cut_observation:
        fields += _cut_fields(obs_shape, obs_dtype, newest_frames)
    fields += [
        # The actor's policy: softmax logits, or a Gaussian's means and log standard deviations.
        Field("behaviour_logits", np.dtype(np.float32), (T, policy.param_size)),
        Field("episode_end", np.dtype(bool), (T,)),
        Field("episode_return", np.dtype(np.float32), (T,)),
        Field("episode_length", np.dtype(np.int32), (T,)),
        Field("actor_id", np.dtype(np.int32), ()),
        Field("policy_version", np.dtype(np.int64), ()),
        # Seconds the actor spent on [env steps, inference, transfer] for this unroll.
        Field("actor_timing", np.dtype(np.float32), (3,)),
        # Env crashes during this unroll (envs.batch makes a crashed env anew and goes on).
        Field("env_crashes", np.dtype(np.int32), ()),
        # Telemetry (impala/telemetry.py): the actor's host name (UTF-8, zero-padded), its CPU %
        # since its previous unroll (100 = one core) and its resident memory in MB.
        Field("actor_host", np.dtype(np.uint8), (telemetry.HOST_BYTES,)),
        Field("actor_cpu", np.dtype(np.float32), ()),
        Field("actor_rss_mb", np.dtype(np.float32), ()),
        # Exactly-once delivery: a random id per actor process and its unrolls' numbers from 1
        # (0: unnumbered, never dropped). An enqueue that timed out after the queue took part of
        # it is sent again whole; the learner drops what it already took (RepeatFilter).
        Field("sender", np.dtype(np.int64), ()),
        Field("sequence", np.dtype(np.int64), ()),
    ]
    for i, shape in enumerate(core_state_shapes):
        fields.append(Field(f"core_state_{i}", np.dtype(np.float32), tuple(shape)))
    return UnrollSpec(tuple(fields), int(weights_size))


def put_observation(buf, rows, t, obs, new_game=None):
    """Writes observation t ([n, H, W, C]) of the unrolls `rows` into an actor's buffer in its
    spec's layout: whole, or as newest frames (all C frames at t = 0, then the newest one, and
    new_game [n] where ale-py restarted the stack, whose older frames must then be black)."""
    if "frames" not in buf:
        buf["observation"][rows, t] = obs
        return
    C = obs.shape[-1]
    if t == 0:
        buf["frames"][rows, :C] = np.moveaxis(obs, -1, 1)
        return
    if new_game.any() and obs[new_game, ..., :C - 1].any():
        raise RuntimeError("the env's frame stack at a new game is not %d black frames and the new one; "
                           "run with --obs_transfer=stacks" % (C - 1))
    buf["frames"][rows, C - 1 + t] = obs[..., C - 1]
    buf["stack_reset"][rows, t] = new_game


def put_cut_observation(buf, rows, obs):
    """Writes the last observations obs [n, ...] of the episodes cut in the unrolls `rows` (an
    index array) in the spec's layout: whole, or only their newest frame (cut_stack rebuilds
    the rest from the observation of the cut's step)."""
    if "cut_frame" in buf:
        buf["cut_frame"][rows] = obs[..., -1]
    else:
        buf["cut_observation"][rows] = obs


def cut_stack(observation, cut_step, cut_frame):
    """The learner's side of put_cut_observation with newest frames (TensorFlow): the stacked
    last observations [B, H, W, C] of the cut episodes from the stacked observations
    [T+1, B, H, W, C], the cuts' steps [B] and their newest frames [B, H, W]. The env pushed
    the last frame onto the stack of observation cut_step (envs/batch.py): its C-1 newest
    channels, then the last frame. Rows without a cut (cut_step -1) get a stack from
    observation 0 that nothing reads."""
    step = tf.maximum(tf.cast(cut_step, tf.int32), 0)
    at = tf.gather_nd(observation, tf.stack([step, tf.range(tf.shape(step)[0])], axis=1))
    return tf.concat([at[..., 1:], tf.cast(cut_frame, at.dtype)[..., None]], axis=-1)


def stack_frames(frames, stack_reset):
    """The time-major stacked observations [T+1, B, H, W, C] of unrolls sent as newest frames.

    frames [B, T+C, H, W]: the C frames of observation 0, then the newest frame of each of
    observations 1..T; channel k of observation t is frames[t + k]. stack_reset [B, T+1]:
    True where observation t is the first of a new game, whose stack ale-py's vector env
    starts as C-1 black frames and the new one, so the older channels there, and the ones
    that still reach back before the reset C-2 steps later, are zeros."""
    B, T1 = stack_reset.shape
    C = frames.shape[1] - T1 + 1
    H, W = frames.shape[2:]
    obs = np.empty((T1, B, H, W, C), frames.dtype)
    stacks = np.empty((T1, H, W, C), frames.dtype)  # one unroll's: 5x numpy's channel-by-channel copy
    for b in range(B):
        envs.merge_frames([frames[b, k:k + T1] for k in range(C)], stacks)
        obs[:, b] = stacks
    for b, t in zip(*np.nonzero(stack_reset[:, 1:])):
        for d in range(min(C - 1, T1 - 1 - t)):  # observation t+1+d: channels before the reset
            obs[t + 1 + d, b, ..., :C - 1 - d] = 0
    return obs


PACKED_VERSION = 2  # float32 words that carry the int64 version at the end of the weights


def pack_weights(flat_weights, version, out=None):
    """flat weights [N] float32 + version -> [N + 2] float32, the version's bits at the end."""
    out = np.empty(flat_weights.size + PACKED_VERSION, np.float32) if out is None else out
    out[:-PACKED_VERSION] = flat_weights
    out[-PACKED_VERSION:] = np.array([version], np.int64).view(np.float32)
    return out


def unpack_weights(packed):
    """The inverse of pack_weights: (version, flat weights)."""
    return int(packed[-PACKED_VERSION:].view(np.int64)[0]), packed[:-PACKED_VERSION]


class RepeatFilter:
    """Drops unrolls the learner already took. Each actor process numbers its unrolls
    1, 2, ... under a random sender id and its one sending thread keeps them in order, so
    a number at or below the sender's highest one so far is a repeat: part of an enqueue
    that timed out after a partial accept and was sent again whole."""

    def __init__(self):
        self.highest = {}
        self.dropped = 0

    def keep(self, senders, sequences):
        """A boolean mask over the unrolls of one dequeue, in queue order."""
        mask = np.ones(len(senders), bool)
        for i, (sender, seq) in enumerate(zip(senders.tolist(), sequences.tolist())):
            if seq <= 0:
                continue  # unnumbered
            if seq <= self.highest.get(sender, 0):
                mask[i] = False
            else:
                self.highest[sender] = seq
        self.dropped += int(len(mask) - mask.sum())
        return mask


class _Graph:
    """The transport graph: identical on learner and actors."""

    def __init__(self, spec: UnrollSpec, capacity: int, batch_size: int):
        self.graph = tf.Graph()
        with self.graph.as_default():
            dtypes = [tf.as_dtype(f.dtype) for f in spec.fields]
            shapes = [list(f.shape) for f in spec.fields]
            self.queue = tf.queue.FIFOQueue(capacity, dtypes, shapes, names=spec.names,
                                            shared_name="unrolls", name="unrolls")
            self.placeholders = {f.name: v1.placeholder(tf.as_dtype(f.dtype), [None] + list(f.shape),
                                                        name="in_" + f.name)
                                 for f in spec.fields}
            self.enqueue = self.queue.enqueue_many(self.placeholders)
            self.size = self.queue.size()
            self.dequeue_n = v1.placeholder_with_default(tf.constant(batch_size), [], name="dequeue_n")
            self._staged_take(spec)
            self.close = self.queue.close(cancel_pending_enqueues=True)
            # The version rides at the end of the weights (PACKED_VERSION float32 words holding
            # its int64 bits), so one read of one variable gives weights and version together;
            # the separate version variable is the cheap "anything new?" probe.
            self.weights = v1.Variable(tf.zeros([spec.weights_size + PACKED_VERSION]), name="weights",
                                       use_resource=True, trainable=False)
            self.version = v1.Variable(tf.constant(-1, tf.int64), name="weights_version",
                                       use_resource=True, trainable=False)
            self.weights_in = v1.placeholder(tf.float32, [spec.weights_size + PACKED_VERSION])
            self.version_in = v1.placeholder(tf.int64, [])
            with tf.control_dependencies([self.weights.assign(self.weights_in)]):
                self.publish = self.version.assign(self.version_in)
            self.read_version = self.version.read_value()
            self.read_weights = self.weights.read_value()
            self.init = v1.initializers.variables(
                [self.weights, self.version, self.staged_token] + list(self.staged.values()))

    def _staged_take(self, spec):
        """`take`: dequeue_n unrolls, moved into server-side variables under a token in the
        same step, then read from them. A retry with the same token (its first answer lost,
        gRPC's resend refused) reads the unrolls already taken instead of taking new ones,
        so no batch is lost between the queue and the learner."""
        self.token_in = v1.placeholder(tf.int64, [], name="take_token")
        self.staged_token = v1.Variable(tf.constant(-1, tf.int64), name="staged_token",
                                        use_resource=True, trainable=False)
        self.staged = {f.name: v1.Variable(tf.zeros((0,) + f.shape, tf.as_dtype(f.dtype)),
                                           shape=tf.TensorShape([None] + list(f.shape)),
                                           name="staged_" + f.name, use_resource=True, trainable=False)
                       for f in spec.fields}

        def take_new():
            unrolls = self.queue.dequeue_many(self.dequeue_n)
            with tf.control_dependencies([self.staged[k].assign(unrolls[k]) for k in spec.names]):
                return self.staged_token.assign(self.token_in, read_value=True)

        done = tf.cond(tf.not_equal(self.staged_token.read_value(), self.token_in), take_new,
                       self.staged_token.read_value)
        with tf.control_dependencies([done]):
            self.take = {k: self.staged[k].read_value() for k in spec.names}


def run_retrying(sess, fetches, feed=None, options=None, tries=5):
    """sess.run that retries AbortedError: under heavy load gRPC may resend a request,
    and TF's worker then rejects the copy ("The same RunGraph request was received
    twice"), though the first copy may have run. Only for runs that are safe to repeat."""
    for attempt in range(tries):
        try:
            return sess.run(fetches, feed, options=options)
        except tf.errors.AbortedError as e:
            if attempt == tries - 1:
                raise
            print("[transport] WARNING: retrying after a transient gRPC error: %s"
                  % (e.message or "").splitlines()[0][:160], flush=True)
            time.sleep(0.05 * (attempt + 1))


class LearnerTransport:
    """The learner's end: hosts the server, owns the queue and the weights."""

    def __init__(self, address: str, spec: UnrollSpec, capacity: int, batch_size: int):
        port = int(address.rsplit(":", 1)[1])
        cluster = tf.train.ClusterSpec({"learner": [address]})
        config = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
        self.server = tf.distribute.Server(cluster, job_name="learner", task_index=0,
                                           config=config, start=True)
        self.address = address
        self.port = port
        self.spec = spec
        self.batch_size = batch_size
        self._g = _Graph(spec, capacity, batch_size)
        self.sess = v1.Session(self.server.target, graph=self._g.graph, config=config)
        self.sess.run(self._g.init)
        self.capacity = capacity
        self._packed = np.empty(spec.weights_size + PACKED_VERSION, np.float32)
        self.repeats = RepeatFilter()
        self._held = None  # unique unrolls of a batch still short of its size after dropping repeats
        self._token = 0

    def _run(self, fetches, feed=None):
        """Size reads and weight publishing are idempotent, and a dequeue's retry reads
        what its first run took (_Graph.take), so all of the learner's runs may retry."""
        return run_retrying(self.sess, fetches, feed)

    def publish(self, flat_weights: np.ndarray, version: int):
        packed = pack_weights(flat_weights, version, self._packed)
        self._run(self._g.publish, {self._g.weights_in: packed, self._g.version_in: version})

    def size(self) -> int:
        return int(self._run(self._g.size))

    def try_dequeue(self, n=None):
        """A batch dict of [n, ...] arrays (n defaults to the batch size B), or None if
        fewer than n unrolls wait.

        The learner is the queue's only consumer, so a size check followed by
        dequeue_many never blocks; that keeps the learner responsive to signals
        and lets it notice when no actor is sending."""
        n = self.batch_size if n is None else int(n)
        while True:
            held = 0 if self._held is None else len(self._held["sequence"])
            if self.size() < n - held:
                return None
            self._token += 1
            got = self._run(self._g.take, {self._g.dequeue_n: n - held, self._g.token_in: self._token})
            got = self._without_repeats(got)
            if self._held is not None:
                got = {k: np.concatenate([self._held[k], v]) for k, v in got.items()}
            if len(got["sequence"]) == n:
                self._held = None
                return got
            self._held = got  # repeats were dropped: top up from the queue

    def _without_repeats(self, got):
        mask = self.repeats.keep(got["sender"], got["sequence"])
        if mask.all():
            return got
        print("[transport] WARNING: dropped %d repeated unroll(s) (an enqueue that timed out after the "
              "queue took part of it was sent again); %d in all" % (len(mask) - mask.sum(), self.repeats.dropped),
              flush=True)
        return {k: v[mask] for k, v in got.items()}

    def close(self):
        """Closes the queue: blocked and later enqueues fail, so actors stop."""
        try:
            self.sess.run(self._g.close)
        except tf.errors.OpError:
            pass


NOT_PUBLISHED = "learner has not published weights yet"


class ActorClient:
    """The actor's end: a gRPC client session to the learner's server."""

    def __init__(self, learner_address: str, spec: UnrollSpec, capacity: int, batch_size: int):
        self.target = "grpc://" + learner_address
        self.spec = spec
        self._g = _Graph(spec, capacity, batch_size)
        self.sess = None
        self.version = -1
        self.last_error = None  # why the last connection attempt failed, for messages

    def connect(self, timeout_s: float, should_stop=lambda: False, log=print):
        """Opens a TF session and waits until the learner has published weights.

        Retries with backoff (0.2 s, growing 1.5x to at most 2 s: a learner that comes up
        is found within 2 s, and a retry is one small gRPC call) until `timeout_s` have
        passed; returns False if it gave up or was stopped."""
        deadline = time.time() + timeout_s
        delay = 0.2
        last_error = self.last_error = None
        while not should_stop():
            try:
                if self.sess is None:
                    config = v1.ConfigProto(intra_op_parallelism_threads=1,
                                            inter_op_parallelism_threads=1)
                    self.sess = v1.Session(self.target, graph=self._g.graph, config=config)
                opts = v1.RunOptions(timeout_in_ms=5000)
                if self.sess.run(self._g.read_version, options=opts) >= 0:
                    return True
                last_error = self.last_error = NOT_PUBLISHED
            except tf.errors.OpError as e:
                last_error = e.message.splitlines()[0] if e.message else type(e).__name__
                self.last_error = last_error  # for the actor's "cannot reach" messages
                if "Shared queue" in (e.message or "") or isinstance(e, tf.errors.InvalidArgumentError):
                    raise RuntimeError(
                        "the learner at %s serves a different unroll layout (check that "
                        "--level_name, --agent_name and --unroll_length match the learner's): %s"
                        % (self.target, last_error)) from None
                self.reset()
            if time.time() > deadline:
                log("giving up on learner %s after %.0f s: %s" % (self.target, timeout_s, last_error))
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        return False

    def reset(self):
        """Drops the session. Closing a TF session whose server is gone can block in
        gRPC for a long time, so the close runs in a daemon thread given 1 s."""
        sess, self.sess = self.sess, None
        if sess is not None:
            def close():
                try:
                    sess.close()
                except Exception:  # the server may be gone; nothing to release then
                    pass
            t = threading.Thread(target=close, daemon=True)
            t.start()
            t.join(1.0)

    def fetch_weights_if_new(self):
        """Returns (version, flat weights) if the learner published newer ones, else None."""
        # Both reads are idempotent, so a resent request refused as a repeat is retried
        # rather than counted as a lost learner.
        if self.published_version() == self.version:
            return None
        opts = v1.RunOptions(timeout_in_ms=10000)
        self.version, weights = unpack_weights(run_retrying(self.sess, self._g.read_weights, options=opts))
        return self.version, weights

    def published_version(self) -> int:
        """The version of the learner's newest published weights (a small read)."""
        return int(run_retrying(self.sess, self._g.read_version, options=v1.RunOptions(timeout_in_ms=10000)))

    def alive(self, timeout_ms: int = 3000) -> bool:
        """Whether the learner answers a small read: a full queue times out enqueues,
        but a live learner still answers; a dead one does not."""
        sess = self.sess
        if sess is None:  # reset() by another thread: not connected
            return False
        try:
            sess.run(self._g.read_version, options=v1.RunOptions(timeout_in_ms=timeout_ms))
            return True
        except tf.errors.OpError:
            return False

    def enqueue(self, batch: dict, timeout_ms: int = 5000):
        """Enqueues E unrolls ([E, ...] arrays). Raises DeadlineExceededError when the
        queue stayed full for `timeout_ms` (the caller retries), CancelledError or
        OutOfRangeError when the learner closed the queue."""
        feed = {self._g.placeholders[name]: batch[name] for name in self.spec.names}
        self.sess.run(self._g.enqueue, feed, options=v1.RunOptions(timeout_in_ms=timeout_ms))
