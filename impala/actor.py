"""IMPALA actor: runs `envs_per_actor` environments, batches their observations
through the policy, and every `unroll_length` steps enqueues one unroll per
environment on its learner's queue (transport.py), then refreshes its weights.

Time is accounted in three buckets and sent with each unroll, so the learner
can say where time goes: env stepping, policy inference, transfer (enqueue,
including time blocked on a full queue, and weight reads).
"""
import os
import queue
import signal
import socket
import threading
import time

import numpy as np
import tensorflow as tf

from impala import devices
from envs import batch as env_batch
import envs
import nets
from impala import transport


def screen(flags):
    """The Atari frame size of --width/--height, as envs takes it."""
    return (flags.width, flags.height)


def sends_frames(flags):
    """Whether unrolls carry only each step's newest frame (--obs_transfer): by default where
    the actors step Atari through ale-py's vector env, whose frame stacks the learner can
    rebuild exactly (transport.stack_frames). Raises ValueError naming the flag otherwise."""
    if flags.obs_transfer == "stacks":
        return False
    native = env_batch.resolve_backend(flags.env_backend, flags.level_name) == "native"
    if flags.obs_transfer == "frames" and not native:
        raise ValueError("--obs_transfer=frames needs the native Atari backend (its stacks start as black "
                         "frames, which the learner rebuilds); --level_name=%s --env_backend=%s steps the "
                         "Python backend: use --obs_transfer=stacks or auto" % (flags.level_name, flags.env_backend))
    return native


def build_agent(level_name, agent_name, unroll_length, screen_size=envs.SCREEN_SIZE, compute_dtype="float32",
                newest_frames=False, normalize_observations=False, normalize_returns=False):
    """The agent with its (float32) variables built, its torso then computing in
    `compute_dtype` (--compute_dtype), its observations and value targets standardised by
    running statistics with `normalize_observations` and `normalize_returns`, plus the
    unroll layout both sides share (newest_frames: see transport.make_unroll_spec; the
    weights' size counts the published statistics)."""
    spec = envs.env_spec(level_name, screen_size)
    if not spec.discrete:
        raise ValueError("--level_name=%s has a continuous action space; the IMPALA agents "
                         "need discrete actions (use ppo_main.py for continuous control)" % level_name)
    agent = nets.make_agent(agent_name, spec.num_actions, spec.obs_shape)
    if normalize_observations:
        agent.obs_normalizer = nets.RunningNormalizer(spec.obs_shape, "obs_normalizer")
    if normalize_returns:
        agent.return_normalizer = nets.RunningNormalizer((), "return_normalizer")
    obs = tf.zeros((1,) + tuple(spec.obs_shape), tf.as_dtype(spec.obs_dtype))
    state = agent.initial_state(1)
    agent(obs, tf.ones([1], tf.bool), state)  # creates the variables
    agent.compute_dtype = tf.as_dtype(compute_dtype)
    core_shapes = [tuple(s.shape[1:]) for s in tf.nest.flatten(state)]
    variables = nets.published_variables(agent)
    size = sum(int(np.prod(v.shape)) for v in variables)
    unroll_spec = transport.make_unroll_spec(spec.obs_shape, spec.obs_dtype, spec.num_actions,
                                             unroll_length, core_shapes, size, newest_frames)
    return agent, unroll_spec, spec


def make_weight_setter(variables):
    """tf.function that splits a flat float32 vector into the variables."""
    shapes = [v.shape for v in variables]
    sizes = [int(np.prod(s)) for s in shapes]

    @tf.function
    def set_weights(flat):
        parts = tf.split(flat, sizes)
        for v, p, s in zip(variables, parts, shapes):
            v.assign(tf.reshape(p, s))
    return set_weights


def flatten_weights(variables):
    return tf.concat([tf.reshape(v, [-1]) for v in variables], axis=0)


class Stopper:
    """SIGINT/SIGTERM set a flag; the loops check it between steps."""

    def __init__(self):
        self.stop = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.stop = True

    def __call__(self):
        return self.stop


ENQUEUE_BACKSTOP_MS = 120_000


