"""Per-host and per-worker telemetry while a run trains: each actor stamps its unrolls with its host,
CPU % and resident memory (its rates and time shares travel in them already); each learner rank adds
its own figures and, every --log_every_s, writes the table to TensorBoard under `workers/<worker>/...`
and `hosts/<host>/...`, to <logdir>/telemetry/rank<r>.csv (one row per worker and period) and to
<logdir>/telemetry/rank<r>.json (the newest table, which the frontend's --action=status prints).
Every rank writes its own files, so ranks need no collective at log time.
"""
import collections
import os
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import psutil

from tools.files import write_json
from tools.runlog import RunLog

HOST_BYTES = 32  # the host name's room in an unroll (longer names are cut)
COLUMNS = ("time_s", "frames", "worker", "host", "cpu_percent", "rss_mb", "rate", "rate_unit", "share_a", "share_b",
           "share_c", "shares", "queue_fill", "gpu_util", "gpu_mem_mb", "bottleneck")


def host_name():
    return socket.gethostname()


def encode_host(name):
    raw = name.encode()[:HOST_BYTES]
    return np.frombuffer(raw.ljust(HOST_BYTES, b"\0"), np.uint8)


def decode_host(row):
    return bytes(np.asarray(row, np.uint8)).rstrip(b"\0").decode(errors="replace") or "?"


class ProcessProbe:
    """This process's CPU % (every thread, 100 = one core) and resident MB. The CPU figure spans at
    least `window_s`: the kernel counts CPU time in 10 ms ticks, so over one short unroll (a CartPole
    unroll takes a few ms) the delta is often zero ticks and would read 0 %. Between windows the
    last figure is repeated; before the first window ends it is NaN (not measured yet)."""

    def __init__(self, window_s=1.0):
        self.proc, self.window_s = psutil.Process(), window_s
        self.since, self.cpu = time.monotonic(), float("nan")
        self.proc.cpu_percent(None)  # the first call only starts the clock

    def sample(self):
        now = time.monotonic()
        if now - self.since >= self.window_s:
            self.cpu, self.since = float(self.proc.cpu_percent(None)), now
        return self.cpu, self.proc.memory_info().rss / 2 ** 20


