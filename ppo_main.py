"""WALL-E's PPO in one process: the agent collects its own experience.

    python ppo_main.py HalfCheetah-v5 -it 1000 -b 10000

Logs go to results/ppo_<env>_<unix time>/ (progress.csv and TensorBoard events;
--logdir to choose). The algorithm is walle/agent.py, the loop walle/training.py;
--help lists the flags.
"""
import os
import sys


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Imported here, as in ppo_parallel_main.py; walle.cli loads TensorFlow only after parsing the flags.
    from walle import cli
    return cli.main(sys.argv[1:], __doc__, default_batch_size=10000, default_num_samplers=1,
                    allow_num_samplers=False)


if __name__ == "__main__":
    sys.exit(main())
