"""WALL-E's PPO training loop, for either entry point (cli.main() calls train()).

One iteration:
  1. params = agent.params(): policy weights + observation-normaliser stats + version
  2. rollouts = samplers.collect(params, batch_size): exactly -b env steps in all
  3. stats = agent.update(rollouts, params) (agent.py)
  4. one row to <logdir>/progress.csv and TensorBoard (tools/runlog.py), and the console line

until --iterations or the --max_steps budget (both count the whole run, across resumes); then a
checkpoint (walle/checkpoint.py: also every --checkpoint_every_s, at Ctrl-C and when a sampler
fails) and --eval_episodes, if any. --mode=train_w_load continues a run from its newest checkpoint
(or the one --load_model_url names); --mode=test scores a checkpoint's policy.
"""
import contextlib
import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

from tools.runlog import RunLog, format_cell
from walle import checkpoint as checkpoint_lib
from walle import samplers as samplers_lib
from walle.agent import PPO
from walle.config import run_folder, save_flags

RESUME_SEED_STRIDE = 7919  # sampler seeds of a run resumed at iteration i: --seed + stride * i
EVAL_SEED_OFFSET = 10_000  # evaluation episode i's env seed: --seed + offset + i (apart from the samplers')

PROGRESS_FIELDS = [
    "iteration", "steps", "time", "episodes", "return_mean", "return_last10", "episode_length",
    "collect_time", "learn_time", "collect_share", "learn_share", "steps_per_s",
    "kl", "entropy", "beta", "lr_multiplier", "policy_epochs", "clip_fraction",
    "policy_loss", "value_loss", "explained_variance", "version",
]
# TensorBoard tags, as CleanRL's: the x axis is `steps`, so iteration, steps and version
# (iteration - 1) stay in the CSV only.
PROGRESS_TAGS = dict(
    {k: "charts/" + k for k in ("episodes", "return_mean", "return_last10", "episode_length")},
    **{k: "losses/" + k for k in ("kl", "entropy", "beta", "lr_multiplier", "policy_epochs", "clip_fraction",
                                  "policy_loss", "value_loss", "explained_variance")},
    **{k: "perf/" + k for k in ("time", "collect_time", "learn_time", "collect_share", "learn_share",
                                "steps_per_s")})


def progress_line(row):
    """The console line of one iteration."""
    ret = f"{row['return_mean']:9.1f} ({row['episodes']} ep)" if row["episodes"] else f"{'-':>9} (0 ep)"
    return (f"it {row['iteration']:5d} | steps {row['steps']:9d} | return {ret} | last10 "
            f"{format_cell(row['return_last10']) or '-':>8} | collect {row['collect_time']:6.2f}s "
            f"({100 * row['collect_share']:3.0f}%) | learn {row['learn_time']:6.2f}s | kl {row['kl']:.4f} "
            f"| ent {row['entropy']:6.2f} | beta {row['beta']:.3g}")


def iteration_row(stats, rollouts, params, collect_time, learn_time, **counters):
    """The progress row of one iteration: the update's stats, the episodes that ended, timings;
    counters: iteration, steps, time, return_last10."""
    returns = [x for r in rollouts for x in r["episode_returns"]]
    lengths = [x for r in rollouts for x in r["episode_lengths"]]
    collected = sum(len(r["reward"]) for r in rollouts)
    return dict(stats, **counters, episodes=len(returns), version=params["version"],
                return_mean=float(np.mean(returns)) if returns else None,
                episode_length=float(np.mean(lengths)) if lengths else None,
                collect_time=collect_time, learn_time=learn_time,
                collect_share=collect_time / (collect_time + learn_time),
                learn_share=learn_time / (collect_time + learn_time),
                steps_per_s=collected / (collect_time + learn_time))


