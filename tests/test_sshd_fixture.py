"""The tests' throw-away sshds share sshd's privilege-separation folder: one stopping must not
break another's logins (two pytest-xdist workers run them at once), and the last one out
leaves the folder as it found it."""
import os
import subprocess

import pytest

import sshd_fixture


def _login(server):
    return subprocess.run(["ssh", "-i", server.client_key, "-p", str(server.port), "-o", "BatchMode=yes",
                           "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                           f"root@{server.address}", "echo logged-in"],
                          capture_output=True, text=True, timeout=30)


def test_a_server_logs_in_after_another_stopped_and_the_folder_is_left_as_found(tmp_path):
    reason = sshd_fixture.available()
    if reason:
        pytest.skip(reason)
    existed = os.path.isdir(sshd_fixture.PRIVSEP_DIR)
    first, second = (sshd_fixture.Sshd(str(tmp_path / name)) for name in ("a", "b"))
    try:
        first.start()
        second.start()
        first.stop()
        done = _login(second)
        assert done.returncode == 0 and "logged-in" in done.stdout, done.stderr
    finally:
        first.stop()
        second.stop()
    assert os.path.isdir(sshd_fixture.PRIVSEP_DIR) == existed
