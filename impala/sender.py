"""An actor's link to its learner: connecting (and saying why not, while Ctrl-C still works),
sending unrolls from a background thread with the queue's backpressure, and telling a finished
run ('closed') from a lost learner ('lost')."""
import os
import queue
import socket
import threading
import time

import numpy as np
import tensorflow as tf

from impala import transport


ENQUEUE_BACKSTOP_MS = 120_000


class Sender:
    """Enqueues unrolls from a background thread so the envs keep stepping
    while the previous unroll travels. Holds at most one unroll in hand: when
    the learner's queue is full, `send` blocks, which keeps the backpressure.

    An enqueue waits as long as the learner's queue stays full: a timeout would
    cancel it half-way (TF queues keep the unrolls already inserted; the learner drops
    the retry's copies of those by their numbers) and, with several actors, a retry goes
    to the back of the line, where a short timeout can starve one actor for minutes.
    Whether the learner is still there is asked separately, by a small read from the
    waiting main thread (`check_learner`)."""

    PROBE_AFTER_S = 10.0  # an enqueue blocked this long makes the main thread ask
    PROBE_EVERY_S = 5.0
    PROBE_FAILURES = 2  # consecutive unanswered probes that mean "lost"

    def __init__(self, client, stopper, backstop_ms=None):
        self.client, self.stopper = client, stopper
        self.backstop_ms = backstop_ms  # None: ENQUEUE_BACKSTOP_MS
        self.resent = 0  # enqueues sent again after the backstop cancelled them
        self.inbox = queue.Queue(maxsize=1)
        self.outcome = None  # set to 'closed' / 'lost' by the thread or by check_learner
        self.sent = 0
        self.error = None  # an unexpected exception of the enqueue, if any
        self.busy_since = None  # when the enqueue in progress started
        # Its own stream of numbered unrolls (transport.RepeatFilter): a random id per sender.
        self.sender_id = 1 + int.from_bytes(os.urandom(8), "little") % (2 ** 63 - 1)
        self.numbered = 0
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
                outcome = self._enqueue(item)
            except Exception as e:  # never die silently: a dead sender would stall the actor
                outcome, self.error = "lost", e
            self.busy_since = None
            if outcome == "sent":
                self.sent += 1
            elif outcome != "stopped" and self.outcome is None:
                self.outcome = outcome
            self.inbox.task_done()

    def _enqueue(self, buf):
        """'sent', 'closed' (learner finished), 'lost' (learner unreachable) or 'stopped'."""
        while not self.stopper():
            outcome = _enqueue(self.client, buf, self.backstop_ms or ENQUEUE_BACKSTOP_MS)
            if outcome != "resend":
                return outcome
            self.resent += 1
        return "stopped"

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
        item = {k: v.copy() for k, v in buf.items()}
        if "sequence" in item:
            n = len(item["sequence"])
            item["sender"][:] = self.sender_id
            item["sequence"][:] = np.arange(self.numbered + 1, self.numbered + n + 1)
            self.numbered += n
        while not self.stopper() and self.outcome is None:
            try:
                self.inbox.put(item, timeout=0.5)
                break
            except queue.Full:
                self.check_learner()
        return time.perf_counter() - t0

    def wait_sent(self):
        """Waits until the unroll in hand is in the learner's queue, has failed, or the actor
        stops; returns the seconds waited. A learner that stops answering meanwhile is found by
        the same small reads as in `send`."""
        t0 = time.perf_counter()
        while self.inbox.unfinished_tasks and not self.stopper() and self.outcome is None:
            self.check_learner()
            time.sleep(0.002)
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


CONNECT_REPORT_FIRST_S = 10.0


def connect(client, timeout_s, stopper, log):
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


def _address(client):
    return client.target.replace("grpc://", "")


def _unreachable_message(client, waited):
    why = getattr(client, "last_error", None) or "no answer"
    if why == transport.NOT_PUBLISHED:
        return ("actor: learner %s answers but has published no weights for %.0f s (still starting?)"
                % (_address(client), waited))
    return ("actor: cannot reach learner %s for %.0f s: is the port open from this host (%s)? (%s)"
            % (_address(client), waited, socket.gethostname(), why))


def reconnect(client, flags, stopper, log, why):
    """Drops the session and connects again; False when the learner stays away."""
    log(why)
    client.reset()
    return connect(client, flags.actor_reconnect_timeout_s, stopper, log)


def _enqueue(client, buf, backstop_ms):
    """'sent', 'closed' (learner finished), 'lost' (learner unreachable) or 'resend'.
    The long timeout is only a backstop (Sender.check_learner notices a silent learner
    sooner); it is never hit while the learner drains its queue. When it is, the queue may
    have taken part of the unrolls: the retry sends them all again, and the learner drops
    the ones it already has by their numbers (transport.RepeatFilter)."""
    try:
        client.enqueue(buf, timeout_ms=backstop_ms)
        return "sent"
    except tf.errors.DeadlineExceededError:
        if not client.alive():  # a dead learner also times out: it answers nothing
            return "lost"
        return "resend"  # queue full for a long time: the learner is the bottleneck; keep waiting
    except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
        return "closed"
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.FailedPreconditionError,
            tf.errors.NotFoundError, tf.errors.InternalError, tf.errors.UnknownError):
        return "lost"
