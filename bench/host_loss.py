"""An actor host cut off mid-run, on network-namespace hosts: how fast the frontend's watch
moves its actors, how far frames/s dips and when it is back, and the run's end against an
unbroken twin.

  .venv/bin/python bench/host_loss.py                  # about 12 minutes on 2 cores (needs root)
  .venv/bin/python bench/host_loss.py --frames 600000 --cut_at_s 40

Four hosts (tests/netns_fixture.py): the learner on h1, one actor on each of h2, h3 and h4,
CartPole with configs/cartpole.flags' learning settings, started with
`run_experiment_mm_raw.py --follow` and the watch's defaults (--watch_interval_s,
--actor_host_lost_s, --ssh_timeout_s). The cut run takes h4 off the network (its link goes
down, its processes keep running: a failed switch port) --cut_at_s seconds after the learner's
first metrics row, and brings it back --heal_after_s later. The unbroken run is the same
command without the cut, run next on the same rig (one of each: the cut run's frames/s before
the cut is its own baseline). Frames/s is metrics.csv's, per --log_every_s.

Writes bench/results/<machine>/host_loss.md.
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
from bench import run as harness
from tests import netns_fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRONTEND = os.path.join(ROOT, "run_experiment_mm_raw.py")
RECIPE = os.path.join(ROOT, "configs", "cartpole.flags")


def write_csv(rig, path):
    key = rig.client_key
    h1, *actor_hosts = rig.hosts
    rows = ["job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password,ssh_key_file",
            f"learner,{h1.ip},8001,,22,root,,{key}"]
    rows += [f"actor,{h.ip},{9001 + i},,22,root,,{key}" for i, h in enumerate(actor_hosts)]
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


def frontend_argv(rig, csv, logdir, tag, frames):
    return [sys.executable, FRONTEND, f"--workers_csv_path={csv}", f"--tmux_socket=hl_{tag}", f"--tmux_sess=hl_{tag}",
            f"--logdir={logdir}", f"--ssh_known_hosts={rig.known_hosts}", "--follow",
            f"--mpi_args=-mca oob_tcp_if_include {rig.subnet} -mca btl_tcp_if_include {rig.subnet}",
            f"--flagfile={RECIPE}", f"--total_environment_frames={frames}", "--log_every_s=2",
            "--checkpoint_every_s=600"]


def one_run(rig, work, out_dir, name, frames, cut_at_s=None, heal_after_s=None):
    """One --follow run to its frame budget; with cut_at_s, h4 is cut that long after the first
    metrics row. -> dict of the run's figures and its watch lines."""
    tag = uuid.uuid4().hex[:6]
    logdir, csv = os.path.join(work, name), os.path.join(work, f"{name}.csv")
    write_csv(rig, csv)
    out, events = [], {}
    p = subprocess.Popen(frontend_argv(rig, csv, logdir, tag, frames), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
    reader.start()
    try:
        if cut_at_s is not None:
            _cut_and_heal(rig, logdir, cut_at_s, heal_after_s, events)
        p.wait(timeout=1800)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=120)
        rig.hosts[-1].heal()
        subprocess.run(["tmux", "-L", f"hl_{tag}", "kill-server"], capture_output=True)
    reader.join(timeout=10)
    rows = common.read_csv(os.path.join(logdir, "metrics.csv"))
    if not rows:
        raise RuntimeError(f"{name} run wrote no metrics; its frontend said:\n{''.join(out)[-3000:]}")
    # the curve stays with the table (the run folder goes with the rig)
    shutil.copy(os.path.join(logdir, "metrics.csv"), os.path.join(out_dir, f"host_loss_{name}_metrics.csv"))
    return {"name": name, "rc": p.returncode, "rows": rows, "events": events, "out": "".join(out),
            "moved_at": _watch_time(out, "moved from"), "lost_at": _watch_time(out, "actor host lost")}


def _cut_and_heal(rig, logdir, cut_at_s, heal_after_s, events):
    metrics = os.path.join(logdir, "metrics.csv")
    deadline = time.time() + 300
    while not (os.path.exists(metrics) and common.read_csv(metrics)):
        if time.time() > deadline:
            raise RuntimeError(f"no metrics row in {metrics} after 300 s")
        time.sleep(0.2)
    # metrics.csv's time_s counts from the learner's start: its first row, seen now, pins that start
    events["learner_start"] = time.time() - float(common.read_csv(metrics)[0]["time_s"])
    time.sleep(cut_at_s)
    rig.hosts[-1].cut()
    events["cut"] = time.time()
    print(f"  cut h4 at {time.strftime('%H:%M:%S')}", flush=True)
    time.sleep(heal_after_s)
    rig.hosts[-1].heal()
    events["heal"] = time.time()
    print(f"  h4 back at {time.strftime('%H:%M:%S')}", flush=True)


