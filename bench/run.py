"""The benchmark harness: one command per suite, results under bench/results/<machine>/.

  .venv/bin/python bench/run.py throughput      # Pong frames/s: ours vs SB3 PPO, Sample Factory and RLlib APPO, ceiling
  .venv/bin/python bench/run.py cartpole        # wall-clock to CartPole-v1 475: ours vs SB3 PPO, 3 seeds
  .venv/bin/python bench/run.py scaling         # frames/s vs actor count; learner samples/s vs Horovod ranks
  .venv/bin/python bench/run.py pong_long       # Pong for 10M frames (about 30 min on 2 cores): the curve
  .venv/bin/python bench/run.py pong_long --seeds --peers sf rllib   # the peers' own Pong settings, 70 min each
  .venv/bin/python bench/run.py atari --games BreakoutNoFrameskip-v4 --frames 40000000 --seeds 1   # bench/atari.py
  .venv/bin/python bench/run.py atari_replay --games BreakoutNoFrameskip-v4 --frames 10000000 --seeds 1   # bench/atari_replay.py
  .venv/bin/python bench/run.py mujoco --frames 3000000 --peer_budget_s 1200 --seeds 1 2 3   # bench/mujoco_suite.py

Peers live in their own virtual environments, made by bench/peers/install.sh from the
package registry (Stable-Baselines3, Sample Factory 2.1.1 and RLlib 2.60.0, each with torch
2.13.0 CPU; a peer that fails to install or run gets a note with its error, never a blank).
Every suite writes <suite>.md (a table), <suite>.csv and, where there is a curve,
<suite>.png, plus machine.json (cores, CPU model, GPU, exact versions). Comparisons are ratios of figures measured in the same
invocation; with --repeats > 1 the runs of the contenders are interleaved and the table
gives medians and min-max.
"""
import argparse
import csv
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from local_cluster import LocalCluster, obey_ctrl_c
from bench import atari
from bench import atari_replay
from bench import mujoco_suite
from bench import cartpole_impala
from bench import ceiling
from bench import common
from bench import cpu_split
from bench.peers import RLLIB_PY, SB3_PY, SF_PY, ensure_peer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ------------------------------------------------------------------ machine
def gpu_model():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_dir():
    cores = os.cpu_count()
    gpu = gpu_model()
    slug = re.sub(r"[^a-z0-9]+", "-", common.cpu_model().lower()).strip("-")[:40]
    name = "%dcore-%s%s" % (cores, slug, "-" + re.sub(r"[^a-z0-9]+", "-", gpu.lower()) if gpu else "")
    return os.path.join(HERE, "results", name)


def versions(py):
    code = ("import importlib.metadata as m, json, sys; names=%r; out={'python': sys.version.split()[0]}\n"
            "for n in names:\n  try: out[n]=m.version(n)\n  except Exception: pass\nprint(json.dumps(out))"
            % (["tensorflow-cpu", "tensorflow", "horovod", "dm-sonnet", "gymnasium", "ale-py", "mujoco",
                "numpy", "torch", "stable-baselines3", "sample-factory", "ray"],))
    try:
        return json.loads(subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60).stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def results_dir(out=None):
    """`out` (default bench/results/<machine>/), made, with machine.json written into it:
    (the folder, write_machine's record), for the tables that end with machine_line."""
    out = out or machine_dir()
    os.makedirs(out, exist_ok=True)
    return out, write_machine(out)


