"""Sample Factory 2.1.1 APPO on PongNoFrameskip-v4, a peer of bench/run.py (runs in .peer-venv-sf/).

  .peer-venv-sf/bin/python bench/peers/sf_appo.py throughput --seconds 60
  .peer-venv-sf/bin/python bench/peers/sf_appo.py pong --budget_s 3600 --frames 10000000

Runs Sample Factory's own Atari example (sf_examples.atari: its wrappers -- noop reset 30,
frame skip 4 with max-pool, episodic life, FIRE reset, reward clip, 84x84 gray, 4-frame
stack -- and its Atari defaults, parse_atari_args) in a child process group, reads its log,
stops it with SIGINT and kills whatever is left, and prints one JSON line.

throughput: asynchronous APPO (SF's APPO with PPO clipping and GAE -- its default and its
  Atari setting; see below for V-trace) on the CPU with OUR network size: SF's built-in
  `convnet_impala` encoder is conv 16 8x8/4 + conv 32 4x4/2, and `--encoder_conv_mlp_layers
  256` adds the FC 256 (then SF's value and policy heads), so no custom encoder is needed.
  2 rollout workers (one per core, SF pins them) x 32 envs, double-buffered (2 splits of
  16), 1 inference worker, 1 learner (SF gives it 1 torch thread), rollout 32, batch 1024
  (32 trajectories), 1 epoch of 1 minibatch per batch, like our learner's single pass.
  Reports, over the window that starts --warmup seconds after the learner's first finished
  iteration:
    frames_per_s          env frames stepped per second (4 x agent steps; SF's "Samples"
                          counter, which counts every observation its inference worker serves)
    trained_frames_per_s  frames the learner trained on per second (SF's "Total num frames",
                          which already includes the frame skip: summaries_use_frameskip)
pong: SF's tuned Atari settings unchanged except the CPU device and 2 workers x 4 envs
  (sync PPO, GAE, rollout 128, batch 256 x 4 minibatches x 4 epochs, lr 2.5e-4 linear decay,
  Nature CNN `convnet_atari` + FC 512, as in SF's published Atari runs), until SF's mean
  episode return (of whole games: RecordEpisodeStatistics sits outside EpisodicLife) reaches
  --target, or --frames / --budget_s run out; prints seconds to the target.

Why V-trace is off: with `--with_vtrace=True`, Sample Factory 2.1.1's learner raises
AttributeError ('AttrDict' object has no attribute 'advantages', learner.py
_record_summaries: advantages are only put in the batch for GAE) on its first iteration,
which always records summaries. SF's event loop logs the exception and keeps the process
alive, the batch is never released, and in async mode collection stops once
--num_batches_to_accumulate (2) batches wait: about 3K samples, then nothing, with no error
in the exit status. (Even without the crash, V-trace with recurrence=1, the Atari default,
gives all-zero advantages; it needs recurrence == rollout.) Why the throughput run sets
`--decorrelate_envs_on_one_worker=False`: on, SF first steps env i of a worker `rollout * i`
random steps, 32 * (0+...+31) = 15,872 steps per worker at rollout 32, 80-90 s on these 2
shared cores before sampling starts (our trainer does not do it either). Why this runner
ends SF itself (SIGINT to its process group after the window, SIGKILL to whatever is left):
2.1.1's --train_for_seconds never fires (its counter is never advanced).
"""
import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

NET_OURS = "conv 16 8x8/4, conv 32 4x4/2, FC 256 (ours; SF convnet_impala + encoder_conv_mlp_layers 256)"
NET_ATARI = "conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, FC 512 (SF convnet_atari, its Atari default)"


def make_pong(env_name, cfg, env_config, render_mode=None):
    """Sample Factory's own Atari env factory, after registering ale-py's ids: with
    gymnasium 0.29, ale-py 0.9 registers them only when asked, and Sample Factory makes its
    envs in spawned processes, where nothing of the parent's registry survives."""
    import ale_py.registration
    import gymnasium
    if "PongNoFrameskip-v4" not in gymnasium.registry:
        ale_py.registration.register_v0_v4_envs()
    from sf_examples.atari.atari_utils import make_atari_env
    return make_atari_env(env_name, cfg, env_config, render_mode)


def train(argv):
    """Sample Factory's train_atari main, with make_pong as the env factory."""
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl
    from sf_examples.atari.train_atari import parse_atari_args
    register_env("atari_pong", make_pong)
    return run_rl(parse_atari_args(argv))


THROUGHPUT_FLAGS = [
    "--device=cpu", "--async_rl=True", "--with_vtrace=False",
    "--rollout=32", "--batch_size=1024", "--num_batches_per_epoch=1", "--num_epochs=1",
    "--encoder_conv_architecture=convnet_impala", "--encoder_conv_mlp_layers", "256",
    "--decorrelate_envs_on_one_worker=False", "--worker_num_splits=2",
    "--learning_rate=0.0006", "--lr_schedule=constant"]