class GpuProbe:
    """The learner's GPU: utilisation % from nvidia-smi, read in a thread so the update loop never
    waits on it, and memory in use from TensorFlow. Nothing where no GPU is visible."""

    def __init__(self, interval_s):
        import tensorflow as tf
        self.tf, self.util, self.stopped = tf, None, threading.Event()
        self.present = bool(tf.config.list_physical_devices("GPU"))
        if self.present and shutil.which("nvidia-smi"):
            threading.Thread(target=self._poll, args=(max(interval_s, 1.0),), daemon=True).start()

    def _poll(self, interval_s):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        while not self.stopped.wait(interval_s):
            try:
                out = subprocess.run(["nvidia-smi", "-i", visible, "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                self.util = float(out.stdout.strip().splitlines()[0])
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                self.util = None

    def sample(self):
        if not self.present:
            return None, None
        try:
            mem = self.tf.config.experimental.get_memory_info("GPU:0")["current"] / 2 ** 20
        except (ValueError, RuntimeError):
            mem = None
        return self.util, mem

    def close(self):
        self.stopped.set()


class ActorFigures:
    """One actor's newest stamp and what it sent since the last period."""

    def __init__(self):
        self.host, self.cpu, self.rss = "?", float("nan"), float("nan")
        self.unrolls, self.time = 0, np.zeros(3)

    def add(self, host_row, cpu, rss, unrolls, timing):
        self.host, self.cpu, self.rss = decode_host(host_row), float(cpu), float(rss)
        self.unrolls += unrolls
        self.time += timing

    def row(self, worker, dt, frames_per_unroll):
        # No unroll in the period (the short tail at a stop can have none): its shares are unknown, not 0.
        shares = self.time / self.time.sum() if self.time.sum() > 0 else np.full(3, np.nan)
        row = {"worker": worker, "host": self.host, "cpu_percent": self.cpu, "rss_mb": self.rss,
               "rate": self.unrolls * frames_per_unroll / dt, "rate_unit": "frames/s", "shares": "env,inference,transfer",
               "share_a": shares[0], "share_b": shares[1], "share_c": shares[2]}
        self.unrolls, self.time = 0, np.zeros(3)
        return row


def scalars(row):
    """A table row's numbers by TensorBoard name: cpu_percent, rss_mb, frames_per_s or samples_per_s,
    <phase>_share for its three phases, and queue_fill and GPU figures where the row has them."""
    out = {"cpu_percent": row["cpu_percent"], "rss_mb": row["rss_mb"],
           row["rate_unit"].replace("/s", "_per_s"): row["rate"]}
    for key, phase in zip(("share_a", "share_b", "share_c"), row["shares"].split(",")):
        out[phase + "_share"] = row[key]
    for key in ("queue_fill", "gpu_util", "gpu_mem_mb"):
        out[key] = row.get(key)
    return {k: float(v) for k, v in out.items() if v is not None and v == v}


def verdict(wait_share):
    """Which side limits the run, from the share of a period the learner waited for data."""
    return "actors" if wait_share > 0.25 else "learner"


class Telemetry:
    """One learner rank's table of workers (itself and its actors), written every log period."""

    def __init__(self, logdir, rank, frames_per_unroll, samples_per_update, log_every_s):
        import tensorflow as tf
        self.dir, self.rank, self.host = os.path.join(logdir, "telemetry"), rank, host_name()
        self.frames_per_unroll, self.samples_per_update = frames_per_unroll, samples_per_update
        os.makedirs(self.dir, exist_ok=True)
        self.actors = collections.defaultdict(ActorFigures)
        self.probe, self.gpu = ProcessProbe(window_s=0.0), GpuProbe(log_every_s)  # a period is long enough
        psutil.cpu_percent(None)  # the host's, since the last call
        self.writer = tf.summary.create_file_writer(os.path.join(self.dir, "rank%d" % rank))
        self.rows = RunLog(os.path.join(self.dir, "rank%d.csv" % rank), COLUMNS, None)  # TensorBoard: tensorboard()
        self.last_time, self.last_updates, self.last_timings = time.time(), None, None

    def add_batch(self, batch):
        ids = batch["actor_id"]
        for a in np.unique(ids):
            rows = np.flatnonzero(ids == a)
            last = rows[-1]
            self.actors[int(a)].add(batch["actor_host"][last], batch["actor_cpu"][last], batch["actor_rss_mb"][last],
                                    len(rows), batch["actor_timing"][rows].sum(axis=0))

    def learner_row(self, dt, updates, timings, queue_fill):
        """This rank's own figures over the period; the shares are of its wait, learn and publish time."""
        spent = np.array([timings["wait"], timings["learn"], timings["publish"]])
        period = spent - (self.last_timings if self.last_timings is not None else 0)
        shares = period / max(period.sum(), 1e-9)
        rate = float("nan") if self.last_updates is None else (updates - self.last_updates) * self.samples_per_update / dt
        self.last_timings, self.last_updates = spent, updates
        cpu, rss = self.probe.sample()
        gpu_util, gpu_mem = self.gpu.sample()
        return {"worker": "learner_%d" % self.rank, "host": self.host, "cpu_percent": cpu, "rss_mb": rss, "rate": rate,
                "rate_unit": "samples/s", "shares": "wait,learn,publish", "share_a": shares[0], "share_b": shares[1],
                "share_c": shares[2], "queue_fill": queue_fill, "gpu_util": gpu_util, "gpu_mem_mb": gpu_mem}

    def write(self, now, frames, updates, timings, queue_fill):
        """The period's table to TensorBoard, the CSV and the JSON; returns the bottleneck verdict."""
        dt = max(now - self.last_time, 1e-9)
        rows = [self.learner_row(dt, updates, timings, queue_fill)]
        for a in sorted(self.actors):
            rows.append(self.actors[a].row("actor_%d" % a, dt, self.frames_per_unroll))
        self.last_time = now
        said = verdict(rows[0]["share_a"])
        for r in rows:
            r.update(time_s=now, frames=frames, bottleneck=said)
            self.rows.write(r, step=frames)
        hosts = self.host_rows(rows)
        self.tensorboard(frames, rows, hosts)
        snapshot = {"time": now, "frames": frames, "rank": self.rank, "bottleneck": said, "workers": rows,
                    "hosts": hosts}
        write_json(os.path.join(self.dir, "rank%d.json" % self.rank), snapshot, indent=1, default=float)
        return said

    def host_rows(self, rows):
        """Per host: the CPU % and memory of this rank's workers there; the whole machine's CPU % on the
        learner's own host (what other programs take shows there)."""
        hosts = collections.OrderedDict()
        for r in rows:
            h = hosts.setdefault(r["host"], {"cpu_percent": 0.0, "rss_mb": 0.0, "workers": 0})
            h["cpu_percent"] += r["cpu_percent"] if r["cpu_percent"] == r["cpu_percent"] else 0.0
            h["rss_mb"] += r["rss_mb"] if r["rss_mb"] == r["rss_mb"] else 0.0
            h["workers"] += 1
        hosts[self.host]["machine_cpu_percent"] = psutil.cpu_percent(None) * psutil.cpu_count()
        return hosts

    def tensorboard(self, frames, rows, hosts):
        import tensorflow as tf
        with self.writer.as_default(step=int(frames)):
            for r in rows:
                for key, value in scalars(r).items():
                    tf.summary.scalar("workers/%s/%s" % (r["worker"], key), value)
            for host, h in hosts.items():
                for key, value in h.items():
                    tf.summary.scalar("hosts/%s/%s" % (host, key), float(value))
        self.writer.flush()

    def close(self):
        self.gpu.close()
        self.rows.close()
        self.writer.close()
