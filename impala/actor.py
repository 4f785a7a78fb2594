"""IMPALA actor: runs `envs_per_actor` environments, batches their observations
through the policy, and every `unroll_length` steps enqueues one unroll per
environment on its learner's queue (transport.py, through sender.py), then
refreshes its weights.

Time is accounted in three phases and sent with each unroll, so the learner
can say where time goes: env stepping, policy inference, transfer (enqueue,
including time blocked on a full queue, and weight reads).
"""
import time

import numpy as np
import tensorflow as tf

from envs import batch as env_batch
import nets
from impala import agent as agent_lib
from impala import devices
from impala import precision
from impala import sender as sender_lib
from impala import telemetry
from impala import transport
from impala.stopping import StopSignal
from impala.timings import Timings

PHASES = ("env", "inference", "transfer")  # the order of an unroll's actor_timing
WAIT_FOR_WEIGHTS_S = 30.0  # --actor_wait_for_weights: the longest wait for the learner's next weights
ENV_CRASH_LOOP_EXIT = 6  # envs.batch.MAX_CRASHES_IN_A_ROW env crashes with no successful step between


class EnvGroup:
    """A batch of envs (envs/batch.py) with its policy state and its rows of the unroll.
    With --env_groups=2 one group steps in ale-py's C++ threads while the other is in
    inference (Sample Factory's double-buffered sampling)."""

    def __init__(self, batch, rows, obs_shape, obs_dtype, state):
        self.batch, self.rows, self.state = batch, rows, state
        n = rows.stop - rows.start
        self.obs = np.zeros((n,) + tuple(obs_shape), obs_dtype)
        self.first = np.ones([n], bool)
        self.discounted_return = np.zeros([n])  # each env's, across unrolls (--normalize_rewards)
        batch.reset(self.obs)


def make_groups(flags, seed_index, agent, env_spec, log=None):
    """--env_groups groups of envs splitting the actor's --envs_per_actor; env i of the actor
    is seeded with seed * 100003 + seed_index * E + i whatever the backend and grouping
    (seed_index: placement.actor_seed_index, the actor's --task in the SPMD form)."""
    E, G = flags.envs_per_actor, flags.env_groups
    backend = env_batch.resolve_backend(flags.env_backend, flags.level_name)
    if G == 0:  # auto: overlap only where a group can step while another infers
        G = 2 if backend == "native" and E % 2 == 0 else 1
    if G < 1 or E % G:
        raise ValueError("--env_groups=%d must be 0 (auto) or divide --envs_per_actor=%d" % (G, E))
    n, groups = E // G, []
    for g in range(G):
        batch = env_batch.make_batch(backend, flags.level_name, n, flags.seed * 100003 + seed_index * E + g * n,
                                     training=True, frame_size=agent_lib.frame_size_of(flags),
                                     threads=flags.env_threads, log=log)
        groups.append(EnvGroup(batch, slice(g * n, (g + 1) * n), env_spec.obs_shape, env_spec.obs_dtype,
                               agent.initial_state(n)))
    return groups


def fill_unroll(groups, buf, step, T, timings, discounting=None):
    """Steps every group T times, writing the unroll into buf (fields [E, T(+1), ...]).
    Where the unroll has a "discounted_return" field, each env's return discounted by
    `discounting` (--discounting) runs on across unrolls and starts again where `done` or a new
    episode ends it.

    Each group is sent its actions as soon as its inference is done and received only
    after the other groups' inference: with the native backend a group steps while the
    others infer. `timings` (a Timings of PHASES) gains the time waiting for / stepping envs
    ("env") and in inference."""
    def infer(g, t):
        t0 = time.perf_counter()
        out, g.state = step(tf.constant(g.obs), tf.constant(g.first), g.state)
        actions = out.action.numpy()
        buf["behaviour_logits"][g.rows, t] = out.policy_logits.numpy()
        buf["action"][g.rows, t] = actions
        t1 = time.perf_counter()
        g.batch.send(actions)
        timings.add("inference", t1 - t0)
        timings.add("env", time.perf_counter() - t1)

    for g in groups:
        transport.put_observation(buf, g.rows, 0, g.obs)
        buf["first"][g.rows, 0] = g.first
        for i, s in enumerate(tf.nest.flatten(g.state)):
            buf["core_state_%d" % i][g.rows] = s.numpy()
        infer(g, 0)
    buf["episode_end"][:] = False
    buf["timeout_value"][:] = 0.0
    if "cut_step" in buf:  # the last cut of each row: its step and last observation
        buf["cut_step"][:] = -1
    buf["env_crashes"][:] = 0
    for t in range(T):
        for g in groups:
            t0 = time.perf_counter()
            r = g.batch.recv(g.obs)
            rows = g.rows
            record_step(g, buf, t, r, discounting)
            transport.put_observation(buf, rows, t + 1, g.obs, r.episode_end)  # a new game: a new stack
            buf["first"][rows, t + 1] = g.first = r.new_episode  # not at a lost life: envs/batch.py
            timings.add("env", time.perf_counter() - t0)
            if r.final_obs is not None:  # time limits: their value, for the learner to bootstrap from
                # (the actor's value; a fallback where the learner recomputes it, see cut_step)
                t0 = time.perf_counter()
                out, _ = step(tf.constant(r.final_obs), tf.constant(np.zeros_like(r.done)), g.state)
                buf["timeout_value"][rows, t] = np.where(r.cut, out.baseline.numpy(), 0.0)
                if "cut_step" in buf:  # the learner bootstraps from its own value of the row's last cut
                    cut = np.flatnonzero(r.cut)
                    buf["cut_step"][rows.start + cut] = t
                    transport.put_cut_observation(buf, rows.start + cut, r.final_obs[cut])
                timings.add("inference", time.perf_counter() - t0)
            if t + 1 < T:
                infer(g, t + 1)


