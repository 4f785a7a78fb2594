"""Several real hosts on one machine, for the multi-host frontend tests.

Hosts(n) makes n network namespaces joined by a bridge (one veth pair each), with
addresses 10.213.<k>.1..n/24; the bridge holds .254, so this machine reaches every
host (for SSH) while the namespaces have no route anywhere else. Each host runs
`unshare --pid --fork --kill-child --mount-proc --mount --uts` inside `ip netns exec`:
its own PID namespace and process table, its own hostname (h1, h2, ...), a private
tmpfs on /tmp (so its own tmux servers) and on /run, and as PID 1 its own sshd with its
own host key, which lets root log in with one client key. The repository, .venv and
the run folder (under /var/tmp) are on the shared file system, as an NFS home would be.

Bridged traffic between namespaces passes iptables' FORWARD chain when br_netfilter is
loaded, and installing docker.io sets that chain's policy to DROP. The rig inserts
ACCEPT rules for its own bridge (in FORWARD and, when Docker made it, DOCKER-USER) and
removes them on teardown, so it works either way; tests flip that situation on purpose.

stop() tears everything down even after a failure: killing each host's unshare kills
its PID 1 (sshd), which kills every process of that PID namespace (workers, tmux
servers, orted); then the namespaces, veths, bridge and iptables rules go.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid

SSHD = "/usr/sbin/sshd"


def available() -> str:
    """'' if the rig can run here, else why not."""
    if os.geteuid() != 0:
        return "the multi-host rig needs root (network namespaces, bridge, iptables)"
    for tool in ("ip", "unshare", "iptables", "ssh-keygen", "ssh", "timeout"):
        if not shutil.which(tool):
            return f"{tool} is not installed (install.sh installs iproute2, iptables, openssh-client)"
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"ip netns does not work here: {p.stderr.strip()}"
    return ""


def sh(*argv, check=True, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {p.returncode}): {p.stderr.strip()}")
    return p


class Host:
    def __init__(self, rig, i):
        self.rig, self.i = rig, i
        self.name = f"h{i}"
        self.netns = f"impala_test_{rig.tag}_{i}"
        self.ip = f"{rig.prefix}.{i}"
        self.veth = f"imv{rig.tag}{i}"
        self.host_key = os.path.join(rig.dir, f"{self.name}_host_key")
        self.proc = None

    def start(self):
        rig = self.rig
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", f"{self.veth}p")
        sh("ip", "link", "set", f"{self.veth}p", "netns", self.netns)
        sh("ip", "link", "set", self.veth, "master", rig.bridge, "up")
        sh("ip", "-n", self.netns, "link", "set", f"{self.veth}p", "name", "eth0")
        sh("ip", "-n", self.netns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        sh("ip", "-n", self.netns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.netns, "link", "set", "lo", "up")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", self.host_key)
        config = os.path.join(rig.dir, f"{self.name}_sshd_config")
        with open(config, "w") as f:
            f.write(f"Port 22\nListenAddress {self.ip}\nHostKey {self.host_key}\n"
                    f"PidFile none\nAuthorizedKeysFile {rig.authorized_keys}\nPubkeyAuthentication yes\n"
                    f"PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    f"PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n")
        # PID 1 of the host's PID namespace is sshd: when it dies, so does everything there.
        setup = (f"set -e; mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run; mkdir -m 755 /run/sshd; "
                 f"hostname {self.name}; exec {SSHD} -D -e -f {config}")
        self.log = open(os.path.join(rig.dir, f"{self.name}_sshd.log"), "w")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns, "unshare", "--pid", "--fork",
                                      "--kill-child", "--mount-proc", "--mount", "--uts", "bash", "-c", setup],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        with open(self.host_key + ".pub") as f:
            key_type, key_b64 = f.read().split()[:2]
        return f"{self.ip} {key_type} {key_b64}\n"

    def wait_ready(self, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: sshd exited: {open(self.log.name).read()}")
            try:
                with socket.create_connection((self.ip, 22), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name}: sshd did not answer on {self.ip}:22 within {timeout} s")

    def ssh(self, command, timeout=60, check=False):
        """Run a shell command on this host over SSH -> CompletedProcess."""
        p = subprocess.run(["ssh", "-i", self.rig.client_key, "-o", "BatchMode=yes",
                            "-o", f"UserKnownHostsFile={self.rig.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                            f"root@{self.ip}", command], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{self.name}: {command!r} failed (exit {p.returncode}): {p.stderr.strip()}")
        return p

    def netns_run(self, *argv, check=True):
        """Run a command in this host's network namespace (not its PID namespace)."""
        return sh("ip", "netns", "exec", self.netns, *argv, check=check)

    def cut(self):
        """Take the host off the network (its link to the bridge goes down): everything on it
        keeps running, nothing reaches it or leaves it, as when a switch port or cable fails."""
        sh("ip", "link", "set", self.veth, "down")

    def heal(self):
        sh("ip", "link", "set", self.veth, "master", self.rig.bridge, "up")

    def processes(self):
        """Command lines of every process on this host but PID 1 (sshd) and this SSH login's own."""
        out = self.ssh("echo $$; ps -e -o pid=,ppid=,args=", check=True).stdout.splitlines()
        me, rows = out[0].strip(), [line.split(None, 2) for line in out[1:] if line.strip()]
        parent = {pid: ppid for pid, ppid, _ in rows}
        mine, p = set(), me
        while p in parent and p not in mine:  # this login: its shell and the sshd processes above it
            mine.add(p)
            p = parent[p]
        return [args for pid, ppid, args in rows if pid != "1" and pid not in mine and ppid != me]

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)  # --kill-child: PID 1 and its namespace go too
            self.proc.wait()
            self.log.close()
        sh("ip", "link", "del", self.veth, check=False)
        sh("ip", "netns", "del", self.netns, check=False)


