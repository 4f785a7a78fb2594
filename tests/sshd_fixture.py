"""A throw-away OpenSSH server for the frontend tests.

It listens on 127.0.0.2 (an address of the loopback network that is not assigned to
an interface, so workers_csv treats it as a remote host and the frontend goes through
SSH), with a fresh host key, and lets root log in with a fresh client key only. It
sets TMUX_TMPDIR for its logins, so tmux "on the remote host" is a tmux server of its
own, apart from the local one, as on a real second machine.

Needs root (sshd drops privileges per login) and /usr/sbin/sshd (openssh-server,
installed by install.sh).
"""
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SSHD = "/usr/sbin/sshd"
ADDRESS = "127.0.0.2"
PRIVSEP_DIR = "/run/sshd"  # compiled into sshd: every login's unprivileged child chroots here
# Left in PRIVSEP_DIR while tests made it: the folder goes when the last of them is gone.
_MADE_MARK = ".made-by-impala-tests"
_USER_MARK = ".impala-test-sshd-"


def free_port(address="127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def available() -> str:
    """'' if an sshd can be started here, else the reason it cannot."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "sshd for the tests must run as root"
    if not shutil.which("ssh-keygen"):
        return "ssh-keygen is not installed (apt-get install openssh-client)"
    return ""


class Sshd:
    def __init__(self, workdir):
        self.dir = os.path.abspath(workdir)
        os.makedirs(self.dir, exist_ok=True)
        self.address = ADDRESS
        self.port = free_port(ADDRESS)
        self.host_key = os.path.join(self.dir, "ssh_host_ed25519_key")
        self.client_key = os.path.join(self.dir, "id_ed25519")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        # The "remote" tmux servers live here. A short folder of its own: a tmux socket path must fit
        # in 107 bytes, and pytest-xdist's tmp paths (.../popen-gw0/test_name0/) leave too little.
        self.tmux_tmpdir = tempfile.mkdtemp(prefix="imtmux")
        self.proc = None
        self._user_mark = None

    def start(self):
        for key in (self.host_key, self.client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "impala-test", "-f", key],
                           check=True)
        authorized = os.path.join(self.dir, "authorized_keys")
        shutil.copy(self.client_key + ".pub", authorized)
        os.chmod(authorized, 0o600)
        with open(self.host_key + ".pub") as f:
            key_type, key_b64 = f.read().split()[:2]
        with open(self.known_hosts, "w") as f:  # a known_hosts that trusts this server
            f.write(f"[{self.address}]:{self.port} {key_type} {key_b64}\n")
        config = os.path.join(self.dir, "sshd_config")
        with open(config, "w") as f:
            f.write(f"""Port {self.port}
ListenAddress {self.address}
HostKey {self.host_key}
PidFile {os.path.join(self.dir, 'sshd.pid')}
AuthorizedKeysFile {authorized}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
SetEnv TMUX_TMPDIR={self.tmux_tmpdir}
""")
        self._user_mark = _use_privsep_dir()
        self.log = open(os.path.join(self.dir, "sshd.log"), "w")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {open(self.log.name).read()}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("sshd did not start listening within 10 s")

    def tmux(self, *args):
        """Run tmux against the "remote" host's tmux servers."""
        return subprocess.run(["tmux", *args], capture_output=True, text=True,
                              env=dict(os.environ, TMUX_TMPDIR=self.tmux_tmpdir))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:
            self.log.close()
        shutil.rmtree(self.tmux_tmpdir, ignore_errors=True)
        if self._user_mark is not None:
            _release_privsep_dir(self._user_mark)
            self._user_mark = None


# Tests on two pytest-xdist workers start sshds at once: one that removed the folder it made
# while another's sshd still ran made every later login there fail before the banner. Each
# server marks its use inside the folder, under a lock on /run, and the last one out removes it.
@contextlib.contextmanager
def _run_dir_locked():
    fd = os.open(os.path.dirname(PRIVSEP_DIR), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _users(names):
    """The marks of live servers; marks of processes that died without stopping theirs are dropped."""
    live = []
    for name in names:
        if not name.startswith(_USER_MARK):
            continue
        pid = int(name[len(_USER_MARK):].split("-")[0])
        if os.path.exists(f"/proc/{pid}"):
            live.append(name)
        else:
            os.remove(os.path.join(PRIVSEP_DIR, name))
    return live


def _use_privsep_dir() -> str:
    with _run_dir_locked():
        if not os.path.isdir(PRIVSEP_DIR):
            os.makedirs(PRIVSEP_DIR, mode=0o755)
            open(os.path.join(PRIVSEP_DIR, _MADE_MARK), "w").close()
        mark = os.path.join(PRIVSEP_DIR, f"{_USER_MARK}{os.getpid()}-{time.monotonic_ns()}")
        open(mark, "w").close()
        return mark


def _release_privsep_dir(mark: str):
    with _run_dir_locked():
        with contextlib.suppress(FileNotFoundError):
            os.remove(mark)
        names = os.listdir(PRIVSEP_DIR) if os.path.isdir(PRIVSEP_DIR) else []
        if _MADE_MARK in names and not _users(names):
            os.remove(os.path.join(PRIVSEP_DIR, _MADE_MARK))
            with contextlib.suppress(OSError):  # something else put a file there: it stays
                os.rmdir(PRIVSEP_DIR)
