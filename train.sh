#!/usr/bin/env bash
# Sets everything up (./install.sh) and trains the embedded default: CartPole-v1
# with the MLP agent on a local cluster (1 learner + 2 actor processes on 127.0.0.1).
# Extra experiment.py flags may follow, e.g. ./train.sh --total_environment_frames=2000000
set -euo pipefail
cd "$(dirname "$0")"
./install.sh
export TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=""
exec .venv/bin/python local_cluster.py --num_actors=2 --base_port=8001 -- \
  --level_name=CartPole-v1 --agent_name=MLPAgent --total_environment_frames=1500000 \
  --batch_size=16 --unroll_length=20 --envs_per_actor=8 --entropy_cost=0.01 \
  --learning_rate=0.001 --log_every_s=5 "$@"
