"""The actor -> learner transport on a real tf.distribute.Server (in this process):
unrolls from several actors blocked on a full queue all arrive, once each, and an
actor notices a learner that stops answering while its enqueue is blocked."""
import threading
import time

import numpy as np
import tensorflow as tf

from impala import sender as sender_lib
from impala import transport
from tests.test_experiment import _free_base_port

E, T = 8, 2  # unrolls per enqueue, steps per unroll


def _spec():
    return transport.make_unroll_spec((2,), np.float32, 3, T, [], 10)


def _batch(spec, actor_id, seq):
    buf = {f.name: np.zeros((E,) + f.shape, f.dtype) for f in spec.fields}
    buf["actor_id"][:] = actor_id
    buf["policy_version"][:] = [actor_id * 100000 + seq * E + i for i in range(E)]  # unique marker
    return buf


def test_blocked_actors_all_deliver_each_unroll_exactly_once():
    # A queue of 4 drained slowly (2 unrolls every 0.3 s) keeps each 8-unroll enqueue
    # blocked for seconds. A timed-out enqueue would leave part of its unrolls in
    # the queue and send them again (duplicates) and lose its place in line.
    spec = _spec()
    port = _free_base_port()
    learner = transport.LearnerTransport("127.0.0.1:%d" % port, spec, capacity=4, batch_size=2)
    learner.publish(np.zeros(10, np.float32), 0)
    sends_per_actor, stop = 3, threading.Event()
    senders = []

    def run_actor(actor_id):
        client = transport.ActorClient("127.0.0.1:%d" % port, spec, 4, 2)
        assert client.connect(30)
        sender = sender_lib.Sender(client, stop.is_set)
        senders.append(sender)
        for seq in range(sends_per_actor):
            sender.send(_batch(spec, actor_id, seq))
        sender.drain(timeout_s=60)
        sender.close()

    threads = [threading.Thread(target=run_actor, args=(a,), daemon=True) for a in (1, 2)]
    for t in threads:
        t.start()
    got, deadline = [], time.time() + 90
    want = 2 * sends_per_actor * E
    while len(got) < want and time.time() < deadline:
        batch = learner.try_dequeue(2)
        if batch is None:
            time.sleep(0.02)
            continue
        got.extend(batch["policy_version"].tolist())
        time.sleep(0.3)
    time.sleep(0.5)
    leftover = learner.size()
    stop.set()
    learner.close()
    for t in threads:
        t.join(10)
    assert len(got) == want, "got %d of %d unrolls" % (len(got), want)
    assert len(set(got)) == want, "duplicated unrolls: %d of %d unique" % (len(set(got)), want)
    assert leftover == 0
    assert all(s.outcome is None for s in senders)
    assert sorted(got) == sorted(a * 100000 + k for a in (1, 2) for k in range(sends_per_actor * E))


class _StuckClient:
    """An enqueue that never returns (a learner frozen with its socket open)."""

    def __init__(self, answers):
        self.answers = answers
        self.release = threading.Event()
        self.probes = 0

    def enqueue(self, buf, timeout_ms):
        self.release.wait(timeout_ms / 1000.0)

    def alive(self):
        self.probes += 1
        return self.answers


def _blocked_sender(client, monkeypatch):
    monkeypatch.setattr(sender_lib.Sender, "PROBE_AFTER_S", 0.3)
    monkeypatch.setattr(sender_lib.Sender, "PROBE_EVERY_S", 0.1)
    stop = threading.Event()
    sender = sender_lib.Sender(client, stop.is_set)
    buf = _batch(_spec(), 1, 0)
    sender.send(buf)  # taken by the thread, which blocks in enqueue
    return sender, buf, stop


def test_sender_reports_a_silent_learner_as_lost(monkeypatch):
    client = _StuckClient(answers=False)
    sender, buf, stop = _blocked_sender(client, monkeypatch)
    t0 = time.time()
    sender.send(buf)  # the inbox slot frees only when the thread is done...
    sender.send(buf)  # ...so this one waits, probing the learner
    assert sender.outcome == "lost"
    assert time.time() - t0 < 5
    assert client.probes >= sender_lib.Sender.PROBE_FAILURES
    client.release.set()
    stop.set()


def test_sender_keeps_waiting_on_a_slow_but_live_learner(monkeypatch):
    client = _StuckClient(answers=True)
    sender, buf, stop = _blocked_sender(client, monkeypatch)
    waiter = threading.Thread(target=lambda: (sender.send(buf), sender.send(buf)), daemon=True)
    waiter.start()
    time.sleep(1.5)
    assert sender.outcome is None and client.probes >= 2
    stop.set()
    client.release.set()
    waiter.join(5)
    assert not waiter.is_alive()


