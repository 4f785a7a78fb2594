"""workers_csv.py: every malformed CSV gives one clear error naming the line and column,
the frontend then exits 2 without starting anything; good CSVs parse and assign actors
round-robin."""
import os
import subprocess
import sys
import unicodedata
import uuid

import pytest

import sshd_fixture
from cluster import workers_csv
from cluster.workers_csv import WorkersCsvError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H = "job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password"
HK = H + ",ssh_key_file"
L = "learner,127.0.0.1,8001,,,,"
A = "actor,127.0.0.1,8002,,,,"
LOCAL = {"127.0.0.1", "localhost", "::1"}

# (id, file text, [substrings the error must contain]). "{dir}" is the CSV's folder.
MALFORMED = [
    ("bad_job", [H, L, "worker,127.0.0.1,8002,,,,"],
     [":3: column 'job': 'worker' is not a job; write learner, actor or evaluator"]),
    ("bad_ipv4", [H, L, A, "actor,10.0.0.300,8003,,22,ubuntu,"],
     [":4: column 'ip': '10.0.0.300' is not a valid IPv4 address"]),
    ("bad_hostname", [H, L, "actor,my host,8002,,22,ubuntu,"],
     [":3: column 'ip': 'my host' is neither an IP address nor a host name"]),
    ("empty_ip", [H, L, "actor,,8002,,,,"], [":3: column 'ip': '' is empty"]),
    ("port_not_a_number", [H, L, "actor,127.0.0.1,http,,,,"],
     [":3: column 'tf_port': 'http' is not a port; write an integer in 1..65535"]),
    ("port_zero", [H, "learner,127.0.0.1,0,,,,", A], [":2: column 'tf_port': '0' is not a port"]),
    ("port_too_big", [H, L, "actor,127.0.0.1,70000,,,,"], [":3: column 'tf_port': '70000' is not a port"]),
    ("port_empty", [H, L, "actor,127.0.0.1,,,,,"], [":3: column 'tf_port': empty"]),
    ("port_negative", [H, L, "actor,127.0.0.1,-5,,,,"], [":3: column 'tf_port': '-5' is not a port"]),
    ("port_fullwidth_digits", [H, L, "actor,127.0.0.1,８００２,,,,"],
     [":3: column 'tf_port': '８００２' is not a port; write an integer in 1..65535 in ASCII digits "
      "('８' is FULLWIDTH DIGIT EIGHT)"]),
    ("duplicate_address", [H, L, A, "actor,127.0.0.1,8001,,,,"],
     [":4: address 127.0.0.1:8001 is already used on line 2"]),
    ("duplicate_via_localhost", [H, L, "actor,localhost,8001,,,,"],
     [":3: address localhost:8001 is already used on line 2"]),
    ("no_learner", [H, A], ["no learner row"]),
    ("no_actor", [H, L], ["no actor row"]),
    ("remote_without_user", [H, L, "actor,10.0.0.7,8002,,22,,"],
     [":3: column 'ssh_username': empty, but 10.0.0.7 is a remote host"]),
    ("remote_without_ssh_port", [H, L, "actor,10.0.0.7,8002,,,ubuntu,"],
     [":3: column 'ssh_port': empty, but 10.0.0.7 is a remote host", "usually 22"]),
    ("bad_ssh_port", [H, L, "actor,10.0.0.7,8002,,22x,ubuntu,"], [":3: column 'ssh_port': '22x' is not a port"]),
    ("bad_ssh_username", [H, L, "actor,10.0.0.7,8002,,22,bad user!,"],
     [":3: column 'ssh_username': 'bad user!' is not a user name"]),
    ("too_few_columns", [H, L, "actor,127.0.0.1,8002,,,"], [":3: 6 column(s), but the header has 7"]),
    ("too_many_columns", [H, L, "actor,127.0.0.1,8002,,,,,"], [":3: 8 column(s), but the header has 7"]),
    ("unknown_header_column", ["job,ip,tf_port,gpus,ssh_port,ssh_username,ssh_password", L, A],
     [":1: unknown header column 'gpus'", ":1: header lacks column(s) cuda_visible_devices"]),
    ("extra_header_column", [H + ",comment", L + ",x", A + ",y"],
     [":1: unknown header column 'comment'; valid columns: job, ip, tf_port"]),
    ("duplicate_header_column", [H + ",ip", L + ",", A + ","], [":1: header column(s) ip appear more than once"]),
    ("no_header", [L, A], [":1: this is a data row, but the first line must be the header: job, ip, tf_port"]),
    ("empty_file", [], ["no header line; the first line must be: job, ip, tf_port"]),
    ("only_comments", ["# nothing here", "   ", "# still nothing"], ["no header line"]),
    ("tab_separated", [H.replace(",", "\t"), L.replace(",", "\t")], ["separated by commas, not tabs"]),
    ("semicolon_row", [H, L, "actor;127.0.0.1;8002;;;;"],
     [":3: 1 column(s), but the header has 7", "separate the columns with commas"]),
    ("bad_cuda_visible_devices", [H, "learner,127.0.0.1,8001,gpu0,,,", A],
     [":2: column 'cuda_visible_devices': 'gpu0' is not a GPU list"]),
    ("key_file_missing", [HK, L + ",", "actor,10.0.0.7,8002,,22,ubuntu,,no_such_key"],
     [":3: column 'ssh_key_file': 'no_such_key': no such file ({dir}/no_such_key)"]),
    ("key_file_is_public", [HK, L + ",", "actor,10.0.0.7,8002,,22,ubuntu,,id_test.pub"],
     [":3: column 'ssh_key_file': 'id_test.pub' is a public key; give the private key"]),
    ("many_problems_at_once", [H, "learner,127.0.0.1,80a1,,,,", "actor,300.1.1.1,8002,,,,", "actor,127.0.0.1",
                               "spy,127.0.0.1,8004,,,,"],
     ["4 problem(s)", ":2: column 'tf_port'", ":3: column 'ip'", ":4: 2 column(s)", ":5: column 'job'"]),
]


