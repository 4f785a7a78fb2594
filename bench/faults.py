"""Fault injection on a real local cluster (processes on 127.0.0.1, CartPole): what
happened, how long until it was detected, and what was lost.

  .venv/bin/python bench/faults.py                 # every scenario, about 5 minutes
  .venv/bin/python bench/faults.py --only kill_actor truncated_checkpoint

Scenarios:
  kill_actor            SIGKILL one of two actors; the learner reports it (heartbeat =
                        its unrolls, --actor_timeout_s) and trains on with the other.
  kill_learner          SIGKILL the learner; its actors notice, retry with backoff; a new
                        learner in train_w_load resumes from the newest checkpoint and the
                        same actor processes reconnect to it.
  kill_horovod_rank     mpirun -np 2, SIGKILL rank 1: mpirun ends the job, the actors of
                        both ranks exit after their reconnect timeout; train_w_load from the
                        newest checkpoint resumes.
  checkpoint_disk_full  checkpoints/ on a 1 MiB tmpfs filled up: the learner prints an error
                        naming the folder, keeps training, the previous checkpoint stays
                        readable. (Needs mount; skipped where it is not allowed.)
  truncated_checkpoint  the newest checkpoint's data file cut in half: train_w_load warns
                        and resumes from the previous one.
  partial_accept        a queue smaller than an actor's enqueue and a 0.05 s enqueue backstop:
                        enqueues time out after the queue took part of them and are sent
                        again whole; the learner drops the repeats by their numbers.
  resume_fallback_replay a replay run with --checkpoint_replay whose newest checkpoint is
                        cut in half: the resume falls back to the previous checkpoint and gets
                        that checkpoint's replay buffer (same digest), not the newest one's.

Writes bench/results/faults.md and .csv.
"""
import argparse
import csv
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import tensorflow as tf

from local_cluster import LocalCluster
from bench import common

HERE = os.path.dirname(os.path.abspath(__file__))

FLAGS = ["--level_name=CartPole-v1", "--agent_name=MLPAgent", "--batch_size=8", "--unroll_length=20",
         "--envs_per_actor=4", "--queue_capacity=16", "--entropy_cost=0.01", "--learning_rate=0.001",
         "--log_every_s=1", "--actor_timeout_s=5", "--checkpoint_every_s=3",
         "--actor_reconnect_timeout_s=20"]


def frames_now(logdir):
    path = os.path.join(logdir, "metrics.csv")
    if not os.path.exists(path):
        return 0
    rows = open(path).read().splitlines()[1:]
    return int(rows[-1].split(",")[1]) if rows else 0


