"""The workers CSV: which processes of a training run go on which host.

One row per process, a header line first:

    job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password[,ssh_key_file]
    learner,127.0.0.1,8001,,,,
    actor,10.0.0.7,8002,,22,ubuntu,,~/.ssh/id_ed25519

- job: `learner`, `actor` or `evaluator`. Learner r (r-th learner row) is Horovod rank r; actor i
  (i-th actor row) feeds learner i % K (round-robin, see `assign`). At most one evaluator row:
  the test worker, which plays learner 0's current policy greedily (eval.csv in the run folder).
- ip, tf_port: the process's address. Learners serve their queue there; actors are
  gRPC clients and only use it as their name in --actor_hosts.
- cuda_visible_devices: empty (inherit the environment), `-1` (no GPU) or a
  comma list of GPU ids, e.g. `0` or `0,1`. Quote a list: `"0,1"`.
- ssh_*: how the frontend reaches a remote host (ignored for this machine).
  ssh_port and ssh_username are required for remote hosts. Prefer keys:
  ssh_key_file (relative paths are relative to the CSV file), else the SSH
  agent and ~/.ssh/id_*; a password works but is discouraged.

Lines starting with `#` and blank lines are skipped; cells are stripped of
spaces; a UTF-8 byte-order mark is ignored. `load` checks every line before
it raises, so one `WorkersCsvError` lists every problem, each as
`path:line: column 'x': 'value' ...; what would be right`.
"""
import csv
import dataclasses
import ipaddress
import os
import re
import socket

import psutil

from tools.digits import is_digits, odd_char

REQUIRED_COLUMNS = ("job", "ip", "tf_port", "cuda_visible_devices",
                    "ssh_port", "ssh_username", "ssh_password")
OPTIONAL_COLUMNS = ("ssh_key_file",)
JOBS = ("learner", "actor", "evaluator")

_HOSTNAME_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_GPU_ID = re.compile(r"^([0-9]+|(GPU|MIG)-[A-Za-z0-9/-]+)$")  # \d would take '３' too


class WorkersCsvError(ValueError):
    """The CSV has problems; the message lists all of them, one per line."""


@dataclasses.dataclass(frozen=True)
class Worker:
    job: str                   # "learner" | "actor" | "evaluator"
    index: int                 # position among the rows of its job: learner rank / actor task
    line: int                  # line number in the CSV (1-based), for messages
    ip: str
    tf_port: int
    cuda_visible_devices: str  # "" = inherit
    ssh_port: int | None
    ssh_username: str
    ssh_password: str = dataclasses.field(repr=False)  # never printed; see masked()
    ssh_key_file: str          # absolute path or ""
    is_local: bool             # this machine: started without SSH

    @property
    def name(self) -> str:
        return f"{self.job}_{self.index}"

    @property
    def address(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.tf_port}"

    @property
    def ssh_target(self) -> str:
        return "this machine" if self.is_local else f"{self.ssh_username}@{self.ip} port {self.ssh_port}"

    def masked(self) -> dict:
        """The row as a dict for logs and cluster.json: the password shows as ***."""
        d = dataclasses.asdict(self)
        d["ssh_password"] = "***" if self.ssh_password else ""
        return d


@dataclasses.dataclass
class Cluster:
    path: str
    learners: list
    actors: list
    warnings: list  # messages to print once (e.g. passwords in the file)
    evaluators: list = dataclasses.field(default_factory=list)  # none or one

    @property
    def workers(self) -> list:
        return self.learners + self.actors + self.evaluators

    @property
    def learner_hosts(self) -> str:
        return ",".join(w.address for w in self.learners)

    @property
    def actor_hosts(self) -> str:
        return ",".join(w.address for w in self.actors)

    def assignment(self):
        return assign(self.actors, self.learners)


def assign(actors, learners):
    """Round-robin: actor i goes to learner i % K. Returns [(learner, [actors...]), ...] by rank."""
    if not learners:
        raise ValueError("assign() needs at least one learner")
    groups = [(learner, []) for learner in learners]
    for i, actor in enumerate(actors):
        groups[i % len(learners)][1].append(actor)
    return groups


def local_addresses() -> set:
    """Names and addresses that mean "this machine" (lower-case)."""
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
    for nic in psutil.net_if_addrs().values():
        for a in nic:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                names.add(a.address.split("%")[0])
    return {n.lower() for n in names if n}


