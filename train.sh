#!/usr/bin/env bash
# Sets everything up (./install.sh) and trains CartPole-v1 with the MLP agent on a local cluster
# (1 learner + 1 actor process on 127.0.0.1, talking gRPC): configs/cartpole.flags. One actor is the
# faster choice on 2 cores (docs/results.md). Extra experiment.py flags may follow and win, e.g.
#   ./train.sh --total_environment_frames=2000000
set -euo pipefail
cd "$(dirname "$0")"
./install.sh
export TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=""
exec .venv/bin/python local_cluster.py --num_actors=1 --base_port=8001 -- --flagfile=configs/cartpole.flags "$@"