class Sender:
    """Enqueues unrolls from a background thread so the envs keep stepping
    while the previous unroll travels. Holds at most one unroll in hand: when
    the learner's queue is full, `send` blocks, which keeps the backpressure.

    An enqueue waits as long as the learner's queue stays full: a timeout would
    cancel it half-way (TF queues keep the unrolls already inserted, so a retry
    duplicates them) and, with several actors, a retry goes to the back of the
    line -- measured: one of two Pong actors starved for minutes with a 2 s
    timeout. Whether the learner is still there is asked separately, by a small
    read from the waiting main thread (`check_learner`)."""

    PROBE_AFTER_S = 10.0  # an enqueue blocked this long makes the main thread ask
    PROBE_EVERY_S = 5.0
    PROBE_FAILURES = 2  # consecutive unanswered probes that mean "lost"

    def __init__(self, client, stopper):
        self.client, self.stopper = client, stopper
        self.inbox = queue.Queue(maxsize=1)
        self.outcome = None  # set to 'closed' / 'lost' by the thread or by check_learner
        self.sent = 0
        self.error = None  # an unexpected exception of the enqueue, if any
        self.busy_since = None  # when the enqueue in progress started
        self._next_probe, self._failures = 0.0, 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            item = self.inbox.get()
            if item is None:
                return
            self.busy_since = time.time()
            try:
                outcome = _enqueue(self.client, item, self.stopper)
            except Exception as e:  # never die silently: a dead sender would stall the actor
                outcome, self.error = "lost", e
            self.busy_since = None
            if outcome == "sent":
                self.sent += 1
            elif outcome != "stopped" and self.outcome is None:
                self.outcome = outcome
            self.inbox.task_done()

    def check_learner(self):
        """Called while waiting on the sender: marks the learner lost when an enqueue
        has been blocked for a while and the learner stops answering small reads."""
        since, now = self.busy_since, time.time()
        if since is None or now - since < self.PROBE_AFTER_S or now < self._next_probe:
            return
        self._next_probe = now + self.PROBE_EVERY_S
        self._failures = 0 if self.client.alive() else self._failures + 1
        if self._failures >= self.PROBE_FAILURES and self.outcome is None:
            self.outcome = "lost"

    def send(self, buf):
        """Returns the time spent waiting for the previous unroll to go."""
        t0 = time.perf_counter()
        while not self.stopper() and self.outcome is None:
            try:
                self.inbox.put({k: v.copy() for k, v in buf.items()}, timeout=0.5)
                break
            except queue.Full:
                self.check_learner()
        return time.perf_counter() - t0

    def drain(self, timeout_s=10.0):
        """Waits (at most timeout_s) until the unroll in hand is sent or failed."""
        deadline = time.time() + timeout_s
        while (self.inbox.unfinished_tasks and not self.stopper() and self.outcome is None
               and time.time() < deadline):
            time.sleep(0.01)

    def close(self):
        try:
            self.inbox.put_nowait(None)
        except queue.Full:
            pass