def wait_for(cond, timeout, step=0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


def detected_and_going_on(logdir, words, timeout, settle, since=0):
    """Right after a fault: whether the learner's log says `words` (past its first `since`
    characters) within `timeout` s, the seconds until it did (nan if never), and whether the
    frame count still grows over the next `settle` s."""
    t_fault = time.time()
    seen = wait_for(lambda: words in common.log_text(logdir)[since:], timeout)
    detect = time.time() - t_fault if seen else float("nan")
    f0 = frames_now(logdir)
    time.sleep(settle)
    return seen, detect, frames_now(logdir) > f0


def newest_checkpoint_frames(logdir):
    state = tf.train.get_checkpoint_state(os.path.join(logdir, "checkpoints"))
    if not state:
        return None, None
    reader = tf.train.load_checkpoint(state.model_checkpoint_path)
    key = next(k for k in reader.get_variable_to_shape_map() if k.startswith("num_env_frames"))
    return state.model_checkpoint_path, int(reader.get_tensor(key))


def scenario_kill_actor(base, work):
    logdir = os.path.join(work, "kill_actor")
    c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=10000000"], logdir).start()
    try:
        wait_for(lambda: frames_now(logdir) > 20000, 120)
        before = len(common.log_text(logdir))  # only what the learner says after the kill counts
        os.killpg(c.actor_procs[0].pid, signal.SIGKILL)
        seen, detect, goes_on = detected_and_going_on(logdir, "actor 0 has sent nothing", 60, 5, before)
    finally:
        c.stop()
    return {"fault": "SIGKILL 1 of 2 actors", "detected_s": detect,
            "what_happened": "learner logged 'actor 0 has sent nothing ... dead or stalled'; training %s with "
                             "the other actor" % ("went on" if goes_on else "STOPPED"),
            "lost": "the dead actor's unroll in progress (< 1 unroll of frames)", "ok": bool(seen and goes_on)}


def scenario_kill_learner(base, work):
    logdir = os.path.join(work, "kill_learner")
    c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=10000000"], logdir).start()
    try:
        wait_for(lambda: newest_checkpoint_frames(logdir)[1], 120)
        time.sleep(4)
        frames_at_kill = frames_now(logdir)
        os.killpg(c.learner.pid, signal.SIGKILL)
        t_kill = time.time()
        c.learner.wait()
        noticed = wait_for(lambda: "reconnecting" in common.log_text(logdir, "actor_0.log"), 30)
        detect = time.time() - t_kill if noticed else float("nan")
        prefix, ckpt_frames = newest_checkpoint_frames(logdir)
        # Restart the learner alone, in train_w_load; the same actor processes reconnect.
        learner_log = open(os.path.join(logdir, "logs", "learner2.log"), "w")
        cmd = c.learner_cmd()
        cmd = [x for x in cmd if not x.startswith("--total_environment_frames")] + [
            "--mode=train_w_load", "--load_model_url=" + logdir, "--total_environment_frames=%d" % (ckpt_frames + 20000)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        t_restart = time.time()
        c.learner = subprocess.Popen(cmd, stdout=learner_log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        code = c.learner.wait(timeout=180)
        resumed = time.time() - t_restart
        text = common.log_text(logdir, "learner2.log")
        m = re.search(r"resumed from \S+ at (\d+) frames", text)
        actors_back = all(p.poll() is None or p.returncode == 0 for p in c.actor_procs)
    finally:
        c.stop()
    ok = code == 0 and m is not None and int(m.group(1)) == ckpt_frames
    return {"fault": "SIGKILL the learner, restart it with train_w_load", "detected_s": detect,
            "what_happened": "actors logged 'reconnecting' and retried with backoff; the new learner resumed "
                             "at %s frames and the same actor processes fed it to the end (%.0f s)"
                             % (m.group(1) if m else "?", resumed),
            "lost": "%d frames (since the last checkpoint; checkpoint_every_s=3)" % max(0, frames_at_kill - (ckpt_frames or 0)),
            "ok": bool(ok and actors_back)}


def scenario_kill_horovod_rank(base, work):
    logdir = os.path.join(work, "kill_rank")
    c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=10000000"], logdir, num_learners=2).start()
    try:
        if wait_for(lambda: newest_checkpoint_frames(logdir)[1], 300) is None:
            raise RuntimeError(f"no checkpoint past 0 frames in {logdir} within 300 s:\n"
                               + common.log_text(logdir)[-3000:])
        rank1 = wait_for(lambda: [p for p in _procs_with("--job_name=learner", logdir)
                                  if p.environ().get("OMPI_COMM_WORLD_RANK") == "1"], 30)
        t_kill = time.time()
        rank1[0].kill()
        c.learner.wait(timeout=60)
        detect = time.time() - t_kill
        stopped = wait_for(lambda: all(p.poll() is not None for p in c.actor_procs), 120)
        everything_gone = time.time() - t_kill
        prefix, ckpt_frames = newest_checkpoint_frames(logdir)
    finally:
        c.stop()
    actor_exits = [p.returncode for p in c.actor_procs]
    shutil.copytree(os.path.join(logdir, "logs"), os.path.join(logdir, "logs_before_resume"))
    c2 = LocalCluster(2, base, ["--mode=train_w_load", "--load_model_url=" + logdir,
                                "--total_environment_frames=%d" % (ckpt_frames + 8000)], logdir,
                      num_learners=2).start()
    try:
        code = c2.wait(timeout=240)
    finally:
        c2.stop()
    m = re.search(r"resumed from \S+ at (\d+) frames", common.log_text(logdir))
    return {"fault": "SIGKILL 1 of 2 Horovod ranks", "detected_s": detect,
            "what_happened": "mpirun ended the job (exit %s) in %.1f s; %s by %.0f s (exit codes %s); train_w_load "
                             "with 2 ranks resumed at %s frames and finished (exit %s)"
                             % (c.learner.returncode, detect, "all actors exited" if stopped else "actors still running",
                                everything_gone, actor_exits, m.group(1) if m else "?", code),
            "lost": "frames since the last checkpoint", "ok": bool(stopped and code == 0 and m)}


def _procs_with(needle, logdir):
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if needle in cmd and logdir in cmd and "mpirun" not in cmd:
            out.append(p)
    return out


def scenario_checkpoint_disk_full(base, work):
    logdir = os.path.join(work, "disk_full")
    ckdir = os.path.join(logdir, "checkpoints")
    os.makedirs(ckdir)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", ckdir], capture_output=True).returncode:
        return {"fault": "disk full while checkpointing", "detected_s": float("nan"),
                "what_happened": "SKIPPED: mount is not allowed here", "lost": "-", "ok": True}
    try:
        c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=10000000"], logdir).start()
        try:
            wait_for(lambda: newest_checkpoint_frames(logdir)[0], 120)  # one good checkpoint before the disk fills
            fd = os.open(os.path.join(ckdir, "filler"), os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"\0" * 65536):
                    pass
            except OSError:  # ENOSPC: the disk is full now
                pass
            finally:
                os.close(fd)
            seen, detect, goes_on = detected_and_going_on(logdir, "could not write a checkpoint", 30, 4)
        finally:
            c.stop()
        newest, _ = newest_checkpoint_frames(logdir)
        tf.train.load_checkpoint(newest)  # the previous checkpoint still reads
    finally:
        subprocess.run(["umount", ckdir], capture_output=True)
    return {"fault": "disk full while checkpointing (1 MiB tmpfs)", "detected_s": detect,
            "what_happened": "learner logged 'could not write a checkpoint to .../checkpoints (...)'; training %s; "
                             "the previous checkpoint %s still reads; exit code %s at stop"
                             % ("went on" if goes_on else "STOPPED", os.path.basename(newest), c.learner.returncode),
            "lost": "nothing trained; checkpoints newer than the last good one", "ok": bool(seen and goes_on)}


def scenario_truncated_checkpoint(base, work):
    logdir = os.path.join(work, "truncated")
    c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=30000", "--checkpoint_every_s=1"], logdir).start()
    try:
        c.wait(timeout=180)
    finally:
        c.stop()
    newest, _ = newest_checkpoint_frames(logdir)
    data = glob.glob(newest + ".data-*")[0]
    size = os.path.getsize(data)
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    c2 = LocalCluster(2, base, ["--mode=train_w_load", "--load_model_url=" + logdir,
                                "--total_environment_frames=40000"], logdir).start()
    try:
        code = c2.wait(timeout=180)
    finally:
        c2.stop()
    text = common.log_text(logdir)
    warned = "is unreadable" in text
    m = re.search(r"resumed from (\S+) at (\d+) frames", text)
    return {"fault": "newest checkpoint's data file truncated", "detected_s": 0.0,
            "what_happened": "train_w_load warned '%s is unreadable' and resumed from %s (exit %s)"
                             % (os.path.basename(newest), os.path.basename(m.group(1)) if m else "?", code),
            "lost": "the frames between the two newest checkpoints", "ok": bool(warned and m and code == 0)}


def scenario_partial_accept(base, work):
    logdir = os.path.join(work, "partial_accept")
    c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=30000", "--queue_capacity=8",
                                       "--envs_per_actor=12", "--actor_enqueue_backstop_s=0.05"], logdir).start()
    try:
        code = c.wait(timeout=240)
    finally:
        c.stop()
    summary = json.load(open(os.path.join(logdir, "summary.json")))
    resent = sum(int(m) for i in range(2) for m in re.findall(r"(\d+) enqueue\(s\) sent again",
                                                                common.log_text(logdir, "actor_%d.log" % i)))
    dropped = summary.get("repeated_unrolls_dropped", 0)
    return {"fault": "duplicate send: a partial accept, then the whole enqueue sent again (12 unrolls per enqueue, queue of 8, "
                     "0.05 s backstop)", "detected_s": 0.0,
            "what_happened": "actors sent %d enqueues again after the backstop cancelled them (some after the queue "
                             "had taken part); the learner dropped %d repeated unrolls by their numbers and stopped "
                             "at %d frames for a 30000 budget (exit %s)"
                             % (resent, dropped, summary["frames"], code),
            "lost": "nothing; the repeats were dropped before training (unroll-by-unroll count: "
                    "tests/test_transport.py)", "ok": bool(code == 0 and resent > 0 and dropped > 0)}


def scenario_resume_fallback_replay(base, work):
    logdir = os.path.join(work, "fallback_replay")
    replay = json.dumps([{"type": "queue", "capacity": 1, "sample_ratio": 0.5},
                         {"type": "standard", "capacity": 64, "sample_ratio": 0.5}])
    c = LocalCluster(2, base, FLAGS + ["--total_environment_frames=30000", "--checkpoint_every_s=1",
                                       "--replay_parameters=" + replay, "--checkpoint_replay"], logdir).start()
    try:
        c.wait(timeout=180)
    finally:
        c.stop()
    saved = dict(re.findall(r"replay contents of (ckpt-\d+) checkpointed: .*digest (\w+)", common.log_text(logdir)))
    newest, _ = newest_checkpoint_frames(logdir)
    data = glob.glob(newest + ".data-*")[0]
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    c2 = LocalCluster(2, base, ["--mode=train_w_load", "--load_model_url=" + logdir,
                                "--total_environment_frames=40000"], logdir).start()
    try:
        code = c2.wait(timeout=180)
    finally:
        c2.stop()
    text = common.log_text(logdir)
    m = re.search(r"replay state of (ckpt-\d+) restored: \d+ unrolls stored, digest (\w+)", text)
    same = bool(m and saved.get(m.group(1)) == m.group(2))
    warned = os.path.basename(newest) in text and "is unreadable" in text
    return {"fault": "newest checkpoint of a --checkpoint_replay run cut in half", "detected_s": 0.0,
            "what_happened": "the resume skipped %s and restored %s with its own replay buffer (digest %s %s the "
                             "one saved with it; exit %s)" % (os.path.basename(newest), m.group(1) if m else "?",
                                                               m.group(2) if m else "?",
                                                               "equal to" if same else "NOT", code),
            "lost": "the frames between the two newest checkpoints", "ok": bool(warned and same and code == 0)}


SCENARIOS = {"kill_actor": scenario_kill_actor, "kill_learner": scenario_kill_learner,
             "kill_horovod_rank": scenario_kill_horovod_rank, "checkpoint_disk_full": scenario_checkpoint_disk_full,
             "truncated_checkpoint": scenario_truncated_checkpoint, "partial_accept": scenario_partial_accept,
             "resume_fallback_replay": scenario_resume_fallback_replay}


def _merged(rows, path):
    """This invocation's rows, with the earlier rows of the scenarios not run this time (--only)."""
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            for r in csv.DictReader(f):
                old[r["scenario"]] = dict(r, ok=r["ok"] == "True", detected_s=float(r["detected_s"]),
                                          seconds=float(r["seconds"]))
    new = {r["scenario"]: r for r in rows}
    return [new.get(n) or old[n] for n in SCENARIOS if n in new or n in old]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--base_port", type=int, default=19500)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="faults_")
    rows = []
    try:
        for i, name in enumerate(a.only):
            t0 = time.time()
            try:
                r = SCENARIOS[name](a.base_port + 10 * i, work)
            except Exception as e:  # a scenario that breaks is a finding, not a crash of the table
                r = {"fault": name, "detected_s": float("nan"), "what_happened": "ERROR: %r" % (e,),
                     "lost": "?", "ok": False}
            r["scenario"], r["seconds"] = name, time.time() - t0
            rows.append(r)
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    rows = _merged(rows, os.path.join(a.out, "faults.csv"))
    with open(os.path.join(a.out, "faults.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["scenario", "fault", "ok", "detected_s", "what_happened", "lost", "seconds"])
        w.writeheader()
        w.writerows(rows)
    lines = ["# Injected faults on a local CartPole cluster (%d cores)" % os.cpu_count(), "",
             "Flags: %s" % " ".join(FLAGS), "",
             "| fault | handled | detected after | what happened | what was lost |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %s |" % (r["fault"], "yes" if r["ok"] else "**no**",
                                                     "-" if r["detected_s"] != r["detected_s"] else "%.1f s" % r["detected_s"],
                                                     r["what_happened"], r["lost"]))
    lines += ["", "Command: `.venv/bin/python bench/faults.py`"]
    common.write_lines(os.path.join(a.out, "faults.md"), lines)
    print("\n".join(lines))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