def run_iterations(args, agent, samplers, rows, progress, checkpointer):
    """Collect -> update -> write a row until --iterations or the --max_steps budget, counting in
    `progress` (the whole run's, across resumes); a checkpoint every --checkpoint_every_s."""
    t_start, base_s, last_save = time.time(), progress.elapsed_s, time.time()
    while progress.iteration < args.iterations:
        if args.max_steps and progress.steps + args.batch_size > args.max_steps:
            break  # the next iteration would go past the step budget
        params = agent.params()
        t0 = time.perf_counter()
        rollouts = samplers.collect(params, args.batch_size)
        t1 = time.perf_counter()
        with whole_update():
            stats = agent.update(rollouts, params, lr_scale=lr_scale(args, progress.steps))
            learn_time = time.perf_counter() - t1
            progress.iteration += 1
            progress.steps += sum(len(r["reward"]) for r in rollouts)
            progress.recent = (progress.recent + [x for r in rollouts for x in r["episode_returns"]])[-10:]
            progress.elapsed_s = base_s + time.time() - t_start
            row = iteration_row(stats, rollouts, params, t1 - t0, learn_time, iteration=progress.iteration,
                                steps=progress.steps, time=progress.elapsed_s,
                                return_last10=float(np.mean(progress.recent)) if progress.recent else None)
            rows.write(row, step=progress.steps)
            if args.checkpoint_every_s and time.time() - last_save >= args.checkpoint_every_s:
                try_checkpoint(checkpointer, progress)
                last_save = time.time()
        if not args.quiet:
            print(progress_line(row), flush=True)


def lr_scale(args, steps_done):
    """--lr_decay linear: the share of the --max_steps budget not yet collected when the batch began,
    as CleanRL anneals by the iterations left (1 at the first batch, 1 batch's share at the last)."""
    if args.lr_decay == "none":
        return 1.0
    return max(0.0, 1.0 - steps_done / args.max_steps)


def write_eval(args, params, steps, logdir, filename="eval.json", **extra):
    """--eval_episodes: the policy's deterministic returns -> <logdir>/<filename>."""
    t0 = time.time()
    returns = samplers_lib.evaluate(args.env_name, params, args.eval_episodes, seed=args.seed + EVAL_SEED_OFFSET)
    result = {"steps": steps, "episodes": len(returns), "return_mean": float(np.mean(returns)),
              "return_std": float(np.std(returns)), "returns": returns, "seconds": time.time() - t0, **extra}
    with open(os.path.join(logdir, filename), "w") as f:
        json.dump(result, f)
    print(f"eval after {steps} steps: mean return {result['return_mean']:.1f} over {len(returns)} "
          f"episodes (policy mean, no noise)", flush=True)


def make_logdir(args):
    """--logdir (or results/ppo_<env>_<unix time>), with the run's flags in flags.txt and flags.json
    (the one --mode=train_w_load reads)."""
    logdir = args.logdir or os.path.join("results", f"ppo_{args.env_name.replace('/', '_')}_{int(time.time())}")
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "flags.txt"), "w") as f:
        f.write("\n".join(f"{k}={v}" for k, v in sorted(vars(args).items())) + "\n")
    save_flags(logdir, args)
    return logdir


_interrupts = {"defer": False, "pending": None}


def _interrupt(signum, frame):
    if _interrupts["defer"]:
        _interrupts["pending"] = signum  # raised once the update under way is whole
        return
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def whole_update(raise_pending=True):
    """SIGINT and SIGTERM wait until the block is done, so an update, its row and a checkpoint are
    written whole: the checkpoint written at Ctrl-C holds the agent at an iteration's end, never
    halfway through one. Collecting stays interruptible (what it gathered is simply dropped)."""
    _interrupts["defer"] = True
    try:
        yield
    finally:
        _interrupts["defer"] = False
    signum, _interrupts["pending"] = _interrupts["pending"], None
    if signum is not None and raise_pending:
        raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def signals_interrupt():
    """SIGTERM and SIGINT raise KeyboardInterrupt while training (outside whole_update), so kill <pid>
    stops the run as cleanly as Ctrl-C; the previous handlers come back afterwards. A process started
    in the background of a non-interactive shell inherits SIGINT as ignored: this makes kill -INT work."""
    old_sigterm = signal.signal(signal.SIGTERM, _interrupt)
    old_sigint = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_sigterm)
        signal.signal(signal.SIGINT, old_sigint)