def _connect(client, timeout_s, stopper, log):
    """client.connect in a helper thread: creating a gRPC session to an unreachable
    host can block inside TF's C++ code, where Python signal handlers do not run.
    The main thread waits here instead, so Ctrl-C/SIGTERM always end the actor, and
    says at intervals (10 s, 30 s, 90 s, then every minute) that the learner cannot be
    reached, so a firewall is not mistaken for a slow start."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(ok=client.connect(timeout_s, stopper, log)),
                              daemon=True)
    thread.start()
    t0 = time.time()
    report_at = CONNECT_REPORT_FIRST_S
    # Session creation to a dead host can block past connect()'s own deadline: bound it here.
    deadline = t0 + timeout_s + 10.0
    while thread.is_alive():
        thread.join(0.2)
        if stopper() and thread.is_alive():
            thread.join(2.0)
            if thread.is_alive():
                log("actor: stopped while still connecting to %s; exiting" % client.target)
                os._exit(0)
        waited = time.time() - t0
        if thread.is_alive() and waited >= report_at:
            log(_unreachable_message(client, waited))
            report_at = min(report_at * 3, report_at + 60.0)
        if time.time() > deadline and thread.is_alive():
            log("giving up on learner %s after %.0f s (the connection attempt hangs)"
                % (client.target, timeout_s))
            return False
    if result.get("ok", False):
        log("actor: connected to learner %s after %.1f s" % (_address(client), time.time() - t0))
        return True
    return False


CONNECT_REPORT_FIRST_S = 10.0


def _address(client):
    return client.target.replace("grpc://", "")


def _unreachable_message(client, waited):
    why = getattr(client, "last_error", None) or "no answer"
    if why == transport.NOT_PUBLISHED:
        return ("actor: learner %s answers but has published no weights for %.0f s (still starting?)"
                % (_address(client), waited))
    return ("actor: cannot reach learner %s for %.0f s: is the port open from this host (%s)? (%s)"
            % (_address(client), waited, socket.gethostname(), why))


def _reconnect(client, flags, stopper, log, why):
    """Drops the session and connects again; False when the learner stays away."""
    log(why)
    client.reset()
    return _connect(client, flags.actor_reconnect_timeout_s, stopper, log)


class EnvGroup:
    """A batch of envs (env_batch.py) with its policy state and its rows of the unroll.
    With --env_groups=2 one group steps in ale-py's C++ threads while the other is in
    inference (Sample Factory's double-buffered sampling)."""

    def __init__(self, batch, rows, obs_shape, obs_dtype, state):
        self.batch, self.rows, self.state = batch, rows, state
        n = rows.stop - rows.start
        self.obs = np.zeros((n,) + tuple(obs_shape), obs_dtype)
        self.first = np.ones([n], bool)
        batch.reset(self.obs)


def make_groups(flags, task, agent, env_spec):
    """--env_groups groups of envs splitting the actor's --envs_per_actor; env i of the actor
    is seeded with seed * 100003 + task * E + i whatever the backend and grouping."""
    E, G = flags.envs_per_actor, flags.env_groups
    backend = env_batch.resolve_backend(flags.env_backend, flags.level_name)
    if G == 0:  # auto: overlap only where a group can step while another infers
        G = 2 if backend == "native" and E % 2 == 0 else 1
    if G < 1 or E % G:
        raise ValueError("--env_groups=%d must be 0 (auto) or divide --envs_per_actor=%d" % (G, E))
    n, groups = E // G, []
    for g in range(G):
        batch = env_batch.make_batch(backend, flags.level_name, n, flags.seed * 100003 + task * E + g * n,
                                     training=True, screen_size=screen(flags), threads=flags.env_threads)
        groups.append(EnvGroup(batch, slice(g * n, (g + 1) * n), env_spec.obs_shape, env_spec.obs_dtype,
                               agent.initial_state(n)))
    return groups


def fill_unroll(groups, buf, step, T, timing):
    """Steps every group T times, writing the unroll into buf (fields [E, T(+1), ...]).

    Each group is sent its actions as soon as its inference is done and received only
    after the other groups' inference: with the native backend a group steps while the
    others infer. timing[0] += time waiting for / stepping envs, timing[1] += inference."""
    def infer(g, t):
        t0 = time.perf_counter()
        out, g.state = step(tf.constant(g.obs), tf.constant(g.first), g.state)
        actions = out.action.numpy()
        buf["behaviour_logits"][g.rows, t] = out.policy_logits.numpy()
        buf["action"][g.rows, t] = actions
        t1 = time.perf_counter()
        g.batch.send(actions)
        timing[1] += t1 - t0
        timing[0] += time.perf_counter() - t1

    for g in groups:
        transport.put_observation(buf, g.rows, 0, g.obs)
        buf["first"][g.rows, 0] = g.first
        for i, s in enumerate(tf.nest.flatten(g.state)):
            buf["core_state_%d" % i][g.rows] = s.numpy()
        infer(g, 0)
    buf["episode_end"][:] = False
    buf["timeout_value"][:] = 0.0
    for t in range(T):
        for g in groups:
            t0 = time.perf_counter()
            r = g.batch.recv(g.obs)
            rows = g.rows
            buf["reward"][rows, t], buf["done"][rows, t] = r.reward, r.done
            buf["episode_end"][rows, t] = r.episode_end
            buf["episode_return"][rows, t] = r.episode_return
            buf["episode_length"][rows, t] = r.episode_length
            transport.put_observation(buf, rows, t + 1, g.obs, r.episode_end)  # a new game: a new stack
            buf["first"][rows, t + 1] = g.first = r.done
            timing[0] += time.perf_counter() - t0
            if r.final_obs is not None:  # time limits: their value, for the learner to bootstrap from
                t0 = time.perf_counter()
                out, _ = step(tf.constant(r.final_obs), tf.constant(np.zeros_like(r.done)), g.state)
                buf["timeout_value"][rows, t] = np.where(r.cut, out.baseline.numpy(), 0.0)
                timing[1] += time.perf_counter() - t0
            if t + 1 < T:
                infer(g, t + 1)


def run(flags, task, log=print):
    learner_hosts = flags.learner_hosts
    learner = learner_hosts[task % len(learner_hosts)]
    T, E = flags.unroll_length, flags.envs_per_actor
    devices.set_threads(flags.actor_threads)  # before TensorFlow runs its first op
    stopper = Stopper()
    tf.random.set_seed(flags.seed * 7919 + task)
    agent, spec, env_spec = build_agent(flags.level_name, flags.agent_name, T, screen(flags), flags.compute_dtype,
                                        sends_frames(flags), flags.normalize_observations, flags.normalize_returns)
    set_weights = make_weight_setter(nets.published_variables(agent))
    refresh_casts = nets.freeze_casts(agent)  # bfloat16 copies of the torso's weights, cast once per update
    groups = make_groups(flags, task, agent, env_spec)
    n = E // len(groups)
    # Traced now, while the learner starts up, not when the first unroll should begin; without
    # autograph (a faster trace; no tensor branches). The concrete function is called directly:
    # 0.1-0.2 ms less per call than the tf.function's dispatch (1.1-1.3 ms for 16 frames at 84x84).
    step = tf.function(lambda o, f, s: agent(o, f, s), autograph=False).get_concrete_function(
        tf.TensorSpec((n,) + tuple(env_spec.obs_shape), env_spec.obs_dtype), tf.TensorSpec([n], tf.bool),
        tf.nest.map_structure(tf.TensorSpec.from_tensor, agent.initial_state(n)))
    client = transport.ActorClient(learner, spec, flags.queue_capacity, flags.batch_size)
    log("actor %d: %d x %s (%s envs in %d group(s)), agent %s, learner %s"
        % (task, E, flags.level_name, env_batch.resolve_backend(flags.env_backend, flags.level_name),
           len(groups), flags.agent_name, learner))
    if not _connect(client, flags.actor_reconnect_timeout_s, stopper, log):
        _close(groups)
        return 0 if stopper() else 3

    buf = {f.name: np.zeros((E,) + f.shape, f.dtype) for f in spec.fields}
    buf["actor_id"][:] = task
    timing = np.zeros(3, np.float64)  # env, inference, transfer
    sender = Sender(client, stopper)
    sent_before = 0  # unrolls sent by the senders of earlier connections
    gave_up = False
    while not stopper():
        t0 = time.perf_counter()
        try:
            new = client.fetch_weights_if_new()
            if new is not None:
                set_weights(tf.constant(new[1]))
                refresh_casts()
        except tf.errors.OpError as e:  # any failed read: the session is suspect, start a new one
            if not _reconnect(client, flags, stopper, log, "actor %d: reading weights from %s failed (%s), "
                              "reconnecting" % (task, learner, type(e).__name__)):
                gave_up = not stopper()
                break
            continue
        timing[2] += time.perf_counter() - t0

        buf["policy_version"][:] = client.version
        fill_unroll(groups, buf, step, T, timing)
        buf["actor_timing"][:] = (timing / E).astype(np.float32)
        timing[:] = 0
        timing[2] += sender.send(buf)
        if sender.outcome == "closed":
            log("actor %d: learner closed its queue (run finished); exiting" % task)
            break
        if sender.outcome == "lost":
            sender.close()
            why = " (%s: %s)" % (type(sender.error).__name__, sender.error) if sender.error else ""
            if not _reconnect(client, flags, stopper, log,
                              "actor %d: lost learner %s%s, reconnecting" % (task, learner, why)):
                gave_up = not stopper()
                break
            sent_before += sender.sent
            sender = Sender(client, stopper)
    sender.drain()
    sender.close()
    _close(groups)
    client.reset()
    log("actor %d: stopped after %d unrolls%s" % (task, sent_before + sender.sent, "; gave up on the learner" if gave_up else ""))
    return 3 if gave_up else 0


def play_episodes(policy, agent, env, n, should_stop=lambda: False, on_episode=None, seed=None):
    """Plays n whole episodes (as info["episode"] reports them) with one env.
    policy(obs[1, ...], first[1], state) -> (action[1], state). Returns (returns, lengths)."""
    returns, lengths = [], []
    obs, _ = env.reset(seed=seed)
    first, state = True, agent.initial_state(1)
    while len(returns) < n and not should_stop():
        action, state = policy(tf.constant(obs[None]), tf.constant([first]), state)
        obs, _, terminated, truncated, info = env.step(int(action.numpy()[0]))
        first = terminated or truncated
        if first:
            obs, _ = env.reset()
        if "episode" in info:
            returns.append(float(np.asarray(info["episode"]["r"])))
            lengths.append(int(np.asarray(info["episode"]["l"])))
            if on_episode is not None:
                on_episode(returns, lengths)
    return returns, lengths


def run_evaluator(flags, logdir, log=print):
    """The test worker: every --test_every_s it loads the newest published weights
    of learner 0 and plays --test_num_episodes episodes greedily (argmax of the
    policy, no exploration noise), recording evaluation returns apart from the
    training returns: <logdir>/eval.csv and TensorBoard scalars eval/*."""
    stopper = Stopper()
    agent, spec, _ = build_agent(flags.level_name, flags.agent_name, flags.unroll_length, screen(flags),
                                 flags.compute_dtype, sends_frames(flags),  # the queue's spec, as actors send
                                 flags.normalize_observations, flags.normalize_returns)
    set_weights = make_weight_setter(nets.published_variables(agent))

    @tf.function
    def greedy(o, f, s):
        out, s = agent(o, f, s)
        return tf.argmax(out.policy_logits, axis=-1, output_type=tf.int32), s

    env = envs.make_env(flags.level_name, seed=flags.seed + 777, training=False, screen_size=screen(flags))
    client = transport.ActorClient(flags.learner_hosts[0], spec, flags.queue_capacity, flags.batch_size)
    log("evaluator: %s, %d episodes every %.0f s, learner %s"
        % (flags.level_name, flags.test_num_episodes, flags.test_every_s, flags.learner_hosts[0]))
    if not _connect(client, flags.actor_reconnect_timeout_s, stopper, log):
        env.close()
        return 0 if stopper() else 3
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, "eval.csv")
    new_file = not os.path.exists(path)
    out_csv = open(path, "a", buffering=1)
    if new_file:
        out_csv.write("time,policy_version,episodes,mean_return,std_return,mean_length\n")
    writer = tf.summary.create_file_writer(os.path.join(logdir, "eval"))
    rounds = 0
    while not stopper():
        try:
            new = client.fetch_weights_if_new()
        except (tf.errors.OpError,):
            log("evaluator: learner gone; exiting")
            break
        if new is not None:
            set_weights(tf.constant(new[1]))
        returns, lengths = play_episodes(greedy, agent, env, flags.test_num_episodes, stopper)
        if len(returns) == flags.test_num_episodes:
            rounds += 1
            out_csv.write("%.1f,%d,%d,%.3f,%.3f,%.1f\n" % (time.time(), client.version, len(returns),
                          np.mean(returns), np.std(returns), np.mean(lengths)))
            with writer.as_default(step=client.version):
                tf.summary.scalar("eval/mean_return", float(np.mean(returns)))
                tf.summary.scalar("eval/mean_length", float(np.mean(lengths)))
            log("evaluator: policy version %d: greedy return %.2f +- %.2f over %d episodes"
                % (client.version, np.mean(returns), np.std(returns), len(returns)))
        t_next = time.time() + flags.test_every_s
        while time.time() < t_next and not stopper():
            time.sleep(0.2)
    out_csv.close()
    writer.close()
    env.close()
    client.reset()
    log("evaluator: stopped after %d evaluation rounds" % rounds)
    return 0


def _enqueue(client, buf, stopper):
    """'sent', 'closed' (learner finished), 'lost' (learner unreachable) or 'stopped'.
    The long timeout is only a backstop (Sender.check_learner notices a silent learner
    sooner); it is never hit while the learner drains its queue."""
    while not stopper():
        try:
            client.enqueue(buf, timeout_ms=ENQUEUE_BACKSTOP_MS)
            return "sent"
        except tf.errors.DeadlineExceededError:
            if not client.alive():  # a dead learner also times out: it answers nothing
                return "lost"
            continue  # queue full for a long time: the learner is the bottleneck; keep waiting
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            return "closed"
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.FailedPreconditionError,
                tf.errors.NotFoundError, tf.errors.InternalError, tf.errors.UnknownError):
            return "lost"
    return "stopped"


def _close(groups):
    for g in groups:
        g.batch.close()