def load(path, local=None) -> Cluster:
    """Parse and validate the CSV at `path`; raise WorkersCsvError listing every problem.

    `local`: the set of addresses that mean this machine (default: local_addresses()).
    An address not in it is a remote host, reached over SSH. 127.0.0.2 is not in it
    unless a network interface has that exact address; the tests use that to run
    "remote" workers through a real sshd on this machine.
    """
    local = local_addresses() if local is None else {a.lower() for a in local}
    rows = _read_rows(path)
    errors = _Problems(path)
    header = _check_header(path, rows[0], errors)
    workers, jobs_named = _parse_rows(path, header, rows[1:], local, errors)
    _check_whole_file(path, workers, jobs_named, errors)
    errors.raise_if_any()
    learners = [dataclasses.replace(w, index=r) for r, w in enumerate(x for x in workers if x.job == "learner")]
    actors = [dataclasses.replace(w, index=i) for i, w in enumerate(x for x in workers if x.job == "actor")]
    evaluators = [dataclasses.replace(w, index=0) for w in workers if w.job == "evaluator"]
    return Cluster(path=path, learners=learners, actors=actors, warnings=_password_warnings(path, workers),
                   evaluators=evaluators)


class _Problems:
    """Every problem found, each a (line number, message); file-level problems get line 0 and go last."""

    def __init__(self, path):
        self.path, self.errors = path, []

    def __call__(self, lineno, msg):
        self.errors.append((lineno, f"{self.path}:{lineno}: {msg}"))

    def whole_file(self, msg):
        self.errors.append((0, f"{self.path}: {msg}"))

    def raise_if_any(self):
        if self.errors:
            raise WorkersCsvError(_report(self.path, self.errors))


def _read_rows(path):
    """[(line number, [cells])] of the non-blank, non-comment lines; at least the header."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # -sig drops a BOM
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkersCsvError(f"{path}: cannot read the workers CSV: {e}") from None
    rows = []
    # Only CR/LF end lines (str.splitlines() would also split at \x1c-\x1e, \x85, \u2028,
    # and the line numbers in the errors would not match the user's editor).
    for lineno, raw in enumerate(re.split(r"\r\n|\n|\r", text), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        rows.append((lineno, [c.strip() for c in next(csv.reader([raw]))]))
    if not rows:
        raise WorkersCsvError(f"{path}: no header line; the first line must be: {', '.join(REQUIRED_COLUMNS)}"
                              f" (optionally followed by ,ssh_key_file), then one row per worker")
    return rows


def _check_header(path, first_row, errors):
    """The header's column names (lower-case); a header the rows cannot be read by raises at once."""
    lineno, header = first_row
    header = [h.lower() for h in header]
    header_line = ", ".join(REQUIRED_COLUMNS)
    if header and header[0] in JOBS:
        raise WorkersCsvError(f"{path}:{lineno}: this is a data row, but the first line must be the "
                              f"header: {header_line} (optionally followed by ,ssh_key_file)")
    known = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
    for h in header:
        if h not in known:
            hint = " (columns are separated by commas, not tabs)" if "\t" in h else ""
            errors(lineno, f"unknown header column {h!r}{hint}; valid columns: {', '.join(known)}")
    dups = sorted({h for h in header if header.count(h) > 1})
    if dups:
        errors(lineno, f"header column(s) {', '.join(dups)} appear more than once")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        errors(lineno, f"header lacks column(s) {', '.join(missing)}; the header must be: {header_line}")
        errors.raise_if_any()
    return header


def _parse_rows(path, header, rows, local, errors):
    """The workers of the rows that parse, and the jobs every row names (even rows with problems)."""
    workers, jobs_named = [], set()
    for lineno, cells in rows:
        if len(cells) != len(header):
            joined = ",".join(cells)
            hint = ""
            if len(cells) == 1 and ("\t" in joined or ";" in joined):
                hint = "; separate the columns with commas"
            errors(lineno, f"{len(cells)} column(s), but the header has {len(header)} "
                           f"({','.join(header)}){hint}")
            continue
        row = dict(zip(header, cells))
        jobs_named.add(row["job"].lower())
        w = _parse_row(row, lineno, os.path.dirname(os.path.abspath(path)), local, errors)
        if w is not None:
            workers.append(w)
    return workers, jobs_named


def _check_whole_file(path, workers, jobs_named, errors):
    """One address per worker; at least one learner and one actor."""
    seen = {}
    for w in workers:
        key = (_canonical_host(w.ip), w.tf_port)
        if key in seen:
            errors(w.line, f"address {w.address} is already used on line {seen[key]}; "
                           f"give each worker its own ip:tf_port")
        else:
            seen[key] = w.line
    evaluators = [w.line for w in workers if w.job == "evaluator"]
    for line in evaluators[1:]:
        errors(line, f"a second evaluator row (the first is on line {evaluators[0]}); a run has one "
                     f"evaluator, which writes the run's eval.csv")
    if "learner" not in jobs_named:
        errors.whole_file("no learner row; add one, e.g. learner,127.0.0.1,8001,,,,")
    if "actor" not in jobs_named:
        errors.whole_file("no actor row; add at least one, e.g. actor,127.0.0.1,8002,,,,")


def _password_warnings(path, workers):
    pw_lines = [str(w.line) for w in workers if w.ssh_password]
    if not pw_lines:
        return []
    return [f"{path}: ssh_password is set on line(s) {', '.join(pw_lines)}. Passwords in files leak "
            f"easily; prefer SSH keys (the ssh_key_file column, ssh-agent, or ~/.ssh/id_*) and leave "
            f"ssh_password empty. Passwords are never printed (shown as ***)."]


