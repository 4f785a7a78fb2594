"""Hosts for the frontend: run a bash script on this machine or on another one over SSH.

LocalHost runs `bash -c script` here; RemoteHost runs it through paramiko, checking the
host key against --ssh_known_hosts. connect_hosts opens one per host of the workers CSV
and names every host it cannot reach. mpirun starts remote learners with the system ssh,
so mpirun_ssh_args turns the same CSV columns and flags into ssh options.
"""
import logging
import os
import shlex
import subprocess
import sys
import time

from absl import flags

import paramiko

logging.getLogger("paramiko").setLevel(logging.WARNING)  # no per-connection INFO lines
# nor the late answer to a channel the watch gave up on while a host was silent
logging.getLogger("paramiko.transport").setLevel(logging.ERROR)

flags.DEFINE_string("ssh_known_hosts", "~/.ssh/known_hosts", "known_hosts file checked for every remote host key.")
flags.DEFINE_bool("ssh_insecure_ignore_host_keys", False, "Do not check SSH host keys (unsafe outside a "
                                                          "trusted network).")
flags.DEFINE_float("ssh_timeout_s", 15.0, "SSH connect timeout.")
FLAGS = flags.FLAGS


def host_key(worker) -> str:
    """The key of a worker's host in the hosts dict: "local" or "user@ip:port"."""
    return "local" if worker.is_local else f"{worker.ssh_username}@{worker.ip}:{worker.ssh_port}"


class HostError(Exception):
    """A host could not be reached or refused us; the message says why and what to do."""


class LocalHost:
    key = "local"
    label = "this machine"

    def run(self, script, timeout=120.0):
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def close(self):
        pass


class UnknownHostKey(Exception):
    def __init__(self, key):
        super().__init__()
        self.key = key


