"""Shared pytest set-up: quiet TF, the `slow`, `long` and `docker` markers, the leftovers check, the
hypothesis profiles. The project is importable through its editable install (install.sh).

The default suite gives the same result on every run: hypothesis's "default" profile here draws each
property test's examples from the test itself (derandomize) and keeps no example database. The
"random" profile searches afresh, with more examples (HYPOTHESIS_MAX_EXAMPLES, default 1000):

    HYPOTHESIS_PROFILE=random ./test.sh tests/test_properties.py
    HYPOTHESIS_PROFILE=random HYPOTHESIS_MAX_EXAMPLES=200 ./test.sh tests/test_properties.py

A failure it finds prints the falsifying example and a @reproduce_failure line to rerun it with; add
the example with @example so the default run keeps testing it. A test's own settings(...) leaves
derandomize and database unset: a settings object takes the fields it does not name from the profile
loaded when it is made, which is this one (conftest.py loads before the test modules).
"""
import os

import pytest
from hypothesis import settings

from hang_watchdog import pytest_runtest_protocol  # noqa: F401  (a hook: a test stuck in C code ends)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# A random draw once found '¹' in a workers CSV cell and failed one landing, not the next; an example
# database (.hypothesis/) would replay one machine's past failures on that machine only.
settings.register_profile("default", derandomize=True, database=None, max_examples=300)
settings.register_profile("random", derandomize=False, database=None, print_blob=True,
                          max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "1000")))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: whole runs of the system (daemons, hosts, faults, the README's "
                                       "commands), run with `-m slow`; CI runs them")
    config.addinivalue_line("markers", "long: whole learning runs to a score and the bench scripts end to end, "
                                       "run with `-m long` (about 16 minutes on 2 cores); CI does not run them")
    config.addinivalue_line("markers", "docker: builds the images and runs the compose cluster in a Docker "
                                       "daemon (started if none runs), run with `-m docker`")


# Network-namespace rigs add iptables rules and bridges; the README's commands and the Slurm
# launcher use the default learner port 8001; each Docker test drives the one daemon and its
# compose project. Files whose module fixture starts runs of their own keep to one worker, so
# the runs start once.
_SERIAL_GROUPS = {"test_multihost.py": "netns", "test_readme.py": "port_8001", "test_slurm.py": "port_8001",
                  "test_docker.py": "docker", "test_input_fuzz.py": "input_fuzz", "test_ppo.py": "ppo_runs",
                  "test_walle_export.py": "walle_export"}
# The longest tests start first, so neither worker is left running one alone at the end: the
# namespace rigs' group (about 380 s together) and the longest learning runs.
_LONGEST_FIRST = ("test_a_killed_rank_and_a_cut_learner_host_restart_the_learners_and_the_run_goes_on",
                  "test_pong_learns_with_the_native_backend_within_a_frame_budget",
                  "test_the_suite_resumes_a_run_that_was_cut_off", "test_the_suite_runs_every_variant",
                  "test_quickstart_train_then_tensorboard_plot_and_test_mode")


# ---------------------------------------------------------------- leftovers
# No test may leave a process of this project, a tmux session or a temp directory of
# ours behind: checked once after the whole session (and reported as an error).
_TEMP_PREFIXES = ("pong_bench_", "cartpole_bench_", "faults_", "scaling_", "bench_impala_", "soak_",
                  "replay_bench_", "imtmux")


def _our_processes():
    import psutil
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        ours = ROOT in cmd and any(s in cmd for s in ("experiment.py", "local_cluster.py", "ppo_main.py",
                                                      "ppo_parallel_main.py", "multi_train.py"))
        # tmux servers on the tests' private sockets, sshd and workers under pytest's tmp dirs
        of_tests = "impala_test_" in cmd or "pytest-of-" in cmd
        runner = any(part.endswith("pytest") for part in (p.info["cmdline"] or [])[:3])  # a pytest itself
        if p.info["pid"] != me and (ours or of_tests) and not runner:
            found.append("%d %s" % (p.info["pid"], cmd[:160]))
    return found


def _tmux_sessions():
    import subprocess
    try:
        out = subprocess.run(["tmux", "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [s for s in out.stdout.split() if s.startswith(("impala", "pytest", "test"))]


def _temp_dirs():
    import tempfile
    d = tempfile.gettempdir()
    return sorted(n for n in os.listdir(d) if n.startswith(_TEMP_PREFIXES))


def _xdist_worker(config):
    """True in a pytest-xdist worker: the leftovers are checked once, by the controller, after every
    worker has finished (a worker would count the other worker's live runs as its leftovers)."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups off the markers
def pytest_collection_modifyitems(config, items):
    # Tests that share one machine-wide thing run one after another on the same worker (pytest.ini's
    # --dist loadgroup); everything else is spread over both workers.
    for item in items:
        group = _SERIAL_GROUPS.get(os.path.basename(str(item.fspath)))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    first = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.name, len(first)))  # a stable sort: the rest keep their order


def pytest_sessionstart(session):
    if _xdist_worker(session.config):
        return
    session.config._leftovers_before = (set(_our_processes()), set(_tmux_sessions()), set(_temp_dirs()))


def pytest_sessionfinish(session, exitstatus):
    import time
    if _xdist_worker(session.config):
        return
    before = getattr(session.config, "_leftovers_before", (set(), set(), set()))
    deadline = time.time() + 15  # processes told to stop get a moment to exit
    while True:
        now = (set(_our_processes()) - before[0], set(_tmux_sessions()) - before[1], set(_temp_dirs()) - before[2])
        if not any(now) or time.time() > deadline:
            break
        time.sleep(0.5)
    if any(now):
        print("\nLEFTOVERS after the tests: processes %s, tmux sessions %s, temp dirs %s"
              % (sorted(now[0]), sorted(now[1]), sorted(now[2])))
        if session.exitstatus == 0:
            session.exitstatus = 3