class Hosts:
    """n hosts; use as a context manager or call start() and stop()."""

    def __init__(self, n, workdir):
        self.tag = uuid.uuid4().hex[:5]
        self.dir = workdir
        os.makedirs(workdir, exist_ok=True)
        used = sh("ip", "-4", "-o", "addr").stdout
        k = next(k for k in random.sample(range(1, 250), 249) if f"10.213.{k}." not in used)
        self.prefix = f"10.213.{k}"
        self.subnet = f"{self.prefix}.0/24"
        self.bridge = f"imb{self.tag}"
        self.client_key = os.path.join(workdir, "id_ed25519")
        self.authorized_keys = os.path.join(workdir, "authorized_keys")
        self.known_hosts = os.path.join(workdir, "known_hosts")
        self.hosts = [Host(self, i + 1) for i in range(n)]
        self.forward_rules = []  # (chain, rule) inserted; deleted on stop

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "impala-test", "-f", self.client_key)
        shutil.copy(self.client_key + ".pub", self.authorized_keys)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.prefix}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        self.allow_forwarding()
        with open(self.known_hosts, "w") as f:
            for h in self.hosts:
                f.write(h.start())
        for h in self.hosts:
            h.wait_ready()
        return self

    def allow_forwarding(self):
        """ACCEPT this bridge's own traffic in FORWARD (and DOCKER-USER when it exists),
        ahead of any DROP policy or rule Docker put there."""
        rule = ["-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
        chains = ["FORWARD"]
        if sh("iptables", "-w", "-S", "DOCKER-USER", check=False).returncode == 0:
            chains.append("DOCKER-USER")
        for chain in chains:
            if (chain, rule) not in self.forward_rules:
                sh("iptables", "-w", "-I", chain, "1", *rule)
                self.forward_rules.append((chain, rule))

    def stop(self):
        errors = []
        for h in self.hosts:
            try:
                h.stop()
            except Exception as e:  # noqa: BLE001 (keep tearing down)
                errors.append(f"{h.name}: {e}")
        for chain, rule in self.forward_rules:
            sh("iptables", "-w", "-D", chain, *rule, check=False)
        self.forward_rules = []
        sh("ip", "link", "del", self.bridge, check=False)
        if errors:
            raise RuntimeError("teardown: " + "; ".join(errors))

    def leftovers(self):
        """What of this rig still exists (for the tests' final check)."""
        left = []
        netns = sh("ip", "netns", "list").stdout
        links = sh("ip", "-o", "link").stdout
        rules = sh("iptables", "-w", "-S").stdout
        left += [h.netns for h in self.hosts if h.netns in netns]
        left += [name for name in [self.bridge] + [h.veth for h in self.hosts] if f" {name}:" in links
                 or f" {name}@" in links]
        left += [line for line in rules.splitlines() if self.bridge in line]
        left += [f"pid {h.proc.pid}" for h in self.hosts if h.proc is not None and h.proc.poll() is None]
        return left

    def tcp_ok(self, src, dst_ip, port, timeout=3):
        """Can host src open a TCP connection to dst_ip:port? (from src's network namespace)"""
        p = src.netns_run("timeout", str(timeout), "bash", "-c", f'exec 3<>/dev/tcp/{dst_ip}/{port}', check=False)
        return p.returncode == 0
