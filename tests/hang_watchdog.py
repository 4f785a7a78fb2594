"""A pytest plugin that ends a test stuck where pytest-timeout cannot reach it.

pytest-timeout's signal method (pytest.ini) fails a slow test with its traceback, but its alarm is
handled only when Python gets the main thread back: a test stuck inside C code (a gRPC call that
never answers, a mutex) never gives it back, and one such test once held a CI run for over an hour.
This watchdog runs in C, HANG_WATCHDOG_GRACE_S (default 60) seconds after the test's own timeout: it
prints every thread's stack to the terminal and ends the process. Under pytest-xdist that worker is
reported as crashed while running the test and is replaced, so the rest of the suite still runs.
"""
import faulthandler
import os

import pytest
from _pytest.faulthandler import fault_handler_stderr_fd_key


def _timeout_s(item):
    marker = item.get_closest_marker("timeout")
    if marker and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout not loaded (-p no:timeout)
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = _timeout_s(item)
    if limit > 0:
        grace = float(os.environ.get("HANG_WATCHDOG_GRACE_S", "60"))
        faulthandler.dump_traceback_later(limit + grace, exit=True,
                                          file=item.config.stash[fault_handler_stderr_fd_key])
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()
