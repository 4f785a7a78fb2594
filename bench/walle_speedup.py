"""Experience-collection speed-up with N sampler processes (WALL-E's figure 5).

    .venv/bin/python bench/walle_speedup.py                       # N = 1 .. cores + 2, -b 20000
    .venv/bin/python bench/walle_speedup.py --max_n 8 --repeats 7 --batch_size 20000

For each N, the time to collect one iteration of --batch_size HalfCheetah-v5
steps with a fixed Gaussian policy (the real nets/gaussian.py widths and
weights), as the agent sees it: from sending the weights to holding all N
rollouts. N = 1 collects in this process (as ppo_main.py does); N >= 2 uses
N sampler processes (as ppo_parallel_main.py does). All N are measured in the
same run, their repeats interleaved round-robin so that load from other users
spreads evenly; the table reports medians and speed-up = t(1) / t(N).
Beyond the number of cores the speed-up must flatten: that is the physical limit.

Writes bench/results/walle_speedup.csv and .png, prints a table.
"""
import argparse
import csv
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# WALL-E's published collection speed-ups (HalfCheetah-v2, 20K steps/iteration), read off its figure.
WALLE_SPEEDUP = {2: 2.0, 5: 6.2, 8: 8.2, 10: 12.3, 20: 19.5}


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(cores):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("-b", "--batch_size", type=int, default=20000, help="steps per iteration (WALL-E: 20K)")
    p.add_argument("--max_n", type=int, default=cores + 2, help="largest N (default: cores + 2)")
    p.add_argument("--repeats", type=int, default=5, help="timed iterations per N (after one warm-up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    a = p.parse_args()
    for name in ("batch_size", "max_n", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.batch_size < a.max_n:
        p.error(f"--batch_size ({a.batch_size}) must be >= --max_n ({a.max_n})")
    return a


def collect_times(a, samplers, params, ns):
    """Seconds per iteration for each N, the N's repeats interleaved round-robin."""
    pools, times = {}, {n: [] for n in ns}
    try:
        for n in ns:
            pools[n] = samplers.make_samplers(a.env, n, a.seed)
            pools[n].collect(params, a.batch_size)  # warm-up: caches, first episode resets
        for r in range(a.repeats):
            for n in ns:
                t0 = time.perf_counter()
                rollouts = pools[n].collect(params, a.batch_size)
                times[n].append(time.perf_counter() - t0)
                assert sum(len(x["reward"]) for x in rollouts) == a.batch_size
            print(f"  repeat {r + 1}/{a.repeats}: " + " ".join(f"N={n}:{times[n][-1]:.2f}s" for n in ns), flush=True)
    finally:
        for pool in pools.values():
            pool.close()
    return times


def speedup_rows(a, times, cores):
    t1 = statistics.median(times[1])
    rows = []
    for n in sorted(times):
        med = statistics.median(times[n])
        rows.append({"n": n, "median_collect_s": med, "min_collect_s": min(times[n]), "max_collect_s": max(times[n]),
                     "steps_per_s": a.batch_size / med, "speedup": t1 / med, "efficiency": t1 / med / n,
                     "ideal": min(n, cores), "walle_speedup": WALLE_SPEEDUP.get(n, ""),
                     "repeats": a.repeats, "batch_size": a.batch_size, "cores": cores, "env": a.env})
    return rows


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in row.items()})


def print_table(rows):
    print(f"\n{'N':>3} {'median s':>9} {'min s':>7} {'max s':>7} {'steps/s':>9} {'speed-up':>9} "
          f"{'x/N':>6} {'WALL-E':>7}")
    for row in rows:
        print(f"{row['n']:>3} {row['median_collect_s']:9.3f} {row['min_collect_s']:7.3f} {row['max_collect_s']:7.3f} "
              f"{row['steps_per_s']:9.0f} {row['speedup']:9.2f} {row['efficiency']:6.2f} "
              f"{row['walle_speedup']!s:>7}")


def plot(path, a, rows, cores):
    from bench import common
    ns = [r["n"] for r in rows]
    fig, ax = common.subplots(figsize=(6, 4.5))
    ax.plot(ns, [r["speedup"] for r in rows], "o-", label="measured (median)")
    ax.plot(ns, ns, ":", color="gray", label="linear (N)")
    ax.plot(ns, [0.9 * n for n in ns], "--", color="gray", alpha=0.5, label="0.9 N")
    ax.axvline(cores, color="C3", alpha=0.4, label=f"{cores} usable cores")
    ax.set_xticks(ns)
    ax.set_xlabel("sampler processes N")
    ax.set_ylabel(f"collection speed-up vs N=1 ({a.batch_size} steps)")
    ax.set_title(f"{a.env}: collection speed-up")
    ax.grid(alpha=0.3)
    ax.legend()
    common.save_figure(fig, path)


def main():
    cores = usable_cores()
    a = parse_args(cores)
    # One BLAS thread here too (samplers get one each), so N=1 is a true one-core baseline;
    # set before numpy loads. These imports (numpy, TensorFlow, matplotlib) only here, in main():
    # spawned samplers re-import this file and must stay TF-free.
    os.environ.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import envs
    from walle import samplers
    from nets.gaussian import GaussianPolicy

    spec = envs.env_spec(a.env)
    policy = GaussianPolicy(spec.obs_shape[0], spec.action_dim)
    params = dict(policy.numpy_params(), version=0, obs_mean=np.zeros(spec.obs_shape, np.float32),
                  obs_std=np.ones(spec.obs_shape, np.float32), obs_clip=samplers.OBS_CLIP)
    ns = list(range(1, a.max_n + 1))
    print(f"{a.env}, {a.batch_size} steps/iteration, N = 1..{a.max_n}, {a.repeats} repeats, "
          f"{cores} usable cores (os.cpu_count() = {os.cpu_count()})", flush=True)
    rows = speedup_rows(a, collect_times(a, samplers, params, ns), cores)
    os.makedirs(a.out, exist_ok=True)
    csv_path = os.path.join(a.out, "walle_speedup.csv")
    write_csv(csv_path, rows)
    print_table(rows)
    plot(os.path.join(a.out, "walle_speedup.png"), a, rows, cores)
    print(f"\nwrote {csv_path} and walle_speedup.png")


if __name__ == "__main__":
    main()