def record_step(g, buf, t, r, discounting):
    """Writes step t's env result `r` (envs.batch.StepResult) into group g's rows of the unroll."""
    rows = g.rows
    buf["reward"][rows, t], buf["done"][rows, t] = r.reward, r.done
    buf["episode_end"][rows, t] = r.episode_end
    buf["episode_return"][rows, t] = r.episode_return
    buf["episode_length"][rows, t] = r.episode_length
    if "discounted_return" in buf:
        g.discounted_return = discounting * g.discounted_return + r.reward
        buf["discounted_return"][rows, t] = g.discounted_return
        g.discounted_return[r.done | r.new_episode] = 0.0
    buf["env_crashes"][rows] += r.crashes


def make_step(agent, n, env_spec):
    """The policy step for a group of n envs, traced now (while the learner starts up, not when
    the first unroll should begin) and without autograph (a faster trace; no tensor branches).
    The concrete function is called directly: it skips the tf.function's per-call dispatch."""
    return tf.function(lambda o, f, s: agent(o, f, s), autograph=False).get_concrete_function(
        tf.TensorSpec((n,) + tuple(env_spec.obs_shape), env_spec.obs_dtype), tf.TensorSpec([n], tf.bool),
        tf.nest.map_structure(tf.TensorSpec.from_tensor, agent.initial_state(n)))


class Actor:
    """One actor process: its agent, envs, link to the learner and the unroll being filled."""

    def __init__(self, flags, task, learner, seed_index, log):
        self.flags, self.task, self.log, self.learner = flags, task, log, learner
        tf.random.set_seed(flags.seed * 7919 + seed_index)
        self.agent, self.spec, env_spec = agent_lib.build_from_flags(flags)
        self.set_weights = agent_lib.make_weight_setter(nets.published_variables(self.agent))
        self.groups = make_groups(flags, seed_index, self.agent, env_spec,
                                  log=lambda msg: log("actor %d: %s" % (task, msg)))
        n = flags.envs_per_actor // len(self.groups)
        note = precision.resolve(flags, self.agent, env_spec, n, train=False)  # one group's inference step
        if note:
            log("actor %d: %s" % (task, note))
        self.refresh_casts = nets.freeze_casts(self.agent)  # bfloat16 copies of the torso, cast once per update
        self.step = make_step(self.agent, n, env_spec)
        self.client = transport.ActorClient(self.learner, self.spec, flags.queue_capacity, flags.batch_size)
        self.buf = {f.name: np.zeros((flags.envs_per_actor,) + f.shape, f.dtype) for f in self.spec.fields}
        self.buf["actor_id"][:] = task
        self.buf["actor_host"][:] = telemetry.encode_host(telemetry.host_name())
        self.probe = telemetry.ProcessProbe() if flags.telemetry else None
        self.timings = Timings(*PHASES)
        self.failure = None  # why the last weight read failed
        self.refused_version = None  # the last published weights refused for not being finite
        self.warned_wait = False  # --actor_wait_for_weights gave up waiting once (said once)

    def read_weights(self):
        """Takes the newest published weights if there are new ones; False when the read failed."""
        with self.timings.time("transfer"):
            try:
                new = self.client.fetch_weights_if_new()
            except tf.errors.OpError as e:  # any failed read: the session is suspect
                self.failure = "reading weights from %s failed (%s)" % (self.learner, type(e).__name__)
                return False
            if new is not None and not np.isfinite(new[1]).all():
                # A learner refuses to publish such weights; one that did must not make every
                # action NaN: an invalid action hangs ale-py's vector env.
                if new[0] != self.refused_version:
                    self.log("actor %d: WARNING: weights version %d from %s are not finite; acting on the "
                             "previous ones" % (self.task, new[0], self.learner))
                self.refused_version = new[0]
            elif new is not None:
                self.set_weights(tf.constant(new[1]))
                self.refresh_casts()
        return True

    def wait_for_new_weights(self, stop):
        """--actor_wait_for_weights: polls until the learner publishes weights newer than the ones
        acted on (read by the next read_weights), at most WAIT_FOR_WEIGHTS_S; returns the seconds."""
        t0, acted_on = time.perf_counter(), self.client.version
        while not stop() and time.perf_counter() - t0 < WAIT_FOR_WEIGHTS_S:
            try:
                if self.client.published_version() != acted_on:
                    break
            except tf.errors.OpError:
                break  # the next read_weights finds and names the failure
            time.sleep(0.002)
        else:
            if not stop() and not self.warned_wait:
                self.warned_wait = True
                self.log("actor %d: the learner published no new weights within %.0f s of this actor's unroll "
                         "(does a batch need more unrolls than the actors hold?); acting on the ones it has"
                         % (self.task, WAIT_FOR_WEIGHTS_S))
        return time.perf_counter() - t0

    def next_unroll(self):
        """Fills the buffer with the next unroll and its timings (per env)."""
        self.buf["policy_version"][:] = self.client.version
        fill_unroll(self.groups, self.buf, self.step, self.flags.unroll_length, self.timings, self.flags.discounting)
        self.buf["actor_timing"][:] = (self.timings.seconds / self.flags.envs_per_actor).astype(np.float32)
        if self.probe is not None:
            self.buf["actor_cpu"][:], self.buf["actor_rss_mb"][:] = self.probe.sample()
        self.timings.reset()

    def close(self):
        for g in self.groups:
            g.batch.close()
        self.client.reset()


