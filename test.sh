#!/usr/bin/env bash
# Sets everything up (./install.sh) and runs the test suite.
#   ./test.sh              default suite (under 10 min on 2 cores)
#   ./test.sh -m slow      the long tests
#   ./test.sh -m ""        everything
set -euo pipefail
cd "$(dirname "$0")"
./install.sh
export TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES="" PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest "$@"
