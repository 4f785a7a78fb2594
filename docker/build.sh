#!/usr/bin/env bash
# Builds the learner and actor images (impala-learner, impala-actor) from the repository.
#
#   docker/build.sh                                 # base debian:bookworm-slim
#   BASE=python:3.11-slim-bookworm docker/build.sh  # or the official Python image
#   TF_REQUIREMENT='tensorflow[and-cuda]==2.18.1' DEPS_TAG=impala-deps:gpu TAG=gpu docker/build.sh  # GPU (untested)
#
# Steps, each skipped when its result is already there:
#   1. the base image: when $BASE is debian:bookworm-slim and the daemon does not have it (Docker
#      Hub may be unreachable), it is made locally with debootstrap (about 25 s) and `docker import`;
#      any other $BASE is pulled by `docker build` as usual.
#   2. the wheelhouse docker/wheelhouse/ (git-ignored): every wheel of requirements.txt for this
#      cp311 Linux machine, downloaded on the host with the host's pip configuration (so a
#      network's TLS interception CA stays on the host and never enters an image), plus the Horovod
#      wheel install.sh builds and caches in $HOROVOD_WHEEL_DIR (~/.cache/impala-wheels; run
#      ./install.sh once if it is missing).
#   3. impala-deps: the base + Python 3.11 + Open MPI + tini + /opt/venv installed offline from the
#      wheelhouse (docker/Dockerfile.deps, its own small build context). Rebuilt only when
#      requirements.txt, the Horovod wheel, Dockerfile.deps or $BASE change (an image label holds
#      their hash).
#   4. impala-learner and impala-actor: two thin targets of docker/Dockerfile on top of
#      impala-deps; only the code is copied, so a code change rebuilds in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${BASE:-debian:bookworm-slim}"
DEPS_TAG="${DEPS_TAG:-impala-deps:latest}"
TAG="${TAG:-latest}"                       # tag of impala-learner and impala-actor
TF_REQUIREMENT="${TF_REQUIREMENT:-}"
HOROVOD_WHEEL_DIR="${HOROVOD_WHEEL_DIR:-$HOME/.cache/impala-wheels}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PY="${PYTHON:-python3.11}"                 # for pip download: the wheels must fit the image's cp311
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
log() { echo "[docker/build] $*"; }
die() { echo "docker/build.sh: error: $*" >&2; exit 1; }
t0=$SECONDS

command -v docker >/dev/null || die "no docker command; install Docker (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (start it: dockerd &, or systemctl start docker)"

# ---- 1. base image ---------------------------------------------------------------------------
if ! docker image inspect "$BASE" >/dev/null 2>&1 && [ "$BASE" = "debian:bookworm-slim" ] \
   && ! docker pull -q "$BASE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || die "$BASE is not in the daemon and cannot be pulled; " \
    "install debootstrap (apt-get install debootstrap) so this script can make it"
  [ "$(id -u)" = 0 ] || die "making $BASE with debootstrap needs root"
  log "1/4 base: $BASE not available; making it with debootstrap --variant=minbase bookworm"
  root="$(mktemp -d /tmp/impala_rootfs.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  mkdir -p docker/wheelhouse/logs
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >docker/wheelhouse/logs/debootstrap.log 2>&1 \
    || die "debootstrap failed (log: docker/wheelhouse/logs/debootstrap.log)"
  # the public image's apt sources (updates and security too), no caches, no docs
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
         "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/var/log/*.log
  tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$root"; trap - EXIT
  log "1/4 base: $BASE made ($((SECONDS - t0)) s)"
else
  log "1/4 base: $BASE"
fi

# ---- 2. wheelhouse ---------------------------------------------------------------------------
wh=docker/wheelhouse
horovod="$(ls "$HOROVOD_WHEEL_DIR"/horovod-0.28.1-cp311-*.whl 2>/dev/null | head -1 || true)"
[ -n "$horovod" ] || die "no Horovod wheel in $HOROVOD_WHEEL_DIR; run ./install.sh once (it builds and caches it)"
mkdir -p "$wh/logs"
printf 'logs\n' > "$wh/.dockerignore"
if [ -n "$TF_REQUIREMENT" ]; then
  sed "s|^tensorflow-cpu==.*|$TF_REQUIREMENT|" requirements.txt > "$wh/requirements.txt"
else
  cp requirements.txt "$wh/requirements.txt"
fi
cp -p "$horovod" "$wh/"
command -v "$PY" >/dev/null || die "$PY not found; run ./install.sh first (or PYTHON=<a Python 3.11>)"
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PY is not Python 3.11; the wheels must fit the image's Python 3.11 (set PYTHON=)"
stamp="$(sha256sum "$wh/requirements.txt" | cut -c1-16)"
if [ "$(cat "$wh/.complete" 2>/dev/null || true)" = "$stamp" ]; then
  log "2/4 wheelhouse: $wh is complete for requirements.txt"
else
  log "2/4 wheelhouse: pip download of requirements.txt into $wh"
  "$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wh" -r "$wh/requirements.txt" \
    >"$wh/logs/pip.log" 2>&1 || { tail -20 "$wh/logs/pip.log" >&2; die "pip download failed (log: $wh/logs/pip.log): the " \
    "wheels of requirements.txt must be reachable with this host's pip configuration"; }
  echo "$stamp" > "$wh/.complete"
fi
key="$( (echo "$BASE"; cat "$wh/requirements.txt" docker/Dockerfile.deps; basename "$horovod") | sha256sum | cut -c1-16)"

# ---- 3. dependencies image -------------------------------------------------------------------
if [ "$(docker image inspect -f '{{index .Config.Labels "impala.deps"}}' "$DEPS_TAG" 2>/dev/null || true)" = "$key" ]; then
  log "3/4 deps: $DEPS_TAG is up to date"
else
  log "3/4 deps: building $DEPS_TAG (Python, Open MPI, venv from the wheelhouse)"
  cp docker/Dockerfile.deps "$wh/Dockerfile"
  docker build --build-arg "BASE=$BASE" --label "impala.deps=$key" -t "$DEPS_TAG" "$wh" >"$wh/logs/deps.log" 2>&1 \
    || { tail -30 "$wh/logs/deps.log" >&2; die "building $DEPS_TAG failed (log: $wh/logs/deps.log)"; }
  # the build stage that held the wheels is cache only: drop it (the deps image has the venv)
  docker image prune -f --filter label=impala.stage=wheels >/dev/null
fi

# ---- 4. learner and actor --------------------------------------------------------------------
for target in learner actor; do
  log "4/4 $target: impala-$target:$TAG"
  docker build --build-arg "DEPS=$DEPS_TAG" -f docker/Dockerfile --target "$target" -t "impala-$target:$TAG" . \
    >"$wh/logs/$target.log" 2>&1 || { tail -30 "$wh/logs/$target.log" >&2; die "building impala-$target failed (log: $wh/logs/$target.log)"; }
done
log "done in $((SECONDS - t0)) s: impala-learner:$TAG, impala-actor:$TAG"