def _watch_time(lines, words):
    """The clock time (epoch seconds, today) of the first [watch HH:MM:SS] line holding words."""
    for line in lines:
        m = re.match(r"\[watch (\d\d):(\d\d):(\d\d)\]", line)
        if m and words in line:
            t = time.localtime()
            return time.mktime(t[:3] + tuple(int(x) for x in m.groups()) + t[6:])
    return None


def recovery(run, n_hosts):
    """Frames/s over the 20 s before the cut, the lowest row after it, and the seconds from the
    cut to the first row after the move back at (n-1)/n of the frames/s before."""
    ev = run["events"]
    at = [(ev["learner_start"] + float(r["time_s"]) - ev["cut"], float(r["fps"])) for r in run["rows"]]
    before = [fps for s, fps in at if -20 <= s < 0]
    base = sum(before) / max(1, len(before))
    after = [(s, fps) for s, fps in at if s >= 0]
    low = min((fps for _, fps in after), default=float("nan"))
    moved = (run["moved_at"] - ev["cut"]) if run["moved_at"] else float("inf")
    back = next((s for s, fps in after if s >= moved and fps >= base * (n_hosts - 1) / n_hosts), None)
    return base, low, back, moved


def final(run):
    rows = run["rows"]
    return int(rows[-1]["frames"]), float(rows[-1]["mean_return_20"]), float(rows[-1]["time_s"])


def table(runs, args, n_hosts, info):
    lines = [f"# An actor host cut mid-run: {info['cores']} cores, {info['cpu']}", "",
             f"Four network-namespace hosts: the learner on h1, one actor on each of h2-h4; "
             f"[configs/cartpole.flags](../../../configs/cartpole.flags) at {args.frames:,} frames, "
             f"`run_experiment_mm_raw.py --follow` with the watch's defaults. h4 loses its link "
             f"{args.cut_at_s:g} s after the learner's first metrics row and gets it back {args.heal_after_s:g} s "
             f"later; the unbroken run is the same command without the cut.", "",
             "| run | frames/s before (20 s) | lowest after the cut | host lost after | actors moved after | "
             "frames/s back to 2/3 after | final frames | mean return (last 20) | training time | exit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        frames, ret, secs = final(r)
        if "cut" in r["events"]:
            base, low, back, moved = recovery(r, n_hosts)
            lost = r["lost_at"] - r["events"]["cut"] if r["lost_at"] else float("nan")
            cells = [f"{base:,.0f}", f"{low:,.0f}", f"{lost:.0f} s", f"{moved:.0f} s",
                     f"{back:.0f} s" if back is not None else "not back"]
        else:
            cells = ["", "", "", "", ""]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {frames:,} | {ret:.1f} | {secs:.0f} s | {r['rc']} |")
    moved_lines = [line for r in runs for line in r["out"].splitlines() if line.startswith("[watch") and
                   any(w in line for w in ("lost", "moved", "answers again", "stale"))]
    lines += ["", "The watch's lines in the cut run:", "", "```", *moved_lines, "```", "",
              "Command: `.venv/bin/python " + " ".join(["bench/host_loss.py"] + sys.argv[1:]) + "`", "",
              harness.machine_line(info), "Date: " + info["date"]]
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=2_500_000)
    p.add_argument("--cut_at_s", type=float, default=30.0)
    p.add_argument("--heal_after_s", type=float, default=60.0)
    p.add_argument("--out", default=None, help="result folder (default bench/results/<machine>)")
    args = p.parse_args()
    reason = netns_fixture.available()
    if reason:
        sys.exit(f"bench/host_loss.py: {reason}")
    out, info = harness.results_dir(args.out)
    work = f"/var/tmp/impala_host_loss_{uuid.uuid4().hex[:6]}"  # shared by the hosts, as an NFS home
    rig = netns_fixture.Hosts(4, os.path.join(work, "rig"))
    runs = []
    try:
        rig.start()
        for name, cut in (("cut", True), ("unbroken", False)):
            print(f"{name} run ...", flush=True)
            runs.append(one_run(rig, work, out, name, args.frames, args.cut_at_s if cut else None, args.heal_after_s))
    finally:
        rig.stop()
        shutil.rmtree(work, ignore_errors=True)
    lines = table(runs, args, 3, info)
    common.write_lines(os.path.join(out, "host_loss.md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
