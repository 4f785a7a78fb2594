"""Per-host and per-worker telemetry of a real 2-actor CartPole run: what the learner writes to
telemetry/rank0.{json,csv}, to TensorBoard (workers/... and hosts/... tags) and to metrics.csv
(the bottleneck of each period), and the table the frontend's --action=status prints from it."""
import csv
import glob
import json
import os
import socket
import time

import numpy as np
import pytest
import tensorflow as tf

from cluster import watch
from impala import telemetry
from local_cluster import LocalCluster
from tests.test_experiment import CARTPOLE, _free_base_port


def _tags(event_dir):
    tags = set()
    for path in glob.glob(os.path.join(event_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    return tags


@pytest.mark.slow  # a whole run; the default suite has telemetry's parts
def test_a_run_reports_every_worker_and_host(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    c = LocalCluster(2, _free_base_port(), CARTPOLE + ["--total_environment_frames=30000"], logdir).start()
    try:
        assert c.wait(timeout=240) == 0
    finally:
        c.stop()
    host = socket.gethostname()
    snap = json.load(open(os.path.join(logdir, "telemetry", "rank0.json")))
    workers = {w["worker"]: w for w in snap["workers"]}
    assert set(workers) == {"learner_0", "actor_0", "actor_1"}, workers
    rows = list(csv.DictReader(open(os.path.join(logdir, "telemetry", "rank0.csv"))))
    assert {r["worker"] for r in rows} == set(workers) and len(rows) >= 6
    for name in ("actor_0", "actor_1"):
        w = workers[name]
        assert w["host"] == host and w["rss_mb"] > 50 and w["cpu_percent"] > 0 and w["rate_unit"] == "frames/s", w
        # The last period is the short tail at the stop, in which an actor may have sent nothing: 0 frames/s
        # and no shares (the test of an actor that sent nothing, below). So both are checked where it sent.
        sent = [r for r in rows if r["worker"] == name and float(r["rate"]) > 0]
        assert sent and all(abs(sum(float(r[k]) for k in ("share_a", "share_b", "share_c")) - 1) < 1e-3 for r in sent)
    learner = workers["learner_0"]
    assert learner["rate_unit"] == "samples/s" and learner["rss_mb"] > 100 and learner["shares"] == "wait,learn,publish"
    assert snap["bottleneck"] in ("actors", "learner") and snap["hosts"][host]["workers"] == 3
    assert snap["hosts"][host]["machine_cpu_percent"] > 0
    tags = _tags(os.path.join(logdir, "telemetry", "rank0"))
    for t in ("workers/actor_1/cpu_percent", "workers/actor_0/frames_per_s", "workers/actor_0/env_share",
              "workers/learner_0/samples_per_s", "workers/learner_0/wait_share", "hosts/%s/cpu_percent" % host,
              "hosts/%s/rss_mb" % host):
        assert t in tags, sorted(tags)
    metrics = list(csv.DictReader(open(os.path.join(logdir, "metrics.csv"))))
    assert all(r["bottleneck"] in ("actors", "learner") for r in metrics)
    watch.print_telemetry(logdir)
    out = capsys.readouterr().out
    assert "telemetry of learner 0" in out and "bottleneck %s" % snap["bottleneck"] in out
    assert all(name in out for name in workers) and "frames/s" in out and "samples/s" in out


def test_host_names_travel_in_a_fixed_field():
    row = telemetry.encode_host("node-17.cluster")
    assert row.dtype == np.uint8 and row.shape == (telemetry.HOST_BYTES,)
    assert telemetry.decode_host(row) == "node-17.cluster"
    assert telemetry.decode_host(telemetry.encode_host("x" * 80)) == "x" * telemetry.HOST_BYTES
    assert telemetry.decode_host(np.zeros(telemetry.HOST_BYTES, np.uint8)) == "?"
    assert telemetry.verdict(0.5) == "actors" and telemetry.verdict(0.1) == "learner"


def test_an_actor_cpu_figure_spans_a_window_not_one_short_unroll():
    c0, t0 = time.process_time(), time.monotonic()
    probe = telemetry.ProcessProbe(window_s=0.3)
    cpu, rss = probe.sample()
    assert cpu != cpu and rss > 50  # no window has ended yet: not measured, not 0 %
    end = time.monotonic() + 0.4
    while time.monotonic() < end:  # busy, as an actor stepping envs is
        pass
    busy, _ = probe.sample()
    # Against the CPU time this process got (the suite's other worker may hold a core), not one
    # whole core: the figure is the window's share, not the 0 % of a window too short to tick.
    share = 100 * (time.process_time() - c0) / (time.monotonic() - t0)
    assert busy > 0 and abs(busy - share) < 20, (busy, share)
    # Samples a few ms apart (short unrolls) repeat the window's figure; the kernel's 10 ms ticks
    # would read most of them as 0 %.
    assert [probe.sample()[0] for _ in range(20)] == [busy] * 20


def test_an_actor_that_sent_nothing_in_a_period_has_no_shares_and_the_table_says_so(tmp_path, capsys):
    # The stop's last period can be a short tail in which an actor sent no unroll.
    figures = telemetry.ActorFigures()
    figures.add(telemetry.encode_host("h1"), 40.0, 300.0, 2, np.array([3.0, 1.0, 0.0]))
    row = figures.row("actor_0", dt=2.0, frames_per_unroll=100)
    assert row["rate"] == 100 and (row["share_a"], row["share_b"], row["share_c"]) == (0.75, 0.25, 0.0)
    idle = figures.row("actor_0", dt=0.2, frames_per_unroll=100)
    assert idle["rate"] == 0 and all(idle[k] != idle[k] for k in ("share_a", "share_b", "share_c"))
    assert "env_share" not in telemetry.scalars(idle) and telemetry.scalars(idle)["frames_per_s"] == 0
    os.makedirs(tmp_path / "telemetry")
    with open(tmp_path / "telemetry" / "rank0.json", "w") as f:
        json.dump({"rank": 0, "time": time.time(), "frames": 10, "bottleneck": "actors",
                   "workers": [dict(idle, time_s=0, frames=10)]}, f, default=float)
    watch.print_telemetry(str(tmp_path))
    out = capsys.readouterr().out
    assert "sent nothing in the last period" in out and "nan" not in out, out