def _report(path, errors) -> str:
    ordered = sorted(errors, key=lambda e: e[0] or float("inf"))  # by line; stable within a line
    return f"{len(errors)} problem(s) in workers CSV {path}:\n" + "\n".join("  " + e[1] for e in ordered)


def _canonical_host(ip: str) -> str:
    ip = ip.lower()
    return "127.0.0.1" if ip == "localhost" else ip


def _parse_row(row, lineno, csv_dir, local, err):
    """One data row -> Worker, or None after reporting its problems through err()."""
    problems = []

    def bad(column, msg):
        problems.append(column)
        err(lineno, f"column {column!r}: {msg}")

    job = row["job"].lower()
    if job not in JOBS:
        bad("job", f"{row['job']!r} is not a job; write learner, actor or evaluator")

    ip = row["ip"]
    if ip.startswith("[") and ip.endswith("]"):
        ip = ip[1:-1]
    problem = _check_host(ip)
    if problem:
        bad("ip", f"{row['ip']!r} {problem}{odd_char(ip)}")

    tf_port = _port(row["tf_port"], "tf_port", bad, required=True)
    is_local = ip.lower() in local

    cvd = row["cuda_visible_devices"]
    if cvd and cvd != "-1" and not all(_GPU_ID.match(g.strip()) for g in cvd.split(",")):
        bad("cuda_visible_devices", f"{cvd!r} is not a GPU list; leave it empty, write -1 for no GPU, "
                                    f"or GPU ids like 0 or \"0,1\"{odd_char(cvd)}")

    # A remote host's SSH columns are only demanded once its address is valid: an address
    # that is wrong already explains the row, and "remote" would be a guess.
    ssh_port, user = _ssh_login(row, ip, not is_local and not problem, bad)
    key_file = _key_file(row.get("ssh_key_file", ""), csv_dir, bad)

    if problems:
        return None
    return Worker(job=job, index=-1, line=lineno, ip=ip, tf_port=tf_port,
                  cuda_visible_devices=cvd, ssh_port=ssh_port, ssh_username=user,
                  ssh_password=row["ssh_password"], ssh_key_file=key_file, is_local=is_local)


def _ssh_login(row, ip, remote, bad):
    """(ssh_port or None, ssh_username) of a row; a remote host needs both."""
    ssh_port = _port(row["ssh_port"], "ssh_port", bad, required=False)
    user = row["ssh_username"]
    if remote:
        if not row["ssh_port"]:
            bad("ssh_port", f"empty, but {ip} is a remote host (not this machine); "
                            f"write its SSH port, usually 22")
        if not user:
            bad("ssh_username", f"empty, but {ip} is a remote host (not this machine); "
                                f"write the user to log in as")
    if user and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", user):
        bad("ssh_username", f"{user!r} is not a user name (letters, digits, _ . -)")
    return ssh_port, user


def _key_file(key_file, csv_dir, bad):
    """The ssh_key_file cell as an absolute path ("" stays ""), checked to be a readable private key."""
    if not key_file:
        return key_file
    key_path = os.path.join(csv_dir, os.path.expanduser(key_file))
    if not os.path.isfile(key_path):
        bad("ssh_key_file", f"{key_file!r}: no such file ({key_path}); give the private key's path "
                            f"(relative paths are relative to the CSV's folder)")
    elif key_path.endswith(".pub") or _looks_public(key_path):
        bad("ssh_key_file", f"{key_file!r} is a public key; give the private key (without .pub)")
    elif not os.access(key_path, os.R_OK):
        bad("ssh_key_file", f"{key_file!r} is not readable by this user")
    return os.path.abspath(key_path)


def _check_host(ip: str) -> str:
    """'' if ip is an IP address or a valid host name, else what is wrong with it."""
    if not ip:
        return "is empty; write an IP address or host name"
    try:
        ipaddress.ip_address(ip)
        return ""
    except ValueError:
        pass
    if re.match(r"^[\d.]+$", ip):
        return "is not a valid IPv4 address (four numbers 0-255 separated by dots)"
    if ":" in ip:
        return "is not a valid IPv6 address"
    labels = ip.rstrip(".").split(".")
    if len(ip) > 253 or not all(_HOSTNAME_LABEL.match(label) for label in labels):
        return "is neither an IP address nor a host name (letters, digits, - and . only)"
    return ""


def _port(value, column, bad, required):
    if not value:
        if required:
            bad(column, "empty; write a port number in 1..65535")
        return None
    if not is_digits(value) or not 1 <= int(value) <= 65535:
        bad(column, f"{value!r} is not a port; write an integer in 1..65535 in ASCII digits{odd_char(value)}")
        return None
    return int(value)


def _looks_public(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head.startswith((b"ssh-", b"ecdsa-", b"sk-ssh", b"sk-ecdsa"))
