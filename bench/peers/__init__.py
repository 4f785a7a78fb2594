"""The peers: each lives in a virtual environment of its own (never ours), made by install.sh here on
first use; the scripts beside this file run inside those environments, so they import nothing of ours."""
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SB3_PY = os.path.join(ROOT, ".peer-venv-sb3", "bin", "python")
SF_PY = os.path.join(ROOT, ".peer-venv-sf", "bin", "python")
RLLIB_PY = os.path.join(ROOT, ".peer-venv-rllib", "bin", "python")


def ensure_peer(which):
    """Makes peer `which`'s (sb3, sf or rllib) environment unless it exists with today's requirements
    (install.sh keeps a hash of them); None, or why it failed."""
    proc = subprocess.run([os.path.join(HERE, "install.sh"), which], capture_output=True, text=True)
    if proc.returncode != 0:
        return "install failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
    return None