def start_samplers(args, agent, logdir, iteration):
    """The -n samplers, with a warning if TensorFlow reached their processes. A resumed run's
    samplers get seeds moved on by the iteration it resumes at, so its episodes are new ones."""
    seed = args.seed + RESUME_SEED_STRIDE * iteration
    samplers = samplers_lib.make_samplers(args.env_name, args.num_samplers, seed, args.sampler_timeout)
    if any(info and info["tensorflow_imported"] for info in getattr(samplers, "info", [])):
        print("warning: TensorFlow got imported in the sampler processes (a module-level import in "
              "the main script?); they work, but start slower and use more memory", file=sys.stderr)
    print(f"PPO ({args.loss}) on {args.env_name}: {args.num_samplers} sampler(s), {args.batch_size} "
          f"steps/iteration, policy {agent.policy.widths}, value {agent.value.widths}, logdir {logdir}",
          flush=True)
    return samplers


def resume(args, checkpointer, logdir):
    """--mode=train_w_load: the checkpoint's agent and Progress, progress.csv cut back to its
    iteration (rows written after it, by a run killed later, are trained again); else a new Progress."""
    if args.mode != "train_w_load":
        return checkpoint_lib.Progress()
    prefix, progress = checkpointer.restore(args.load_model_url)
    path = os.path.join(logdir, "progress.csv")
    if os.path.exists(path):
        with open(path, newline="") as f:
            lines = f.readlines()
        kept = lines[:1] + [line for line in lines[1:] if int(line.split(",", 1)[0]) <= progress.iteration]
        with open(path, "w", newline="") as f:
            f.writelines(kept)
    print(f"resumed from {prefix}: iteration {progress.iteration}, {progress.steps} steps, "
          f"{progress.elapsed_s:.0f} s trained", flush=True)
    return progress


def test(args, spec):
    """--mode=test: the checkpoint's policy mean over --eval_episodes (10 if 0) -> test_results.json."""
    agent = PPO(spec.obs_shape[0], spec.action_dim, args)
    logdir = run_folder(args.load_model_url)
    prefix, progress = checkpoint_lib.Checkpointer(agent, logdir).restore(args.load_model_url, full=False)
    args.eval_episodes = args.eval_episodes or 10
    write_eval(args, agent.params(), progress.steps, logdir, "test_results.json", checkpoint=prefix)
    return 0


def try_checkpoint(checkpointer, progress):
    """A checkpoint's prefix, or None with an error line: a full disk must not end the training."""
    try:
        return checkpointer.save(progress)
    except (OSError, tf.errors.OpError) as e:
        print(f"error: could not write a checkpoint to {checkpointer.dir} ({e})", file=sys.stderr, flush=True)
        return None


def final_checkpoint(checkpointer, progress, logdir, status):
    """The checkpoint at a run's end, whatever ended it; the exit status (5 if it cannot be written)."""
    with whole_update(raise_pending=False):  # a second Ctrl-C must not cut the checkpoint short
        prefix = try_checkpoint(checkpointer, progress)
    if prefix is None:
        return status or 5
    print(f"checkpoint {prefix} (iteration {progress.iteration}, {progress.steps} steps)"
          + (f"; resume with --mode=train_w_load --load_model_url={logdir}" if status else ""),
          file=sys.stderr if status else sys.stdout, flush=True)
    return status


def train(args, spec):
    """Runs the training loop; returns the process exit status (0 ok, 1 sampler failure, 130
    interrupted, 5 no final checkpoint). Every way out but a crash of this process writes a checkpoint."""
    logdir = make_logdir(args)
    with signals_interrupt():
        agent = PPO(spec.obs_shape[0], spec.action_dim, args)
        checkpointer = checkpoint_lib.Checkpointer(agent, logdir)
        progress = resume(args, checkpointer, logdir)
        rows = RunLog(os.path.join(logdir, "progress.csv"), PROGRESS_FIELDS, logdir, PROGRESS_TAGS,
                      append=args.mode == "train_w_load")
        samplers, status = None, 0
        try:
            samplers = start_samplers(args, agent, logdir, progress.iteration)
            run_iterations(args, agent, samplers, rows, progress, checkpointer)
        except KeyboardInterrupt:
            print("interrupted: stopping the samplers", file=sys.stderr, flush=True)
            status = 130
        except samplers_lib.SamplerError as e:
            print(f"error: {e}\nstopping the run", file=sys.stderr, flush=True)
            status = 1
        finally:
            if samplers is not None:
                samplers.close()
            rows.close()
        status = final_checkpoint(checkpointer, progress, logdir, status)
        if status == 0 and args.eval_episodes:
            write_eval(args, agent.params(), progress.steps, logdir)
    return status
