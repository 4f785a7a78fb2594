"""Learner ranks lost mid-run, on network-namespace hosts: how long the frontend's watch takes to
have the learners training again, how many frames each restart loses, and the run's end against
an unbroken twin, with 2 and with 3 learner ranks.

  .venv/bin/python bench/learner_loss.py                       # about an hour on 2 cores (needs root)
  .venv/bin/python bench/learner_loss.py --ranks 2 --frames 900000   # about 15 minutes

K learner hosts (h1..hK, rank r on h<r+1>) and one more host; four actors, one on each of h1, h2
and two on the last host (K=2), or one on each of h1..h4 (K=3). CartPole with configs/cartpole.flags'
learning settings and a linear learning-rate decay (so the schedule shows whether the frame counter
stays continuous), started with `run_experiment_mm_raw.py --follow` and the watch's defaults but
--learner_host_lost_s (20 s here). The broken run, in order:
  1. at 1/6 of the frames: kill -9 of the last rank (mpirun ends the job; restart with K ranks);
  2. at 1/3: the last learner host loses its link (the ranks wait in an allreduce; after
     --learner_host_lost_s the job restarts with K-1 ranks);
  3. --heal_after_s later the link is back (the stale rank is ended, the learners are interrupted,
     they write a checkpoint and the job grows back to K ranks).
"Training again" is rank 0's first progress line after it resumed; "frames lost" is the last
metrics row before the fault minus the frames the restart resumed at (rows are --log_every_s
apart, so the true loss is up to one row's frames more). The unbroken run is the same command
without faults, run next on the same rig.

Writes bench/results/<machine>/learner_loss.md (and each run's metrics.csv beside it).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

from bench import common
from bench import host_loss
from bench import run as harness
from tests import netns_fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_csv(rig, path, ranks):
    key = rig.client_key
    hosts = rig.hosts
    actor_hosts = [hosts[0], hosts[1], hosts[-1], hosts[-1]] if ranks == 2 else hosts[:4]
    rows = ["job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password,ssh_key_file"]
    rows += [f"learner,{h.ip},{8001 + r},,22,root,,{key}" for r, h in enumerate(hosts[:ranks])]
    rows += [f"actor,{h.ip},{9001 + i},,22,root,,{key}" for i, h in enumerate(actor_hosts)]
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


def _rows(logdir):
    path = os.path.join(logdir, "metrics.csv")
    return common.read_csv(path) if os.path.exists(path) else []


def _frames(logdir):
    rows = _rows(logdir)
    return float(rows[-1]["frames"]) if rows else 0.0


def _resumed(logdir, n):
    """The frames rank 0 resumed at the n-th time, once it has printed a progress line since; else None."""
    log = common.log_text(logdir, "learner_0.log")
    found = re.findall(r"\] resumed from \S+ at (\d+) frames", log)
    if len(found) >= n and "[learner 0] frames " in log.split("] resumed from ")[n]:
        return int(found[n - 1])
    return None


def _wait(predicate, timeout, what, logdir):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if "frame budget reached" in common.log_text(logdir, "learners.log"):
            raise RuntimeError(f"the run reached its frame budget before {what}: give it more --frames")
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def _faults(rig, logdir, ranks, frames, heal_after_s, events):
    """The three faults in order; each event: (name, seconds to training again, frames before, resumed at)."""
    last = rig.hosts[ranks - 1]

    def fault(n, name, act, after_frames):
        _wait(lambda: _frames(logdir) >= after_frames, 1200, f"{after_frames:,.0f} frames", logdir)
        before = _frames(logdir)
        t = time.time()
        act()
        print(f"  {time.strftime('%H:%M:%S')} {name}", flush=True)
        at = _wait(lambda: _resumed(logdir, n), 300, f"training again after: {name}", logdir)
        events.append((name, time.time() - t, before, at))
        print(f"  training again {events[-1][1]:.0f} s after it; {before:,.0f} frames in the last row before, "
              f"resumed at {at:,}", flush=True)

    def kill_rank():
        pid = next(int(line.split(None, 1)[0]) for line in last.ssh("ps -e -o pid=,args=", check=True).stdout.splitlines()
                   if "--job_name=learner" in line and "python" in line.split(None, 2)[1])
        last.ssh(f"kill -9 {pid}", check=True)

    fault(1, f"kill -9 of rank {ranks - 1}", kill_rank, frames / 6)
    fault(2, f"h{ranks} cut off", last.cut, frames / 3)
    time.sleep(heal_after_s)  # the host stays away this long after the job ran without it
    fault(3, f"h{ranks} back", last.heal, 0)


def one_run(rig, work, out_dir, name, ranks, args, faults):
    tag = uuid.uuid4().hex[:6]
    logdir, csv = os.path.join(work, name), os.path.join(work, f"{name}.csv")
    write_csv(rig, csv, ranks)
    argv = host_loss.frontend_argv(rig, csv, logdir, tag, args.frames) + [
        "--learning_rate_decay=linear", f"--checkpoint_every_s={args.checkpoint_every_s:g}",
        f"--learner_host_lost_s={args.learner_host_lost_s:g}"]
    out, events = [], []
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
    reader.start()
    t0 = time.time()
    try:
        if faults:
            _faults(rig, logdir, ranks, args.frames, args.heal_after_s, events)
        p.wait(timeout=2400)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=120)
        rig.hosts[ranks - 1].heal()
        subprocess.run(["tmux", "-L", f"hl_{tag}", "kill-server"], capture_output=True)
    reader.join(timeout=10)
    rows = _rows(logdir)
    if not rows:
        raise RuntimeError(f"{name} run wrote no metrics; its frontend said:\n{''.join(out)[-3000:]}")
    shutil.copy(os.path.join(logdir, "metrics.csv"), os.path.join(out_dir, f"learner_loss_{name}_metrics.csv"))
    frames = [float(r["frames"]) for r in rows]
    return {"name": name, "ranks": ranks, "rc": p.returncode, "rows": rows, "events": events, "out": "".join(out),
            "wall_s": time.time() - t0, "monotonic": frames == sorted(frames)}


def table(runs, args, info):
    lines = [f"# Learner ranks lost mid-run: {info['cores']} cores, {info['cpu']}", "",
             f"Network-namespace hosts, K learner ranks (one per host) and four actors; "
             f"[configs/cartpole.flags](../../../configs/cartpole.flags) with `--learning_rate_decay=linear` at "
             f"{args.frames:,} frames, checkpoints every {args.checkpoint_every_s:g} s, "
             f"`run_experiment_mm_raw.py --follow` with `--learner_host_lost_s={args.learner_host_lost_s:g}`. "
             f"See bench/learner_loss.py for the faults and what each column counts.", "",
             "| run | fault | to training again | frames at the fault (last row) | resumed at | frames lost |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        for name, secs, before, at in r["events"]:
            lines.append(f"| {r['name']} | {name} | {secs:.0f} s | {before:,.0f} | {at:,} | {max(0, before - at):,.0f} |")
    lines += ["", "| run | final frames | mean return (last 20) | learning rate at the end | frames never step back | "
                  "wall time | exit |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        last = r["rows"][-1]
        lines.append(f"| {r['name']} | {float(last['frames']):,.0f} | {float(last['mean_return_20']):.1f} | "
                     f"{float(last['learning_rate']):.2e} | {'yes' if r['monotonic'] else 'NO'} | "
                     f"{r['wall_s']:.0f} s | {r['rc']} |")
    said = [line for r in runs for line in r["out"].splitlines() if line.startswith("[watch") and
            any(w in line for w in ("learner", "answers again"))]
    lines += ["", "The watch's lines about the learners in the broken runs:", "", "```", *said, "```", "",
              "Command: `.venv/bin/python " + " ".join(["bench/learner_loss.py"] + sys.argv[1:]) + "`", "",
              harness.machine_line(info), "Date: " + info["date"]]
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 3], choices=[2, 3])
    p.add_argument("--frames", type=int, default=1_500_000)
    p.add_argument("--checkpoint_every_s", type=float, default=10.0)
    p.add_argument("--learner_host_lost_s", type=float, default=20.0)
    p.add_argument("--heal_after_s", type=float, default=30.0)
    p.add_argument("--out", default=None, help="result folder (default bench/results/<machine>)")
    args = p.parse_args()
    reason = netns_fixture.available()
    if reason:
        sys.exit(f"bench/learner_loss.py: {reason}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` too takes the rig down
    out, info = harness.results_dir(args.out)
    runs = []
    for ranks in args.ranks:
        work = f"/var/tmp/impala_learner_loss_{uuid.uuid4().hex[:6]}"  # shared by the hosts, as an NFS home
        rig = netns_fixture.Hosts(max(ranks + 1, 4 if ranks == 3 else 3), os.path.join(work, "rig"))
        try:
            rig.start()
            for name, faults in ((f"{ranks} ranks, faults", True), (f"{ranks} ranks, unbroken", False)):
                print(f"{name} ...", flush=True)
                runs.append(one_run(rig, work, out, name.replace(" ", "_").replace(",", ""), ranks, args, faults))
                runs[-1]["name"] = name
                # after every run: a long invocation stopped part-way keeps what it measured
                common.write_lines(os.path.join(out, "learner_loss.md"), table(runs, args, info))
        finally:
            rig.stop()
            shutil.rmtree(work, ignore_errors=True)
    lines = table(runs, args, info)
    common.write_lines(os.path.join(out, "learner_loss.md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
