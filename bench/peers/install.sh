#!/usr/bin/env bash
# Makes bench/peers' virtual environments from the package registry (idempotent):
#   .peer-venv-sb3/   Stable-Baselines3 PPO with torch 2.13.0 (CPU)
#   .peer-venv-sf/    Sample Factory APPO, if it installs (exit status tells; the harness reports it)
# Usage: bench/peers/install.sh sb3|sf
set -euo pipefail
cd "$(dirname "$0")/../.."
which="${1:-sb3}"
case "$which" in
  sb3) venv=.peer-venv-sb3; reqs=bench/peers/requirements-sb3.txt ;;
  sf)  venv=.peer-venv-sf;  reqs=bench/peers/requirements-sf.txt ;;
  *) echo "usage: $0 sb3|sf" >&2; exit 2 ;;
esac
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[peers] $venv is up to date"; exit 0
fi
[[ -x "$venv/bin/python" ]] || python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs" 2> >(grep -v "Location 'file:" >&2)
echo "$want" > "$stamp"
echo "[peers] $venv ready"