def write_machine(out):
    info = {"cores": os.cpu_count(), "cpu": common.cpu_model(), "gpu": gpu_model(), "platform": platform.platform(),
            "ours": versions(sys.executable), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if os.path.exists(SB3_PY):
        info["sb3_peer"] = versions(SB3_PY)
    for key, py in (("sf_peer", SF_PY), ("rllib_peer", RLLIB_PY)):
        if os.path.exists(py):
            info[key] = versions(py)
    path = os.path.join(out, "machine.json")
    if os.path.exists(path):  # a peer not installed now keeps the versions its tables here were made with
        with open(path) as f:
            earlier = json.load(f)
        info.update({k: v for k, v in earlier.items() if k.endswith("_peer") and k not in info})
        info = keep_folders_machine(path, earlier, info)
    with open(path, "w") as f:
        json.dump(info, f, indent=2)
    return info


MACHINE_KEYS = ("cores", "cpu", "gpu")


def keep_folders_machine(path, earlier, info):
    """A folder's results were made on the machine its machine.json names (its name says which);
    a run resumed here from another machine is added under "other_machines" instead of taking the
    folder's record over, so its tables still name the machine most of their rows ran on."""
    def same(a, b):
        return all(a.get(k) == b.get(k) for k in MACHINE_KEYS)
    if "cpu" not in earlier or same(earlier, info):
        if earlier.get("other_machines"):
            info["other_machines"] = earlier["other_machines"]
        return info
    print("[bench] %s describes %s; this machine is %s: recorded under other_machines" % (
        path, earlier["cpu"], info["cpu"]), file=sys.stderr)
    other = {k: info.get(k) for k in MACHINE_KEYS + ("date",)}
    # the date stays the write's own: the tables' "Date:" line says when they were made
    kept = dict(earlier, date=info["date"])
    kept["other_machines"] = [m for m in earlier.get("other_machines", []) if not same(m, other)] + [other]
    return kept


def write_table(out, name, lines, machine):
    """Ends a results table with the command that made it, the machine and the date, writes it to
    <out>/<name>.md and prints it."""
    lines = lines + ["", "Command: `.venv/bin/python %s %s`" % (os.path.relpath(os.path.abspath(sys.argv[0]), ROOT),
                                                             " ".join(sys.argv[1:])),
                     machine_line(machine), "Date: " + machine["date"]]
    common.write_lines(os.path.join(out, name + ".md"), lines)
    print("\n".join(lines))


def machine_line(info):
    """The results tables' last line: the machine and the versions of write_machine's record."""
    return "Machine: %d cores, %s, GPU: %s; TF %s, Horovod %s%s." % (
        info["cores"], info["cpu"], info["gpu"] or "none",
        info["ours"].get("tensorflow-cpu") or info["ours"].get("tensorflow"), info["ours"].get("horovod"),
        ", SB3 %s + torch %s" % (info["sb3_peer"].get("stable-baselines3"), info["sb3_peer"].get("torch"))
        if info.get("sb3_peer") else "") + "".join(
        " Part of it ran on %d cores, %s (%s)." % (m["cores"], m["cpu"], m["date"]) for m in info.get("other_machines", []))


# ------------------------------------------------------------------ contenders
def impala_fps(level, agent, actors, envs_per_actor, seconds, base_port, extra=()):
    """Median end-to-end frames/s of our IMPALA (1 learner + actors) after 20 s of warm-up."""
    logdir = tempfile.mkdtemp(prefix="bench_impala_")
    flags = ["--level_name=" + level, "--agent_name=" + agent, "--batch_size=32", "--unroll_length=20",
             "--envs_per_actor=%d" % envs_per_actor, "--queue_capacity=64", "--log_every_s=5",
             "--total_environment_frames=1000000000", "--entropy_cost=0.01", "--learning_rate=0.0006"]
    cluster = LocalCluster(actors, base_port, flags + list(extra), logdir)
    cluster.start()
    roles = {"learner": [cluster.learner.pid], "actors": [p.pid for p in cluster.actor_procs]}
    try:
        time.sleep(20)
        before = cpu_split.snapshot(roles)
        time.sleep(seconds)
        shares = cpu_split.split(before, cpu_split.snapshot(roles))
    finally:
        cluster.stop()
    rows, summary, log = common.finished_run(logdir)
    fps = [float(r["fps"]) for r in rows if float(r["time_s"]) >= 20]
    if not fps:
        raise RuntimeError("IMPALA produced no progress lines after 20 s; the learner's log ends:\n"
                           + (log[-1500:] or "(no learner log)"))
    return statistics.median(fps), dict((summary or {}).get("time_breakdown", {}), cpu=shares)


def run_peer(py, script, args, timeout):
    """Runs bench/peers/<script> in its venv; (the process, its last JSON line or None)."""
    proc = subprocess.run([py, os.path.join(HERE, "peers", script)] + args, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc, json.loads(lines[-1]) if lines else None


def sb3(args, timeout):
    proc, out = run_peer(SB3_PY, "sb3_ppo.py", args, timeout)
    if proc.returncode != 0 or out is None:
        raise RuntimeError("sb3_ppo.py %s failed: %s" % (" ".join(args), proc.stderr[-2000:]))
    return out


def _peer_or_error(py, script, args, timeout):
    """A peer's JSON line ({"error": ...} included); the peer scripts bound and clean up their own
    runs (SIGINT, then SIGKILL of their process groups), `timeout` is only the backstop."""
    try:
        proc, out = run_peer(py, script, args, timeout)
    except subprocess.TimeoutExpired:
        return {"error": "%s did not return within %.0f s" % (script, timeout)}
    if out is None:
        return {"error": "exit %d: %s" % (proc.returncode, proc.stderr.strip()[-300:])}
    return out


def sample_factory(seconds):
    """Sample Factory 2.1.1 APPO (bench/peers/sf_appo.py in .peer-venv-sf): env frames/s over `seconds`
    after 20 s of training, trained frames/s, or {"error": ...}."""
    return _peer_or_error(SF_PY, "sf_appo.py", ["throughput", "--seconds=%g" % seconds, "--warmup=20"],
                          seconds + 600)


def rllib_appo(seconds):
    """RLlib APPO (bench/peers/rllib_appo.py in .peer-venv-rllib), the same measures, or {"error": ...}."""
    return _peer_or_error(RLLIB_PY, "rllib_appo.py", ["throughput", "--seconds=%g" % seconds, "--warmup=20"],
                          seconds + 600)


def spread(xs):
    return "%.0f (%.0f-%.0f)" % (statistics.median(xs), min(xs), max(xs)) if len(xs) > 1 else "%.0f" % xs[0]


# ------------------------------------------------------------------ suites
# Our throughput configuration: 84x84 frames, the original project's net, IMPALA's single pass per batch.
# Actors: the native vector env (the default backend for Atari), 64 envs each in one group: on 2
# cores three actor processes already overlap env stepping and inference with each other, and an
# inference batch of 64 costs less per frame than two of 32 (actor_layout.md: 1.15-1.25x over
# 3 x 32 in 2 groups). The Python backend is measured beside it as the baseline. The learner on
# one TensorFlow thread: on 2 cores the actors are the bottleneck, and the learner on one thread
# left them a little more CPU (1.04x over 9 pairs, within the spread).
OURS = (3, 64, ["--compute_dtype=auto", "--learner_threads=1", "--env_groups=1"])  # actors, envs each, flags
OURS_3X32 = (3, 32, ["--compute_dtype=auto", "--learner_threads=1"])  # 2 groups of 16 per actor: the layout OURS beat
OURS_PYTHON = (2, 32, ["--env_backend=python", "--env_groups=1"])


# The Sample Factory and RLlib rows: label (with the framework's version), the key of that
# version in the peer's JSON, and the note on the frames/s its learner trained on.
PEER_ROWS = {
    "sf": ("Sample Factory %s APPO (async, PPO clip + GAE), 2 workers x 32 envs, batch 1024, its Atari "
           "wrappers, our net (its convnet_impala + FC 256)", "sample_factory",
           "Sample Factory: its learner trained on %s frames/s (env frames/s in the row). V-trace is "
           "off: in 2.1.1 it crashes the learner's first iteration (bench/peers/sf_appo.py)."),
    "rllib": ("RLlib %s APPO (new API stack), local learner, 2 EnvRunners x 16 envs, batch 1024, its "
              "Atari wrappers, our convs + FC 256 in each of its 2 heads", "ray",
              "RLlib: its learner trained on %s frames/s (env frames/s sampled in the row; RLlib drops "
              "batches its learner has no room for and counts a batch again each time its circular buffer "
              "reuses it, up to 2 times)."),
}


def measure_throughput(a, level, peer_error, skip):
    """Every contender's frames/s over --repeats interleaved repeats: a dict of lists per contender,
    the peers' trained frames/s and failures, the peers' reports and our learner's time breakdown."""
    m = {"res": {k: [] for k in ("ceiling_python", "ceiling_native", "impala", "impala_3x32", "impala_python",
                                 "sb3_2", "sb3_16", "sf", "rllib")},
         # trained: the frames/s the peers' learners trained on
         "failed": {"sf": [], "rllib": []}, "trained": {"sf": [], "rllib": []},
         "peer_info": {}, "bottleneck": {}}
    res, cores = m["res"], os.cpu_count()
    for rep in range(a.repeats):
        res["ceiling_python"].append(ceiling.python_fps(level, cores, 20))
        res["ceiling_native"].append(ceiling.native_fps(level, cores, 20))
        for key, (actors, envs, extra) in (("impala", OURS), ("impala_3x32", OURS_3X32),
                                           ("impala_python", OURS_PYTHON)):
            fps, breakdown = impala_fps(level, "SimpleConvNetAgent", actors, envs, a.seconds, a.base_port, extra)
            res[key].append(fps)
            if key == "impala":
                m["bottleneck"] = breakdown
        if peer_error is None:
            for key, n_envs in (("sb3_2", 2), ("sb3_16", 16)):
                res[key].append(sb3(["throughput", "--n_envs=%d" % n_envs, "--seconds=%g" % a.seconds],
                                    a.seconds + 300)["frames_per_s"])
        for key, run in (("sf", sample_factory), ("rllib", rllib_appo)):
            if skip[key] is not None:
                continue
            got = run(a.seconds)
            if "error" in got:
                m["failed"][key].append(got["error"])
            else:
                res[key].append(got["frames_per_s"])
                m["trained"][key].append(got["trained_frames_per_s"])
                m["peer_info"][key] = got
        print("repeat %d: %s" % (rep + 1, {k: round(v[-1]) for k, v in res.items() if v}), flush=True)
    return m


def throughput_rows(res, med, limit):
    """The table's rows for the env ceilings and our three layouts: (label, figures, comparison)."""
    return [("env ceiling: %d Python processes stepping envs/factory.py's Pong, random actions" % os.cpu_count(),
             res["ceiling_python"], "%.2f of the limit" % (med["ceiling_python"] / limit)),
            ("**physical limit**: ale-py's native vector env, %d C++ threads, 32 or 64 envs, random actions"
             % os.cpu_count(), res["ceiling_native"], "%.2f of the limit" % (med["ceiling_native"] / limit)),
            ("**ours**: IMPALA, 1 learner + %d actor processes x %d envs, native env backend in one group "
             "(inference on all %d frames at once), the torso's precision timed per process "
             "(--compute_dtype=auto), newest frames sent, the learner on 1 "
             "TensorFlow thread" % (OURS[0], OURS[1], OURS[1]), res["impala"],
             "**%.2f of the limit**" % (med["impala"] / limit)),
            ("ours, %d actor processes x %d envs in 2 groups (inference on %d frames at a time)"
             % (OURS_3X32[0], OURS_3X32[1], OURS_3X32[1] // 2),
             res["impala_3x32"], "%.2f of the limit; ours / this = %.2f" % (
                 med["impala_3x32"] / limit, med["impala"] / med["impala_3x32"])),
            ("ours with the Python env backend, 2 actors, 1 group, float32",
             res["impala_python"],
             "%.2f of the limit; ours / this = %.2f" % (med["impala_python"] / limit,
                                                        med["impala"] / med["impala_python"]))]


def peer_rows_and_notes(a, m, med, peer_error, skip):
    """The peers' rows and the notes under the table."""
    res, rows, notes = m["res"], [], []
    if peer_error is None:
        for key, label in (("sb3_2", "SB3 PPO, SubprocVecEnv 2 processes (same process count)"),
                           ("sb3_16", "SB3 PPO, SubprocVecEnv 16 processes (same env count)")):
            rows.append((label, res[key], "ours / this = **%.2f**" % (med["impala"] / med[key])))
        best = max(med["sb3_2"], med["sb3_16"])
        notes.append("Ours vs the faster SB3 configuration: **%.2f x**." % (med["impala"] / best))
    else:
        notes.append("SB3 PPO: %s" % peer_error)
    for key, name in (("sf", "Sample Factory APPO"), ("rllib", "RLlib APPO")):
        label, version, trained_note = PEER_ROWS[key]
        if res[key]:
            rows.append((label % m["peer_info"][key].get(version, ""), res[key],
                         "ours / this = **%.2f**" % (med["impala"] / med[key])))
            notes.append(trained_note % spread(m["trained"][key]))
        if skip[key] is not None:
            notes.append("%s: %s." % (name, skip[key]))
        elif m["failed"][key]:
            notes.append("%s: installed, but %d of %d run(s) failed; the last: %s." % (
                name, len(m["failed"][key]), a.repeats, m["failed"][key][-1]))
    if res["sf"] or res["rllib"]:
        notes.append("Sample Factory and RLlib step Pong through their own Atari wrappers (84x84 gray, frame skip 4 "
                     "with max-pool, 4-frame stack, noop reset: the same observations), not envs/factory.py; frames = 4 x "
                     "agent steps for them too.")
    return rows, notes


def write_throughput_csv(path, m):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["contender", "repeat", "frames_per_s"])
        for suffix, table in (("", m["res"]), ("_trained", m["trained"])):
            for k, xs in table.items():
                for i, x in enumerate(xs):
                    w.writerow([k + suffix, i, x])


def suite_throughput(a, out):
    level = "PongNoFrameskip-v4"
    peer_error = ensure_peer("sb3")
    # Sample Factory and RLlib: a reason to skip them (install failed, opted out), and the runs that failed
    skip = {"sf": ensure_peer("sf") if not a.no_sample_factory else "not run (--no_sample_factory)",
            "rllib": ensure_peer("rllib") if not a.no_rllib else "not run (--no_rllib)"}
    m = measure_throughput(a, level, peer_error, skip)
    med = {k: statistics.median(v) for k, v in m["res"].items() if v}
    limit = max(med["ceiling_python"], med["ceiling_native"])
    peer_rows, notes = peer_rows_and_notes(a, m, med, peer_error, skip)
    rows = throughput_rows(m["res"], med, limit) + peer_rows
    notes.append(targets_line(med, limit))
    if m["bottleneck"]:
        notes.append(where_time_goes(m["bottleneck"]))
    lines = ["# Throughput: PongNoFrameskip-v4 end-to-end frames/s (training included), %d cores" % os.cpu_count(),
             "", "84x84 gray frames, 4-frame stack, frame skip 4 (frames = 4 x agent steps). Same network size "
             "where the framework lets us (conv 16 8x8/4, conv 32 4x4/2, FC 256). %d repeat(s) of %.0f s, "
             "interleaved; median (min-max). Ratios are to the physical limit, the higher of the two env ceilings."
             % (a.repeats, a.seconds), "",
             "| contender | frames/s | comparison |", "|---|---|---|"]
    lines += ["| %s | %s | %s |" % (label, spread(xs), cmp) for label, xs, cmp in rows]
    lines += [""] + notes + ["", "Command: `.venv/bin/python bench/run.py throughput --seconds %g --repeats %d`"
                             % (a.seconds, a.repeats)]
    write_throughput_csv(os.path.join(out, "throughput.csv"), m)
    return lines


THROUGHPUT_TARGETS = (("the physical limit", None, 0.6), ("Sample Factory APPO", "sf", 1.0),
                      ("RLlib APPO", "rllib", 2.0), ("SB3 PPO (its faster configuration)", "sb3", 5.0))


def targets_line(med, limit):
    """Each target of the throughput suite, met or not, with the measured ratio."""
    parts = []
    for name, key, target in THROUGHPUT_TARGETS:
        if key is None:
            ratio = med["impala"] / limit
        elif key == "sb3":
            ratio = med["impala"] / max(med["sb3_2"], med["sb3_16"]) if "sb3_2" in med else None
        else:
            ratio = med["impala"] / med[key] if key in med else None
        what = "not measured" if ratio is None else "%.2f: %s" % (ratio, "met" if ratio >= target else "**NOT met**")
        parts.append("ours / %s >= %.1f: %s" % (name, target, what))
    return "Targets: " + "; ".join(parts) + "."


def where_time_goes(tb):
    """One sentence from the learner's summary.json time_breakdown: what limits the run."""
    return ("Where time goes (our run): bottleneck %s; the learner learned %.0f%% of the time and waited "
            "for data %.0f%%; actors spent %.0f%% of their time stepping envs (waiting on the env threads), "
            "%.0f%% in inference, %.0f%% in transfer." % (
                tb.get("bottleneck"), 100 * tb.get("learner_learn_s", 0) / max(tb.get("elapsed_s", 1), 1e-9),
                100 * tb.get("learner_wait_s", 0) / max(tb.get("elapsed_s", 1), 1e-9),
                100 * tb.get("actor_env_share", 0), 100 * tb.get("actor_inference_share", 0),
                100 * tb.get("actor_transfer_share", 0))) + (
        " The cores' time over the measured window (CPU seconds / wall seconds / cores): %s."
        % cpu_split.report(tb["cpu"]) if tb.get("cpu") else "")


def suite_cartpole(a, out):
    peer_error = ensure_peer("sb3")
    ours, theirs = [], []
    for seed in a.seeds:
        r, _ = cartpole_impala.run_seed(seed, a.budget_s, 475.0, 4_000_000, a.base_port)
        ours.append(r)
        if peer_error is None:
            theirs.append(sb3(["cartpole", "--seed=%d" % seed, "--budget_s=%g" % a.budget_s],
                              a.budget_s + 300))
        print("seed %d: ours %s | sb3 %s" % (seed, r, theirs[-1] if theirs else peer_error), flush=True)

    def med(rs, key="time_to_threshold_s"):
        t = sorted(r[key] if r["reached"] else float("inf") for r in rs)
        return t[len(t) // 2]

    envs = next(f.split("=")[1] for f in cartpole_impala.FLAGS if f.startswith("--envs_per_actor="))

    def sec(r, key):
        return ("%.1f" % r[key] if r["reached"] else "not reached") if r else "-"
    lines = ["# Time to CartPole-v1 mean return 475 (last 20 episodes), %d cores, budget %.0f s" % (
             os.cpu_count(), a.budget_s), "",
             "Ours: IMPALA MLPAgent, 1 learner + %d actor process(es) x %s envs (bench/cartpole_impala.py "
             "settings). SB3: PPO with rl-zoo's tuned CartPole hyperparameters, 8 envs in one process."
             % (cartpole_impala.NUM_ACTORS, envs),
             "Training seconds: ours from the learner being ready (graph traced) to the progress line "
             "that shows 475, SB3 from `learn()` starting; from launch: from starting the processes "
             "(imports, env and model construction included).", "",
             "| seed | ours: training s | ours: from launch s | ours: frames | SB3 PPO: training s "
             "| SB3 PPO: from launch s | SB3 PPO: steps |", "|---|---|---|---|---|---|---|"]
    for i, seed in enumerate(a.seeds):
        o = ours[i]
        t = theirs[i] if theirs else None
        lines.append("| %d | %s | %s | %d | %s | %s | %s |" % (
            seed, sec(o, "time_to_threshold_s"), sec(o, "from_launch_s"), o["frames_to_threshold"],
            sec(t, "time_to_threshold_s"), sec(t, "from_launch_s"), t["steps"] if t else "-"))
    for key, what in (("time_to_threshold_s", "training"), ("from_launch_s", "from launch")):
        m_ours = med(ours, key)
        m_theirs = med(theirs, key) if theirs else None
        line = "Median %s: ours %s, SB3 PPO %s." % (
            what, "%.1f s" % m_ours if m_ours != float("inf") else "not reached",
            ("%.1f s" % m_theirs if m_theirs != float("inf") else "not reached") if theirs else peer_error)
        if theirs and m_theirs != float("inf") and m_ours != float("inf"):
            line += " Ratio SB3 / ours (> 1: ours is faster): **%.2f**." % (m_theirs / m_ours)
        lines += ["", line]
    lines += ["", "Command: `.venv/bin/python bench/run.py cartpole --seeds %s`" % " ".join(map(str, a.seeds))]
    with open(os.path.join(out, "cartpole.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["contender", "seed", "reached", "time_to_threshold_s", "from_launch_s"])
        for o in ours:
            w.writerow(["impala", o["seed"], o["reached"], o["time_to_threshold_s"], o["from_launch_s"]])
        for t in theirs:
            w.writerow(["sb3_ppo", t["seed"], t["reached"], t["time_to_threshold_s"], t["from_launch_s"]])
    return lines


def suite_scaling(a, out):
    level = "PongNoFrameskip-v4"
    rows = []
    for n in a.actor_counts:
        fps, tb = impala_fps(level, "SimpleConvNetAgent", n, max(8, 64 // n), a.seconds, a.base_port)
        rows.append((n, fps, tb.get("bottleneck", "")))
        print("actors %d: %.0f fps" % (n, fps), flush=True)
    lines = ["# Scaling on %d cores: PongNoFrameskip-v4 frames/s against actor processes" % os.cpu_count(), "",
             "64 envs in all, split over the actors (at least 8 each), 1 learner, %.0f s each." % a.seconds,
             "", "| actors | frames/s | ratio to 1 actor | bottleneck |", "|---|---|---|---|"]
    for n, fps, b in rows:
        lines.append("| %d | %.0f | %.2f | %s |" % (n, fps, fps / rows[0][1], b))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "learner_scaling.py"), "--out", out,
                           "--seconds", str(a.seconds), "--base_port", str(a.base_port + 50)],
                          capture_output=True, text=True)
    lines += ["", "Learner ranks (bench/learner_scaling.py, same actors for each K):", ""]
    if proc.returncode == 0:
        lines += open(os.path.join(out, "learner_scaling.md")).read().splitlines()[2:]
    else:
        lines.append("learner_scaling.py failed: %s" % proc.stderr[-500:])
    with open(os.path.join(out, "scaling.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["actors", "frames_per_s"])
        w.writerows([(n, fps) for n, fps, _ in rows])
    lines += ["", "Command: `.venv/bin/python bench/run.py scaling`"]
    return lines


# The settings of the Pong run that learns (bench/results/2core-amd-epyc/pong_net42_const.md):
# 42x42 frames with the fitted first conv, APPO (4 passes x 4 minibatches, ratio clipped against
# the batch-start policy), constant Adam 5e-4, entropy 0.01.
PONG_SHAPE = ["--actors", "2", "--envs_per_actor", "32", "--batch_size", "32", "--unroll_length", "32"]
PONG_LEARNS = PONG_SHAPE + ["--extra=--flagfile=" + os.path.join(ROOT, "configs", "pong.flags")]  # the Pong recipe


def suite_pong_long(a, out):
    """Time to Pong +18 (mean of the last 20 games), one run per seed, each stopping at +18 or
    at --frames; the table is rebuilt from every pong_long_seed<N>.json in the results folder,
    so seeds can be run in separate invocations."""
    for seed in a.seeds:
        cmd = [sys.executable, os.path.join(HERE, "pong_impala.py"), "--frames", str(a.frames),
               "--seed", str(seed), "--stop_at_return", "18", "--out", out, "--tag", "pong_long_seed%d" % seed,
               "--base_port", str(a.base_port)] + PONG_LEARNS
        proc = subprocess.run(cmd, cwd=ROOT)
        if proc.returncode != 0:
            print("Pong seed %d failed (exit %d)" % (seed, proc.returncode), flush=True)
    for peer in a.peers:
        for seed in a.peer_seeds:
            run_peer_pong(peer, seed, a.peer_budget_s, a.frames, out)
    runs = _saved(out, "pong_long_seed")
    if not runs:
        return ["# Pong long suite: no run finished"]
    lines = ["# Time to PongNoFrameskip-v4 mean return +18 (last 20 games), %d cores" % os.cpu_count(), "",
             "IMPALA/APPO SimpleConvNetAgent at 42x42, 1 learner + 2 actors x 32 envs; each run stops at "
             "+18 or %s frames. Training seconds count from the learner being ready." % _si(a.frames), "",
             "| seed | reached | training s | frames | return at stop | median fps | env ceiling fps | ratio "
             "| bottleneck |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append("| %d | %s | %s | %s | %+.2f | %.0f | %.0f | %.2f | %s |" % (
            r["seed"], "yes" if r["reached"] else "no",
            "%.0f" % r["time_to_threshold_s"] if r["reached"] else "-",
            "%.2fM" % (r["frames_to_threshold"] / 1e6) if r["reached"] else "%.2fM" % (r["frames"] / 1e6),
            r["final_mean_return_20"], r["median_fps"], r["ceiling_fps"], r["ratio"], r["bottleneck"]))
    times = sorted(r["time_to_threshold_s"] if r["reached"] else float("inf") for r in runs)
    median = times[len(times) // 2]
    lines += ["", "Reached +18 in %d of %d seed(s); median time over all of them (a seed that did not reach "
              "counts as slower than any that did): %s." % (
                  sum(r["reached"] for r in runs), len(runs),
                  "%.0f s" % median if median != float("inf") else "not reached"),
        "", "Command: `.venv/bin/python bench/run.py pong_long --seeds %s --frames %d`" % (
            " ".join(str(r["seed"]) for r in runs), a.frames)]
    return lines + peers_pong_table(_saved(out, "pong_long_peer_"))


PEER_PONG = {"sf": (SF_PY, "sf_appo.py", "Sample Factory 2.1.1 APPO"),
             "rllib": (RLLIB_PY, "rllib_appo.py", "RLlib 2.60.0 APPO")}


def run_peer_pong(peer, seed, budget_s, frames, out):
    """A peer's own tuned Pong settings on these cores until its mean return reaches +18, `frames`
    or `budget_s` (bench/peers/<peer>.py pong); saved as pong_long_peer_<peer>_seed<N>.json."""
    py, script, _ = PEER_PONG[peer]
    args = ["pong", "--seed=%d" % seed, "--budget_s=%g" % budget_s, "--frames=%d" % frames]
    install_error = ensure_peer(peer)
    got = {"error": install_error} if install_error else _peer_or_error(py, script, args, budget_s + 900)
    got.update(peer=peer, seed=seed, budget_s=budget_s,
               command="%s bench/peers/%s %s" % (os.path.relpath(py, ROOT), script, " ".join(args)))
    with open(os.path.join(out, "pong_long_peer_%s_seed%d.json" % (peer, seed)), "w") as f:
        json.dump(got, f, indent=1)
    print("peer %s seed %d: %s" % (peer, seed, got), flush=True)


def _saved(out, prefix):
    runs = []
    for name in sorted(os.listdir(out)):
        if name.startswith(prefix) and name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                runs.append(json.load(f))
    return sorted(runs, key=lambda r: (r.get("peer", ""), r["seed"]))


def peers_pong_table(runs):
    """The peers' rows of the pong_long table: their time to +18, or where their budget left them."""
    if not runs:
        return []
    lines = ["", "## Peers on the same cores, their own tuned Pong settings", "",
             "| peer | seed | reached | training s | frames | return | frames/s | net, settings |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        label = PEER_PONG[r["peer"]][2]
        if "error" in r:
            lines.append("| %s | %d | error: %s | - | - | - | - | - |" % (label, r["seed"], r["error"]))
            continue
        reached = r["reached"]
        fps = r["frames"] / r["wall_s"] if r.get("wall_s") else float("nan")
        ret = r.get("return_at_target") if reached else r.get("last_mean_return")
        lines.append("| %s | %d | %s | %s | %.2fM | %s | %.0f | %s; %s |" % (
            label, r["seed"], "yes" if reached else "no (stopped after %.0f s)" % r["wall_s"],
            "%.0f" % r["time_to_target_s"] if reached else "-",
            (r.get("frames_to_target") or r["frames"]) / 1e6 if reached else r["frames"] / 1e6,
            "%+.2f" % ret if ret is not None else "-", fps, r.get("net", ""), r.get("config", "")))
    lines += [""] + ["%s: %s" % (PEER_PONG[r["peer"]][2], r["notes"]) for r in runs if r.get("notes")]
    lines += ["%s seed %d shared the cores: %s." % (PEER_PONG[r["peer"]][2], r["seed"], r["disturbed"])
              for r in runs if r.get("disturbed")]
    lines += ["Frames and return: at +18 where reached, else at the stop; frames/s: over the whole run "
              "(start-up included)."]
    lines += ["", "Peer commands (a run stops at +18, at --frames or at --budget_s): %s" % (
        "; ".join("`%s`" % r["command"] for r in runs if r.get("command")))]
    return lines


def _si(n):
    return "%.0fM" % (n / 1e6) if n >= 1e6 else str(n)


SUITES = {"throughput": suite_throughput, "cartpole": suite_cartpole, "scaling": suite_scaling,
          "pong_long": suite_pong_long, "atari": atari.suite, "atari_replay": atari_replay.suite,
          "mujoco": mujoco_suite.suite}


def main():
    obey_ctrl_c()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--seconds", type=float, default=90, help="measuring time per throughput run")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3],
                   help="pong_long: --seeds with no number only rebuilds the table from the saved runs")
    p.add_argument("--budget_s", type=float, default=300)
    p.add_argument("--actor_counts", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--frames", type=int, default=10_000_000)
    p.add_argument("--games", nargs="*", default=[], help="atari, atari_replay: gymnasium ids, e.g. "
                   "BreakoutNoFrameskip-v4 (none: only rebuild the table from the run folders)")
    p.add_argument("--actors", type=int, default=2, help="atari, atari_replay: actor processes per run")
    p.add_argument("--recipe_extra", type=shlex.split, default=[], help="atari, atari_replay: experiment.py flags "
                   "after the recipe's, in one argument, for a new run and its resumes (e.g. "
                   "--recipe_extra=--num_sgd_iter=2); kept in the run folder "
                   "and shown in the table")
    p.add_argument("--variants", nargs="+", default=list(atari_replay.VARIANTS), choices=list(atari_replay.VARIANTS),
                   help="atari_replay: which variants to run or resume (default all; the table shows every run)")
    p.add_argument("--contenders", nargs="+", default=None, choices=mujoco_suite.CONTENDERS,
                   help="mujoco: which systems to run (default all; the others' finished runs are still read)")
    p.add_argument("--peer_steps", type=int, default=1_000_000, help="mujoco: env steps of each PPO run")
    p.add_argument("--target", type=float, default=None, help="mujoco: the return whose time to reach is timed "
                   "(default: the task's own, bench/mujoco_suite.py TASKS)")
    p.add_argument("--levels", nargs="+", default=["HalfCheetah-v5"], choices=sorted(mujoco_suite.TASKS),
                   help="mujoco: the tasks to run (the table shows every task with finished runs)")
    p.add_argument("--no_sample_factory", action="store_true", help="throughput: leave the Sample Factory peer out")
    p.add_argument("--no_rllib", action="store_true", help="throughput: leave the RLlib peer out")
    p.add_argument("--peers", nargs="*", default=[], choices=sorted(PEER_PONG),
                   help="pong_long: also run these peers' own tuned Pong settings, one run per seed")
    p.add_argument("--peer_seeds", type=int, nargs="+", default=[1], help="pong_long: seeds of the peer runs")
    p.add_argument("--peer_budget_s", type=float, default=4200, help="pong_long, mujoco: time budget of each peer run")
    p.add_argument("--base_port", type=int, default=19100)
    p.add_argument("--out", default=None, help="default bench/results/<machine>/")
    a = p.parse_args()
    out = a.out or machine_dir()
    os.makedirs(out, exist_ok=True)
    stopped = False
    try:
        lines = SUITES[a.suite](a, out)
    except common.Stopped as stop:  # a suite whose runs resume: its table of where they stood
        lines, stopped = stop.lines, True
    except KeyboardInterrupt:  # the clusters have stopped and checkpointed (LocalCluster's exit)
        print("\n[%s] stopped by Ctrl-C; the run folders keep what was written, and the atari, atari_replay "
              "and mujoco suites resume a cut-off run when asked for it again" % a.suite, flush=True)
        return 130
    info = write_machine(out)  # after the suite, which installs the peers whose versions it records
    lines += ["", machine_line(info)]
    path = os.path.join(out, a.suite + ".md")
    common.write_lines(path, lines)
    print("\n".join(lines))
    print("\nwrote %s" % path)
    if stopped:
        print("[%s] stopped by Ctrl-C; the same command resumes the runs cut short" % a.suite, flush=True)
    return 130 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