def run(flags, task, learner, seed_index=None, log=print):
    """The actor's life: connect to `learner` (host:port), then unrolls until a signal, the run's
    end or a lost learner. `task` is its id at that learner; `seed_index` tells its seeds apart
    from every other actor's (default: task). Returns the exit code (0, 3 when the learner
    could not be reached, ENV_CRASH_LOOP_EXIT when its envs crash again and again)."""
    devices.set_threads(flags.actor_threads)  # before TensorFlow runs its first op
    stop = StopSignal()
    try:
        actor = Actor(flags, task, learner, task if seed_index is None else seed_index, log)
    except env_batch.EnvCrashLoop as e:  # already in the envs' first reset
        log("actor %d: ERROR: %s" % (task, e))
        return ENV_CRASH_LOOP_EXIT
    log("actor %d: %d x %s (%s envs in %d group(s)), agent %s, learner %s"
        % (task, flags.envs_per_actor, flags.level_name, env_batch.resolve_backend(flags.env_backend, flags.level_name),
           len(actor.groups), flags.agent_name, actor.learner))
    if not sender_lib.connect(actor.client, flags.actor_reconnect_timeout_s, stop, log):
        actor.close()
        return 0 if stop() else 3
    try:
        sent, gave_up = _send_until_stopped(actor, stop)
    except env_batch.EnvCrashLoop as e:
        log("actor %d: ERROR: %s" % (task, e))
        actor.close()
        return ENV_CRASH_LOOP_EXIT
    actor.close()
    log("actor %d: stopped after %d unrolls%s" % (task, sent, "; gave up on the learner" if gave_up else ""))
    return 3 if gave_up else 0


def _send_until_stopped(actor, stop):
    """The unroll loop; returns (unrolls sent, whether the learner was given up on)."""
    task, log = actor.task, actor.log
    backstop_ms = int(actor.flags.actor_enqueue_backstop_s * 1000)
    sender, sent_before, resent_before, gave_up = sender_lib.Sender(actor.client, stop, backstop_ms), 0, 0, False
    while not stop():
        why = None
        if not actor.read_weights():
            why = actor.failure
        else:
            actor.next_unroll()
            actor.timings.add("transfer", sender.send(actor.buf))
            if not actor.flags.actor_send_ahead:  # the next unroll reads weights only once this one is queued
                actor.timings.add("transfer", sender.wait_sent())
                if actor.flags.actor_wait_for_weights and sender.outcome is None:
                    actor.timings.add("transfer", actor.wait_for_new_weights(stop))
            if sender.outcome == "closed":
                log("actor %d: learner closed its queue (run finished); exiting" % task)
                break
            if sender.outcome == "lost":
                sender.close()
                why = "lost learner %s%s" % (actor.learner, " (%s: %s)" % (type(sender.error).__name__, sender.error)
                                             if sender.error else "")
        if why is not None:
            if not sender_lib.reconnect(actor.client, actor.flags, stop, log,
                                        "actor %d: %s, reconnecting" % (task, why)):
                gave_up = not stop()
                break
            if sender.outcome is not None:  # a new session needs a new sender
                sent_before, resent_before = sent_before + sender.sent, resent_before + sender.resent
                sender = sender_lib.Sender(actor.client, stop, backstop_ms)
    sender.drain()
    sender.close()
    if resent_before + sender.resent:
        log("actor %d: %d enqueue(s) sent again after waiting %.1f s on a full queue (the learner drops what it "
            "already took)" % (task, resent_before + sender.resent, backstop_ms / 1000))
    return sent_before + sender.sent, gave_up
