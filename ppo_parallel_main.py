"""WALL-E's PPO with N parallel sampler processes collecting experience.

    python ppo_parallel_main.py HalfCheetah-v5 -it 1000 -b 1000 -n 10

-b steps per iteration in total, split over the -n samplers; -n 1 collects in
the agent's own process. Logs go to results/ppo_<env>_<unix time>/ (--logdir to
choose). See walle/agent.py, walle/training.py and walle/samplers.py; --help
lists the flags.
"""
import os
import sys


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Nothing from walle/ at module level: the "spawn" start method re-imports this file in
    # every sampler process, which must stay TF-free (walle.cli loads TensorFlow only in main()).
    from walle import cli
    return cli.main(sys.argv[1:], __doc__, default_batch_size=1000, default_num_samplers=os.cpu_count() or 1)


if __name__ == "__main__":
    sys.exit(main())
