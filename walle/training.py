"""WALL-E's PPO training loop, for either entry point (cli.main() calls train()).

One iteration:
  1. params = agent.params(): policy weights + observation-normaliser stats + version
  2. rollouts = samplers.collect(params, batch_size): exactly -b env steps in all
  3. stats = agent.update(rollouts, params) (agent.py)
  4. one row to <logdir>/progress.csv and TensorBoard (tools/runlog.py), and the console line

until --iterations or the --max_steps budget; then --eval_episodes, if any.
"""
import contextlib
import json
import os
import signal
import sys
import time

import numpy as np

from tools.runlog import RunLog, format_cell
from walle import samplers as samplers_lib
from walle.agent import PPO

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


def run_iterations(args, agent, samplers, rows):
    """Collect -> update -> write a row until --iterations or the --max_steps budget; returns the steps."""
    steps, recent, t_start = 0, [], time.time()
    for iteration in range(1, args.iterations + 1):
        params = agent.params()
        t0 = time.perf_counter()
        rollouts = samplers.collect(params, args.batch_size)
        t1 = time.perf_counter()
        stats = agent.update(rollouts, params)
        learn_time = time.perf_counter() - t1
        recent = (recent + [x for r in rollouts for x in r["episode_returns"]])[-10:]
        steps += sum(len(r["reward"]) for r in rollouts)
        row = iteration_row(stats, rollouts, params, t1 - t0, learn_time, iteration=iteration, steps=steps,
                            time=time.time() - t_start, return_last10=float(np.mean(recent)) if recent else None)
        rows.write(row, step=steps)
        if not args.quiet:
            print(progress_line(row), flush=True)
        if args.max_steps and steps + args.batch_size > args.max_steps:
            break  # the next iteration would go past the step budget
    return steps


def write_eval(args, params, steps, logdir):
    """--eval_episodes: the final policy's deterministic returns -> <logdir>/eval.json."""
    t0 = time.time()
    returns = samplers_lib.evaluate(args.env_name, params, args.eval_episodes, seed=args.seed + 10_000)
    result = {"steps": steps, "episodes": len(returns), "return_mean": float(np.mean(returns)),
              "return_std": float(np.std(returns)), "returns": returns, "seconds": time.time() - t0}
    with open(os.path.join(logdir, "eval.json"), "w") as f:
        json.dump(result, f)
    print(f"eval after {steps} steps: mean return {result['return_mean']:.1f} over {len(returns)} "
          f"episodes (policy mean, no noise)", flush=True)


def make_logdir(args):
    """--logdir (or results/ppo_<env>_<unix time>), with the run's flags in flags.txt."""
    logdir = args.logdir or os.path.join("results", f"ppo_{args.env_name.replace('/', '_')}_{int(time.time())}")
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "flags.txt"), "w") as f:
        f.write("\n".join(f"{k}={v}" for k, v in sorted(vars(args).items())) + "\n")
    return logdir


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def signals_interrupt():
    """SIGTERM and SIGINT raise KeyboardInterrupt while training, so kill <pid> stops the run as
    cleanly as Ctrl-C; the previous handlers come back afterwards."""
    old_sigterm = signal.signal(signal.SIGTERM, _interrupt)
    # A process started in the background of a non-interactive shell inherits SIGINT as
    # ignored, and Python then installs no KeyboardInterrupt handler: make kill -INT work.
    old_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_sigterm)
        signal.signal(signal.SIGINT, old_sigint)


def start_samplers(args, agent, logdir):
    """The -n samplers, with a warning if TensorFlow reached their processes."""
    samplers = samplers_lib.make_samplers(args.env_name, args.num_samplers, args.seed, args.sampler_timeout)
    if any(info and info["tensorflow_imported"] for info in getattr(samplers, "info", [])):
        print("warning: TensorFlow got imported in the sampler processes (a module-level import in "
              "the main script?); they work, but start slower and use more memory", file=sys.stderr)
    print(f"PPO ({args.loss}) on {args.env_name}: {args.num_samplers} sampler(s), {args.batch_size} "
          f"steps/iteration, policy {agent.policy.widths}, value {agent.value.widths}, logdir {logdir}",
          flush=True)
    return samplers


def train(args, spec):
    """Runs the training loop; returns the process exit status (0 ok, 1 sampler failure, 130 interrupted)."""
    logdir = make_logdir(args)
    with signals_interrupt():
        agent = PPO(spec.obs_shape[0], spec.action_dim, args)
        # No resume: a run started again in the same folder starts progress.csv again.
        rows = RunLog(os.path.join(logdir, "progress.csv"), PROGRESS_FIELDS, logdir, PROGRESS_TAGS, append=False)
        samplers, status = None, 0
        try:
            samplers = start_samplers(args, agent, logdir)
            steps = run_iterations(args, agent, samplers, rows)
            if args.eval_episodes:
                write_eval(args, agent.params(), steps, logdir)
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
    return status
