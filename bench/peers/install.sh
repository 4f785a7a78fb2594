#!/usr/bin/env bash
# Makes bench/peers' virtual environments from the package registry (idempotent):
#   .peer-venv-sb3/   Stable-Baselines3 PPO with torch 2.13.0 (CPU)
#   .peer-venv-sf/    Sample Factory 2.1.1 APPO (torch 2.13.0 CPU, numpy<2, gymnasium 0.29)
#   .peer-venv-rllib/ RLlib (ray 2.60.0) APPO, new API stack (torch 2.13.0 CPU)
# A failed install exits non-zero; the harness reports it in the peer's row.
# Usage: bench/peers/install.sh sb3|sf|rllib
set -euo pipefail
cd "$(dirname "$0")/../.."
which="${1:-sb3}"
case "$which" in
  sb3) venv=.peer-venv-sb3; reqs=bench/peers/requirements-sb3.txt ;;
  sf)  venv=.peer-venv-sf;  reqs=bench/peers/requirements-sf.txt ;;
  rllib) venv=.peer-venv-rllib; reqs=bench/peers/requirements-rllib.txt ;;
  *) echo "usage: $0 sb3|sf|rllib" >&2; exit 2 ;;
esac
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[peers] $venv is up to date"; exit 0
fi
# The venv path may be a symlink (a worktree sharing the main checkout's venvs), perhaps to a
# directory not made yet: python's venv refuses a symlinked path ("Unable to create
# directory"), so it is given the resolved path, made first.
real="$(readlink -f "$venv")"
mkdir -p "$real"
[[ -x "$real/bin/python" ]] || python3.11 -m venv "$real" 2>/dev/null || python3 -m venv "$real"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs" 2> >(grep -v "Location 'file:" >&2)
echo "$want" > "$stamp"
echo "[peers] $venv ready"