def test_waiting_for_the_unroll_in_hand_ends_once_it_is_queued(monkeypatch):
    client = _StuckClient(answers=True)
    sender, buf, stop = _blocked_sender(client, monkeypatch)
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(sender.wait_sent()), daemon=True)
    waiter.start()
    time.sleep(0.6)
    assert not waited, "returned while the enqueue was still blocked"
    client.release.set()
    waiter.join(5)
    assert waited and waited[0] >= 0.6 and sender.outcome is None and sender.sent == 1
    stop.set()


def test_waiting_for_the_unroll_in_hand_ends_when_the_learner_is_lost(monkeypatch):
    client = _StuckClient(answers=False)
    sender, buf, stop = _blocked_sender(client, monkeypatch)
    t0 = time.time()
    sender.wait_sent()
    assert sender.outcome == "lost" and time.time() - t0 < 5
    client.release.set()
    stop.set()


def test_sender_turns_an_unexpected_enqueue_error_into_lost():
    class Broken:
        def enqueue(self, buf, timeout_ms):
            raise ValueError("boom")

        def alive(self):
            return True

    sender = sender_lib.Sender(Broken(), lambda: False)
    sender.send(_batch(_spec(), 1, 0))
    deadline = time.time() + 5
    while sender.outcome is None and time.time() < deadline:
        time.sleep(0.01)
    assert sender.outcome == "lost" and isinstance(sender.error, ValueError)
    assert sender.busy_since is None


def test_atari_unrolls_arrive_bit_for_bit_and_time_major():
    """Every field of Atari-shaped unrolls (uint8 [T+1, 84, 84, 4] frames) reaches the
    learner unchanged, and the learner's time-major view pairs obs[t] with action[t]."""
    from impala.batches import to_time_major
    spec = transport.make_unroll_spec((84, 84, 4), np.uint8, 6, T, [], 10)
    port = _free_base_port()
    server = transport.LearnerTransport("127.0.0.1:%d" % port, spec, capacity=8, batch_size=E)
    server.publish(np.zeros(10, np.float32), 0)
    client = transport.ActorClient("127.0.0.1:%d" % port, spec, 8, E)
    try:
        assert client.connect(30)
        rng = np.random.default_rng(0)
        sent = {}
        for f in spec.fields:
            shape = (E,) + f.shape
            if f.dtype == np.bool_:
                sent[f.name] = rng.random(shape) < 0.5
            elif np.issubdtype(f.dtype, np.integer):
                sent[f.name] = rng.integers(0, 200, size=shape).astype(f.dtype)
            else:
                sent[f.name] = rng.normal(size=shape).astype(f.dtype)
        sent["sequence"] = np.arange(1, E + 1)  # numbered as a Sender numbers them
        client.enqueue(sent, timeout_ms=30000)
        got = server.try_dequeue(E)
        assert got is not None
        for name, value in sent.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        tm = to_time_major(got, spec.names)
        assert tm["observation"].shape == (T + 1, E, 84, 84, 4)
        np.testing.assert_array_equal(tm["observation"][1, 3], sent["observation"][3, 1])
        np.testing.assert_array_equal(tm["action"][0], sent["action"][:, 0])
    finally:
        client.reset()
        server.close()


def _numbered_batch(spec, actor_id, seq):
    buf = _batch(spec, actor_id, seq)
    buf.pop("sender"), buf.pop("sequence")  # the Sender numbers them
    return dict(buf, sender=np.zeros(E, np.int64), sequence=np.zeros(E, np.int64))