PONG_FLAGS = ["--device=cpu", "--num_workers=2", "--train_for_env_steps=10000000000"]

TS = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]"
FPS_RE = re.compile(TS + r".*Fps is \(10 sec: ([\d.]+|nan), 60 sec: [\d.na]+, 300 sec: [\d.na]+\)\. "
                    r"Total num frames: (\d+)\. .*Samples: (\d+)\.")
REWARD_RE = re.compile(TS + r".*Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def stamp(s):
    return datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Child:
    """Sample Factory in its own process group; its log read line by line in a thread."""

    def __init__(self, flags, train_dir, log=None):
        self.log = log
        cmd = [sys.executable, os.path.abspath(__file__), "--_train", "--env=atari_pong", "--experiment=peer",
               "--train_dir=" + train_dir, "--with_wandb=False", "--save_every_sec=100000000",
               "--save_best_every_sec=100000000", "--keep_checkpoints=1", "--experiment_summaries_interval=10",
               "--heartbeat_reporting_interval=600"] + flags
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env=env, bufsize=1)
        self.lines, self.reports, self.rewards = [], [], []  # reports: (t, trained frames, samples)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            line = ANSI.sub("", line.rstrip("\n"))
            self.lines.append(line)
            m = FPS_RE.search(line)
            if m:
                self.reports.append((stamp(m.group(1)), int(m.group(3)), int(m.group(4))))
            m = REWARD_RE.search(line)
            if m:
                self.rewards.append((stamp(m.group(1)), float(m.group(2))))

    def first_trained(self):
        return next((t for t, f, _ in self.reports if f > 0), None)

    def stop(self, grace=30):
        """SIGINT to the group (SF's runner stops its components on it), then SIGKILL to what is left."""
        how = "exited by itself"
        if self.proc.poll() is None:
            how = "SIGINT"
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                how = "SIGINT, then SIGKILL after %d s" % grace
        try:  # stragglers: SF's workers share the group and ignore SIGINT themselves
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.thread.join(10)
        if self.log:
            with open(self.log, "w") as f:
                f.write("\n".join(self.lines) + "\n")
        return how


def emit(out, code=0):
    """Prints the result as bench/run.py reads it (one JSON line, with SF's and torch's versions); `code`."""
    out.update(sample_factory=md.version("sample-factory"), torch=md.version("torch"))
    print(json.dumps(out), flush=True)
    return code


def error(msg, child, wall, what):
    tail = "\n".join(child.lines[-60:])
    print(tail, file=sys.stderr)
    samples = child.reports[-1][2] if child.reports else 0
    return emit({"peer": "sample_factory_appo", "error": "%s (after %.0f s, %d samples collected, exit %s; tried: %s)"
                 % (msg, wall, samples, child.proc.returncode, what)}, 1)


def run_until(flags, prefix, log, check):
    """Runs Sample Factory with `flags` in a fresh train dir, asking check(child, t0) every second
    until it answers something other than None; then stops SF and removes the dir. Returns
    (child, check's answer, None where that was "" or False: a stop with nothing to report,
    how SF stopped, wall seconds, launch time)."""
    train_dir = tempfile.mkdtemp(prefix=prefix)
    t0 = time.time()
    child = Child(flags, train_dir, log)
    answer = None
    try:
        while answer is None:
            time.sleep(1)
            answer = check(child, t0)
    finally:
        how = child.stop()
        wall = time.time() - t0
        shutil.rmtree(train_dir, ignore_errors=True)
    return child, answer or None, how, wall, t0


def _throughput_window(a):
    """check() of the throughput run: "" once the reports after the warm-up span the window,
    a reason when the run cannot give one, None to go on."""
    def check(child, t0):
        now, first = time.time(), child.first_trained()
        if child.proc.poll() is not None:
            return "Sample Factory exited before the end of the window"
        if first is None:
            if now - t0 > a.start_limit:
                return "its learner finished no training iteration within %.0f s of launch" % a.start_limit
            return None
        window = [r for r in child.reports if r[0] >= first + a.warmup]  # reports come every 5 s
        if len(window) >= 2 and window[-1][0] - window[0][0] >= a.seconds - 0.5:
            return ""
        if now > first + a.warmup + a.seconds + 60:
            return "its progress reports stopped"
        return None
    return check


