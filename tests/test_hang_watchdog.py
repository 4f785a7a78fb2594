"""tests/hang_watchdog.py: a test stuck in C code, out of pytest-timeout's reach, ends with its stack
printed and the rest of the suite still runs."""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

STUCK = '''
import ctypes


def test_stuck_in_c_holding_the_gil():
    libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL: no Python code runs until the call returns
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # a default mutex locked twice by one thread never returns


def test_after_it():
    pass
'''


def test_a_test_stuck_in_c_is_ended_with_its_stack_and_the_suite_goes_on(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = dict(os.environ, PYTHONPATH=HERE, HANG_WATCHDOG_GRACE_S="2")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "hang_watchdog", "-n", "1", "--timeout", "1",
                        "-p", "no:cacheprovider", "test_stuck.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1 and took < 60, (took, out[-3000:])
    assert "Timeout (0:00:03)!" in out and "in test_stuck_in_c_holding_the_gil" in out, out[-3000:]
    assert "crashed while running 'test_stuck.py::test_stuck_in_c_holding_the_gil'" in out, out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