def test_enqueues_that_time_out_after_a_partial_accept_deliver_each_unroll_once(monkeypatch):
    """The real backstop path, shortened: a queue of 4 drained 2 unrolls every 0.4 s keeps
    each 8-unroll enqueue past a 0.3 s backstop, so TensorFlow's queue keeps part of it and
    the sender sends all 8 again, several times per send. The learner gets every unroll
    exactly once, in each actor's order, and counts the repeats it dropped."""
    monkeypatch.setattr(sender_lib, "ENQUEUE_BACKSTOP_MS", 300)
    spec = _spec()
    port = _free_base_port()
    learner = transport.LearnerTransport("127.0.0.1:%d" % port, spec, capacity=4, batch_size=2)
    learner.publish(np.zeros(10, np.float32), 0)
    sends_per_actor, stop, senders = 3, threading.Event(), []

    def run_actor(actor_id):
        client = transport.ActorClient("127.0.0.1:%d" % port, spec, 4, 2)
        assert client.connect(30)
        sender = sender_lib.Sender(client, stop.is_set)
        senders.append(sender)
        for seq in range(sends_per_actor):
            sender.send(_numbered_batch(spec, actor_id, seq))
        sender.drain(timeout_s=60)

    threads = [threading.Thread(target=run_actor, args=(a,), daemon=True) for a in (1, 2)]
    for t in threads:
        t.start()
    got, want, deadline = [], 2 * sends_per_actor * E, time.time() + 90
    while len(got) < want and time.time() < deadline:
        batch = learner.try_dequeue(2)
        if batch is None:
            time.sleep(0.02)
            continue
        got.extend(batch["policy_version"].tolist())
        time.sleep(0.4)
    time.sleep(1.0)  # a repeat still arriving would show up as queue content
    extra = learner.try_dequeue(1)
    stop.set()
    learner.close()
    for t in threads:
        t.join(10)
    assert learner.repeats.dropped > 0, "no enqueue timed out after a partial accept: the test did not test"
    assert extra is None, "an unroll arrived after all were delivered"
    assert len(got) == want and len(set(got)) == want, "got %d, %d unique, of %d" % (len(got), len(set(got)), want)
    for a in (1, 2):
        mine = [g for g in got if g // 100000 == a]
        assert mine == sorted(mine), "actor %d's unrolls out of order" % a
    assert all(s.outcome is None for s in senders)


def test_weights_and_their_version_are_read_together():
    """A publish landing between reading the version and reading the weights must not give
    an actor new-version numbers with old weights: every fetched pair matches."""
    size = 2_000_000  # a read long enough for publishes to land inside it
    spec = transport.make_unroll_spec((2,), np.float32, 3, T, [], size)
    port = _free_base_port()
    learner = transport.LearnerTransport("127.0.0.1:%d" % port, spec, capacity=4, batch_size=2)
    learner.publish(np.zeros(size, np.float32), 0)
    halt = threading.Event()

    def publish_forever():
        v = 0
        while not halt.is_set():
            v += 1
            learner.publish(np.full(size, v, np.float32), v)

    publisher = threading.Thread(target=publish_forever, daemon=True)
    publisher.start()
    client = transport.ActorClient("127.0.0.1:%d" % port, spec, 4, 2)
    assert client.connect(30)
    mismatched, fetched, deadline = [], 0, time.time() + 8
    try:
        while time.time() < deadline and fetched < 1000:
            new = client.fetch_weights_if_new()
            if new is None:
                continue
            fetched += 1
            version, weights = new
            if weights[0] != version or weights[-1] != version:
                mismatched.append((version, float(weights[0]), float(weights[-1])))
    finally:
        halt.set()
        publisher.join(10)
        learner.close()
    assert fetched > 20
    assert not mismatched, "%d of %d fetches had weights of another version, e.g. %s" % (
        len(mismatched), fetched, mismatched[:3])


class _AnswerLost:
    """A TensorFlow session with one fault injected: the first run of `faulty` goes through, then its
    answer is lost and the retry refused ("The same RunGraph request was received twice")."""

    def __init__(self, sess, faulty):
        self.sess, self.faulty, self.faults = sess, faulty, 0

    def run(self, fetches, feed=None, **kw):
        out = self.sess.run(fetches, feed, **kw)
        if fetches is self.faulty and self.faults == 0:
            self.faults += 1
            raise tf.errors.AbortedError(None, None, "The same RunGraph request was received twice")
        return out


def test_a_dequeue_retried_after_a_lost_answer_loses_nothing():
    spec = _spec()
    port = _free_base_port()
    learner = transport.LearnerTransport("127.0.0.1:%d" % port, spec, capacity=16, batch_size=2)
    learner.publish(np.zeros(10, np.float32), 0)
    client = transport.ActorClient("127.0.0.1:%d" % port, spec, 16, 2)
    assert client.connect(30)
    client.enqueue(_batch(spec, 1, 0))
    learner.sess = _AnswerLost(learner.sess, learner._g.take)
    got = []
    for _ in range(E // 2):
        batch = learner.try_dequeue(2)
        got.extend([] if batch is None else batch["policy_version"].tolist())
    learner.close()
    assert learner.sess.faults == 1
    assert got == [100000 + i for i in range(E)], "a retried dequeue lost or repeated unrolls: %s" % got


def test_a_weight_read_refused_as_a_repeat_is_retried():
    """An actor or evaluator whose weight read meets a resent request must get the weights,
    not an error that makes it reconnect or (the evaluator) stop."""
    spec = _spec()
    port = _free_base_port()
    learner = transport.LearnerTransport("127.0.0.1:%d" % port, spec, capacity=16, batch_size=2)
    learner.publish(np.full(10, 7, np.float32), 7)
    client = transport.ActorClient("127.0.0.1:%d" % port, spec, 16, 2)
    try:
        assert client.connect(30)
        client.sess = _AnswerLost(client.sess, client._g.read_weights)
        version, weights = client.fetch_weights_if_new()
    finally:
        learner.close()
    assert client.sess.faults == 1
    assert version == 7 and (weights == 7).all()