def throughput(a):
    flags = THROUGHPUT_FLAGS + ["--num_workers=%d" % a.workers, "--num_envs_per_worker=%d" % a.envs_per_worker]
    child, why, how, wall, t0 = run_until(flags, "sf_peer_", a.log, _throughput_window(a))
    what = "async APPO (PPO clip + GAE; V-trace crashes 2.1.1's learner), rollout 32, batch 1024, %d workers x %d envs, convnet_impala + FC 256" % (
        a.workers, a.envs_per_worker)
    first = child.first_trained()
    if why is not None and first is None:
        return error(why, child, wall, what)
    window = [r for r in child.reports if r[0] >= first + a.warmup]
    if len(window) < 2:
        return error("fewer than 2 progress reports after the warm-up", child, wall, what)
    (t1, f1, s1), (t2, f2, s2) = window[0], window[-1]
    final = re.findall(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)", "\n".join(child.lines))
    out = {"peer": "sample_factory_appo", "suite": "throughput", "level": "PongNoFrameskip-v4",
           "frames_per_s": 4 * (s2 - s1) / (t2 - t1), "trained_frames_per_s": (f2 - f1) / (t2 - t1),
           "window_s": t2 - t1, "warmup_s": a.warmup, "startup_s": first - t0,
           "samples": s2, "trained_frames": f2, "wall_s": wall, "stopped_by": how,
           "final_trained_fps_incl_startup": float(final[-1][1]) if final else None,
           "workers": a.workers, "envs_per_worker": a.envs_per_worker, "net": NET_OURS,
           "config": what + ", 1 inference worker, 1 learner thread, CPU",
           "notes": "SF's own Atari wrappers (84x84 gray, stack 4, frame skip 4, episodic life, noop 30); "
                    "frames = 4 x agent steps; learner lr 6e-4 constant"}
    if why is not None:
        out["notes"] += "; " + why
    return emit(out)


def _pong_end(a):
    """check() of the Pong run: the hit (t, return, frames) once the target is reached, False at
    the frame or time budget or when SF exits, None to go on."""
    def check(child, t0):
        if child.proc.poll() is not None:
            return False
        # "Avg episode reward" is SF's mean over its last stats_avg (=100) episodes; the
        # mean of the last 20 is not in its log, so the 100-episode mean is the (stricter) test.
        frames = child.reports[-1][1] if child.reports else 0
        if child.rewards and child.rewards[-1][1] >= a.target:
            return child.rewards[-1] + (frames,)
        if frames >= a.frames or time.time() - t0 > a.budget_s:
            return False
        return None
    return check


def pong(a):
    flags = PONG_FLAGS + ["--num_envs_per_worker=%d" % a.envs_per_worker, "--seed=%d" % a.seed]
    child, hit, how, wall, t0 = run_until(flags, "sf_peer_pong_", a.log, _pong_end(a))
    first = child.first_trained()
    if first is None:
        return error("no training iteration finished", child, wall, "SF Atari defaults, CPU, 2 workers")
    out = {"peer": "sample_factory_appo", "suite": "pong", "seed": a.seed, "target": a.target,
           "reached": hit is not None,
           "time_to_target_s": hit[0] - first if hit else float("nan"),
           "from_launch_s": hit[0] - t0 if hit else float("nan"),
           "frames_to_target": hit[2] if hit else None, "return_at_target": hit[1] if hit else None,
           # at the stop, which SF keeps logging through (up to 30 s after the SIGINT)
           "frames": child.reports[-1][1] if child.reports else 0,
           "last_mean_return": child.rewards[-1][1] if child.rewards else None,
           "wall_s": wall, "stopped_by": how, "net": NET_ATARI,
           # the learning curve, as SF logs it: (seconds from launch, mean return) per reward line
           # and (seconds from launch, frames trained) per report line
           "curve": {"return": [(round(t - t0, 1), r) for t, r in child.rewards],
                     "trained_frames": [(round(t - t0, 1), f) for t, f, _ in child.reports]},
           "config": "SF's tuned Atari settings (sf_examples/atari/atari_params.py), CPU, 2 workers x %d envs"
                     % a.envs_per_worker,
           "notes": "return = SF's 'Avg episode reward' (mean of its last 100 whole-game episodes, as its "
                    "sampler summed them: each env's first one is partial, begun during start-up decorrelation); "
                    "training seconds from the learner's first finished iteration"}
    return emit(out)


def main():
    if "--_train" in sys.argv:
        return train([x for x in sys.argv[1:] if x != "--_train"])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("suite", nargs="?", default="throughput", choices=["throughput", "pong"])
    p.add_argument("--seconds", type=float, default=60, help="throughput: measuring window")
    p.add_argument("--warmup", type=float, default=20, help="throughput: seconds after the first training "
                                                             "iteration before the window opens")
    p.add_argument("--start_limit", type=float, default=240, help="give up if no training iteration by then")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs_per_worker", type=int, default=None, help="default 32 (throughput), 4 (pong: "
                   "SF's sync mode needs 2 x envs x rollout 128 to divide its 1024-sample iteration)")
    p.add_argument("--target", type=float, default=18)
    p.add_argument("--frames", type=int, default=10_000_000)
    p.add_argument("--budget_s", type=float, default=7200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", default=None, help="also write Sample Factory's whole log here")
    a = p.parse_args()
    if a.envs_per_worker is None:
        a.envs_per_worker = 32 if a.suite == "throughput" else 4
    return throughput(a) if a.suite == "throughput" else pong(a)


if __name__ == "__main__":
    sys.exit(main())
