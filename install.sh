#!/usr/bin/env bash
# One set-up script for everything: Debian packages, .venv/ with the pinned
# Python stack, and Horovod 0.28.1 built from source against TensorFlow 2.18.1.
#
#   ./install.sh            # idempotent; the second run takes seconds
#   ./install.sh --gpu      # GPU hosts (also GPU=1): tensorflow[and-cuda] from
#                           # requirements-gpu.txt and a Horovod wheel built against it
#
# The Horovod wheel takes 3.5-6.5 minutes to build on 2 cores, so it is built
# once into $HOROVOD_WHEEL_DIR (default ~/.cache/impala-wheels) and reused.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
venv="$here/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
wheel_dir="${HOROVOD_WHEEL_DIR:-$HOME/.cache/impala-wheels}"
horovod_version=0.28.1
log() { printf '[install] %s\n' "$*"; }
gpu="${GPU:-0}"
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    *) echo "install.sh: unknown argument $arg (usage: ./install.sh [--gpu])" >&2; exit 2 ;;
  esac
done
if [ "$gpu" = 1 ]; then
  flavor=gpu; requirements=requirements-gpu.txt; other_tf=tensorflow-cpu
  wheel_dir="$wheel_dir/gpu"  # never the CPU build's wheel
else
  flavor=cpu; requirements=requirements.txt; other_tf=tensorflow
fi

# ---- 1. Debian packages ----------------------------------------------------
apt_pkgs=(cmake openmpi-bin libopenmpi-dev tmux openssh-server openssh-client g++ make iproute2 iptables)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- 2. virtual environment and pinned packages ------------------------------
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found %s" % sys.version' \
  || { echo "install.sh: $py is not Python 3.11; set PYTHON=/path/to/python3.11" >&2; exit 2; }
[ -x "$venv/bin/python" ] || { log "creating $venv"; "$py" -m venv "$venv"; }
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # tensorflow and tensorflow-cpu install the same module: only one may be there
  "${pip[@]}" show -q "$other_tf" >/dev/null 2>&1 && { log "pip: removing $other_tf"; "${pip[@]}" uninstall -q -y "$other_tf"; }
  log "pip: installing $requirements"
  "${pip[@]}" install -q -r "$requirements"
  echo "$want" > "$stamp"
fi

# The project itself, editable: a .pth puts the repository on the venv's path, so tests, bench/
# and tools/ import its packages (impala, envs, cluster, walle, nets) from anywhere. No network:
# setuptools comes from requirements.txt.
# compat mode writes a plain .pth with the repository's path (tests/ and bench/ import as packages too);
# the check runs from / because the current directory would satisfy it by itself.
if ! (cd / && "$venv/bin/python" -c "import impala, os, sys; sys.exit(os.path.dirname(os.path.dirname(impala.__file__)) != sys.argv[1])" "$here") >/dev/null 2>&1; then
  log "pip: installing this project (editable)"
  "${pip[@]}" install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e "$here"
fi

# ---- 3. Horovod from source (cached wheel) ----------------------------------
# A GPU host's wheel lives in $wheel_dir/gpu; with HOROVOD_GPU_OPERATIONS=NCCL and a CUDA
# toolkit (HOROVOD_CUDA_HOME) in the environment it also does the allreduce on the GPU,
# else the allreduce goes through host memory (MPI), which needs no toolkit.
horovod_stamp="$venv/.horovod-flavor"
if [ ! -f "$horovod_stamp" ] && [ "$flavor" = cpu ] \
    && "$venv/bin/python" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  echo cpu > "$horovod_stamp"  # a venv from before --gpu existed: its Horovod is the CPU build
fi
if [ "$(cat "$horovod_stamp" 2>/dev/null)" != "$flavor" ] \
    || ! "$venv/bin/python" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  mkdir -p "$wheel_dir"
  whl="$(ls "$wheel_dir"/horovod-$horovod_version-*.whl 2>/dev/null | head -1 || true)"
  if [ -z "$whl" ]; then
    # MPI only: every launcher here (mpirun, the frontend, Slurm's sbatch) starts ranks through MPI,
    # and leaving out Gloo (used by horovodrun and Horovod Elastic) takes the build from 190 s to
    # 118 s on a 2-core AMD EPYC (docs/results.md#the-test-suite-and-ci).
    log "building Horovod $horovod_version against TensorFlow ($flavor; 2-5 minutes on 2 cores)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
      "${pip[@]}" wheel -q --no-build-isolation --no-deps -w "$wheel_dir" "horovod==$horovod_version"
    whl="$(ls "$wheel_dir"/horovod-$horovod_version-*.whl | head -1)"
  fi
  log "pip: installing $(basename "$whl")"
  "${pip[@]}" install -q --no-deps --force-reinstall "$whl"
  "$venv/bin/python" -c "import horovod.tensorflow as hvd" \
    || { echo "install.sh: Horovod built but does not import; remove $wheel_dir and retry" >&2; exit 1; }
  echo "$flavor" > "$horovod_stamp"
fi
log "ready: $venv ($("$venv/bin/python" -c 'import tensorflow as tf, horovod; print("tf", tf.__version__, "horovod", horovod.__version__)' 2>/dev/null))"