class RejectUnknownHostKey(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(key)


class AcceptHostKeyWithoutSaving(paramiko.MissingHostKeyPolicy):  # --ssh_insecure_ignore_host_keys
    def missing_host_key(self, client, hostname, key):
        pass


class RemoteHost:
    """A host reached with paramiko. Key login is preferred: the CSV's ssh_key_file, then
    the SSH agent and ~/.ssh/id_*; the CSV's password only if one is given."""

    def __init__(self, worker):
        self.key = host_key(worker)
        self.ip, self.port, self.user = worker.ip, worker.ssh_port, worker.ssh_username
        self.key_file, self._password = worker.ssh_key_file, worker.ssh_password
        self.label = f"{self.user}@{self.ip} port {self.port}"
        self.client = None

    def connect(self):
        client = paramiko.SSHClient()
        known_hosts = os.path.expanduser(FLAGS.ssh_known_hosts)
        if FLAGS.ssh_insecure_ignore_host_keys:
            client.set_missing_host_key_policy(AcceptHostKeyWithoutSaving())
        else:
            if os.path.exists(known_hosts):
                client.load_system_host_keys(known_hosts)
            client.set_missing_host_key_policy(RejectUnknownHostKey())
        scan = f"ssh-keyscan -p {self.port} {self.ip} >> {FLAGS.ssh_known_hosts}"
        try:
            self._connect_retrying_resets(client)
        except UnknownHostKey as e:
            client.close()
            raise HostError(
                f"{self.label}: its SSH host key ({e.key.get_name()} {e.key.fingerprint}) is not in "
                f"{known_hosts}, so the host cannot be verified. Check that fingerprint with the host's owner, "
                f"then add it (`{scan}`), or pass --ssh_insecure_ignore_host_keys on a trusted network."
            ) from None
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostError(
                f"{self.label}: its SSH host key ({e.key.get_name()} {e.key.fingerprint}) differs from the one "
                f"in {known_hosts}. The host was reinstalled or someone is intercepting the connection; if you "
                f"know the host changed, remove its old line (`ssh-keygen -R '[{self.ip}]:{self.port}'`)."
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            tried = ", ".join(x for x in [f"key file {self.key_file}" if self.key_file else "",
                                           "SSH agent and ~/.ssh/id_* keys",
                                           "password from the CSV" if self._password else ""] if x)
            raise HostError(f"{self.label}: SSH login failed (tried {tried}). Put your public key in the "
                            f"host's ~/.ssh/authorized_keys or fix the CSV's ssh_* columns.") from None
        except (OSError, paramiko.SSHException) as e:
            client.close()
            raise HostError(f"{self.label}: cannot connect over SSH: {e}") from None
        self.client = client
        return self

    def _connect_retrying_resets(self, client, tries=3):
        """client.connect, again after 1 s and 2 s when the server closed the connection before
        its banner (a busy sshd drops new connections past its MaxStartups): a host that does not
        answer or refuses is reported at once, so a lost host is still found within a poll."""
        for attempt in range(tries):
            try:
                return client.connect(self.ip, port=self.port, username=self.user, password=self._password or None,
                                      key_filename=self.key_file or None, allow_agent=True, look_for_keys=True,
                                      timeout=FLAGS.ssh_timeout_s, banner_timeout=FLAGS.ssh_timeout_s,
                                      auth_timeout=FLAGS.ssh_timeout_s)
            except (ConnectionResetError, paramiko.SSHException) as e:
                reset = isinstance(e, ConnectionResetError) or "banner" in str(e).lower()
                if not reset or isinstance(e, (paramiko.AuthenticationException, paramiko.BadHostKeyException)) \
                        or attempt == tries - 1:
                    raise
                client.close()
                time.sleep(1.0 + attempt)

    def run(self, script, timeout=120.0):
        transport = self.client.get_transport() if self.client else None
        if transport is None or not transport.is_active():  # dropped (e.g. during a long watch)
            self.close()
            self.connect()
        _, stdout, stderr = self.client.exec_command("bash -c " + shlex.quote(script), timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err

    def close(self):
        if self.client is not None:
            self.client.close()
            self.client = None


def connect_hosts(cluster, strict=True, keep_unreachable=False) -> dict:
    """Host key -> connected host, for this machine and every remote host in the CSV.
    strict: raise one HostError naming every unreachable host; else print and skip them, or with
    keep_unreachable keep them unconnected (their run() tries to connect again each time)."""
    if FLAGS.ssh_insecure_ignore_host_keys and any(not w.is_local for w in cluster.workers):
        print("WARNING: --ssh_insecure_ignore_host_keys: SSH host keys are NOT checked; anyone on the network "
              "path could pose as the hosts.", file=sys.stderr)
    hosts = {"local": LocalHost()}
    problems = []
    for w in cluster.workers:
        key = host_key(w)
        if key in hosts:
            continue
        host = RemoteHost(w)
        try:
            hosts[key] = host.connect()
        except HostError as e:
            problems.append(f"{cluster.path}:{w.line}: {e}")
            hosts[key] = host if keep_unreachable else None
    if problems:
        if strict:
            close_hosts(hosts)
            raise HostError("\n".join(problems))
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
    return {k: h for k, h in hosts.items() if h is not None}


def close_hosts(hosts):
    for h in hosts.values():
        if h is not None:
            h.close()



def mpirun_ssh_args(w) -> str:
    """ssh options for mpirun's remote launch (OpenSSH, key or agent auth only)."""
    opts = ["-p", str(w.ssh_port), "-l", w.ssh_username, "-o", "BatchMode=yes"]
    if w.ssh_key_file:
        opts += ["-i", w.ssh_key_file]
    if FLAGS.ssh_insecure_ignore_host_keys:
        opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    else:
        opts += ["-o", "StrictHostKeyChecking=yes",
                 "-o", f"UserKnownHostsFile={os.path.expanduser(FLAGS.ssh_known_hosts)}"]
    return shlex.join(opts)

