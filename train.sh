#!/usr/bin/env bash
# Sets everything up (./install.sh) and trains the embedded default: CartPole-v1
# with the MLP agent on a local cluster (1 learner + 1 actor process on 127.0.0.1, talking gRPC).
# Extra experiment.py flags may follow, e.g. ./train.sh --total_environment_frames=2000000
set -euo pipefail
cd "$(dirname "$0")"
./install.sh
export TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=""
# The settings are bench/cartpole_impala.py's (mean return 475 in 2-6 s of training on 2 cores;
# one actor beats two there: bench/results/2core-amd-epyc/cartpole_sweep.md).
exec .venv/bin/python local_cluster.py --num_actors=1 --base_port=8001 -- \
  --level_name=CartPole-v1 --agent_name=MLPAgent --total_environment_frames=1000000 \
  --batch_size=16 --unroll_length=16 --envs_per_actor=16 --queue_capacity=32 \
  --optimizer=adam --learning_rate=0.002 --num_sgd_iter=8 --clip_param=0.2 \
  --vtrace_lambda=0.8 --discounting=0.98 --entropy_cost=0 --log_every_s=5 "$@"