def write(tmp_path, lines, name="workers.csv"):
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + ("\n" if lines else ""))
    with open(os.path.join(str(tmp_path), "id_test.pub"), "w") as f:
        f.write("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB test\n")
    return path


@pytest.mark.parametrize("lines,needles", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_csv_names_the_line_and_column(tmp_path, lines, needles):
    path = write(tmp_path, lines)
    with pytest.raises(WorkersCsvError) as e:
        workers_csv.load(path, local=LOCAL)
    msg = str(e.value)
    for needle in needles:
        assert needle.format(dir=str(tmp_path)) in msg, msg
    assert path in msg  # every problem names the file (path:line: ...)


@pytest.mark.parametrize("lines,needles", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_frontend_starts_nothing_with_a_malformed_csv(tmp_path, lines, needles):
    path = write(tmp_path, lines)
    sock = f"impala_csvtest_{uuid.uuid4().hex[:8]}"
    logdir = os.path.join(str(tmp_path), "run")
    try:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "run_experiment_mm_raw.py"),
                            f"--workers_csv_path={path}", f"--tmux_socket={sock}", f"--logdir={logdir}",
                            "--level_name=CartPole-v1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stdout + p.stderr
        assert needles[0].format(dir=str(tmp_path)) in p.stderr, p.stderr
        tmux = subprocess.run(["tmux", "-L", sock, "ls"], capture_output=True, text=True)
        assert tmux.returncode != 0, "a tmux server was started: " + tmux.stdout
        assert not os.path.exists(logdir)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
        socket_file = os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", sock)
        if os.path.exists(socket_file):
            os.unlink(socket_file)


def test_good_csv_with_bom_crlf_spaces_comments_and_quotes(tmp_path):
    text = ("\ufeff# a comment before the header\r\n"
            " job , ip , tf_port , cuda_visible_devices , ssh_port , ssh_username , ssh_password \r\n"
            "\r\n"
            "Learner, 127.0.0.1 ,8001,\"0,1\",,,\r\n"
            "   # an indented comment\r\n"
            "actor,10.0.0.7,8002,-1,22,ubuntu,\r\n"
            "actor,127.0.0.1,8003,,,,\r\n")
    path = os.path.join(str(tmp_path), "w.csv")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    c = workers_csv.load(path, local=LOCAL)
    assert [(w.job, w.index, w.line) for w in c.learners + c.actors] == \
        [("learner", 0, 4), ("actor", 0, 6), ("actor", 1, 7)]
    learner, remote, local = c.learners[0], c.actors[0], c.actors[1]
    assert learner.cuda_visible_devices == "0,1" and learner.ip == "127.0.0.1" and learner.is_local
    assert not remote.is_local and remote.ssh_port == 22 and remote.ssh_username == "ubuntu"
    assert remote.ssh_target == "ubuntu@10.0.0.7 port 22" and local.ssh_target == "this machine"
    assert c.learner_hosts == "127.0.0.1:8001"
    assert c.actor_hosts == "10.0.0.7:8002,127.0.0.1:8003"
    assert c.warnings == []


def test_round_robin_assignment(tmp_path):
    rows = [H] + [f"learner,127.0.0.1,{8000 + r},,,," for r in range(2)] + \
        [f"actor,127.0.0.1,{9000 + i},,,," for i in range(5)]
    c = workers_csv.load(write(tmp_path, rows), local=LOCAL)
    groups = [(learner.index, [a.index for a in actors]) for learner, actors in c.assignment()]
    assert groups == [(0, [0, 2, 4]), (1, [1, 3])]  # actor i -> learner i % K
    # more learners than actors: the extra learner gets none
    three = workers_csv.assign(c.actors[:2], c.actors[:3])
    assert [len(actors) for _, actors in three] == [1, 1, 0]
    with pytest.raises(ValueError):
        workers_csv.assign(c.actors, [])


def test_password_warns_once_and_is_never_shown(tmp_path):
    rows = [H, L, "actor,10.0.0.7,8002,,22,ubuntu,hunter2", "actor,10.0.0.8,8003,,22,ubuntu,hunter3"]
    c = workers_csv.load(write(tmp_path, rows), local=LOCAL)
    assert len(c.warnings) == 1
    assert "line(s) 3, 4" in c.warnings[0] and "prefer SSH keys" in c.warnings[0]
    assert "hunter" not in c.warnings[0]
    w = c.actors[0]
    assert w.ssh_password == "hunter2"
    assert "hunter2" not in repr(w) and w.masked()["ssh_password"] == "***"


def test_frontend_dry_run_masks_the_password(tmp_path):
    # free ports: the dry run checks that the learner's is free, and 8001 is any default run's
    learner, actor = sshd_fixture.free_port(), sshd_fixture.free_port()
    rows = [H, f"learner,127.0.0.1,{learner},,22,root,hunter2", f"actor,127.0.0.1,{actor},,,,"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "run_experiment_mm_raw.py"),
                        f"--workers_csv_path={write(tmp_path, rows)}", "--nocheck_flags", "--dry_run",
                        f"--tmux_socket=impala_csvtest_{uuid.uuid4().hex[:8]}",
                        f"--logdir={tmp_path}/run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "hunter2" not in p.stdout + p.stderr
    assert "ssh_password is set on line(s) 2" in p.stderr


def test_key_file_paths_relative_to_the_csv_and_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "cluster_key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    monkeypatch.setenv("HOME", str(home))
    rows = [HK, "learner,127.0.0.1,8001,,,,,", "actor,10.0.0.7,8002,,22,u,,~/.ssh/id_ed25519",
            "actor,10.0.0.8,8003,,22,u,,keys/cluster_key"]
    c = workers_csv.load(write(tmp_path, rows), local=LOCAL)
    assert c.actors[0].ssh_key_file == str(home / ".ssh" / "id_ed25519")
    assert c.actors[1].ssh_key_file == str(tmp_path / "keys" / "cluster_key")


def test_ipv6_and_hostnames(tmp_path):
    rows = [H, "learner,::1,8001,,,,", "actor,[::1],8002,,,,", "actor,node-7.cluster.local,8003,,2222,me,"]
    c = workers_csv.load(write(tmp_path, rows), local=LOCAL)
    assert c.learner_hosts == "[::1]:8001"
    assert c.actors[0].is_local and c.actors[0].address == "[::1]:8002"
    assert not c.actors[1].is_local and c.actors[1].address == "node-7.cluster.local:8003"


def test_this_machines_addresses_are_local():
    local = workers_csv.local_addresses()
    assert {"127.0.0.1", "localhost"} <= local
    assert "127.0.0.2" not in local  # the frontend tests use it as a "remote" host


def test_sandbox_examples_parse(tmp_path, monkeypatch):
    c = workers_csv.load(os.path.join(ROOT, "sandbox", "local_workers_example.csv"))
    assert len(c.learners) == 1 and len(c.actors) == 2
    assert all(w.is_local for w in c.learners + c.actors)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    monkeypatch.setenv("HOME", str(home))
    c = workers_csv.load(os.path.join(ROOT, "sandbox", "two_host_workers_example.csv"), local={"10.0.0.1"})
    assert len(c.learners) == 2 and len(c.actors) >= 4
    assert {w.is_local for w in c.learners + c.actors} == {True, False}
    assert all(w.ssh_key_file for w in c.actors if not w.is_local)
    assert c.warnings == []


# str.isdigit() passes all three; int() reads '٣٤' as 34 and '８０' as 80 and refuses '¹²' with a traceback
@pytest.mark.parametrize("value", ["¹²", "٣٤", "８０"])
@pytest.mark.parametrize("column,row", [("tf_port", "actor,127.0.0.1,{},,,,"),
                                        ("ssh_port", "actor,10.0.0.7,8002,,{},ubuntu,"),
                                        ("cuda_visible_devices", "actor,127.0.0.1,8002,{},,,")])
def test_digits_of_other_scripts_are_no_numbers(tmp_path, column, row, value):
    path = write(tmp_path, [H, L, row.format(value)])
    with pytest.raises(WorkersCsvError) as e:
        workers_csv.load(path, local=LOCAL)
    problems = str(e.value).splitlines()[1:]
    assert len(problems) == 1, problems
    assert problems[0].startswith("  %s:3: column %r: %r is not a " % (path, column, value)), problems
    assert problems[0].endswith("(%r is %s)" % (value[0], unicodedata.name(value[0]))), problems
