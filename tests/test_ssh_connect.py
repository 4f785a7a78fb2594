"""The frontend's SSH connect tries again when a busy sshd drops the connection before its banner,
and reports at once a host that does not answer, refuses, or rejects the login."""
import socket

import paramiko
import pytest
from absl import flags

from cluster import hosts
from cluster import workers_csv

FLAGS = flags.FLAGS


@pytest.fixture(autouse=True)
def _flags(monkeypatch):
    if not FLAGS.is_parsed():
        FLAGS(["test"])
    monkeypatch.setattr(hosts.time, "sleep", lambda s: None)


class _Client:
    """paramiko.SSHClient's connect, failing with the given errors first."""

    def __init__(self, errors):
        self.errors, self.calls, self.closed = list(errors), 0, 0

    def connect(self, *args, **kwargs):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)

    def close(self):
        self.closed += 1


def _host():
    return hosts.RemoteHost(workers_csv.Worker(job="actor", index=0, line=2, ip="10.9.9.9", tf_port=8001,
                                               cuda_visible_devices="", ssh_port=22, ssh_username="u",
                                               ssh_password="", ssh_key_file="", is_local=False))


@pytest.mark.parametrize("error", [paramiko.SSHException("Error reading SSH protocol banner[Errno 104] Connection "
                                                         "reset by peer"), ConnectionResetError(104, "reset")])
def test_a_connection_dropped_before_the_banner_is_tried_again(error):
    client = _Client([error, error])
    _host()._connect_retrying_resets(client)
    assert client.calls == 3 and client.closed == 2


def test_a_third_drop_is_reported():
    client = _Client([ConnectionResetError(104, "reset")] * 3)
    with pytest.raises(ConnectionResetError):
        _host()._connect_retrying_resets(client)
    assert client.calls == 3


@pytest.mark.parametrize("error", [socket.timeout("timed out"), ConnectionRefusedError(111, "refused"),
                                   paramiko.AuthenticationException("no"),
                                   paramiko.SSHException("No existing session")])
def test_a_silent_refusing_or_rejecting_host_is_reported_at_once(error):
    client = _Client([error])
    with pytest.raises(type(error)):
        _host()._connect_retrying_resets(client)
    assert client.calls == 1
