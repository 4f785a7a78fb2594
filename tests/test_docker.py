"""docker/: the compose file and entrypoint (default suite), and the real cluster in containers
(marked `docker`: `./test.sh -m docker`).

The `docker` tests start a Docker daemon when none answers (installing docker.io,
docker-compose and debootstrap with apt when missing) and stop it afterwards; they build the
images with docker/build.sh, run `docker compose up` until the learner's progress line shows
CartPole's mean return >= 475, stop the cluster (Ctrl-C / `compose stop`), check the
checkpoint by playing it, then `down` and check that no container, network or volume of the
compose project is left, on failure too.
"""
import glob
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")
COMPOSE_FILE = os.path.join(ROOT, "docker", "docker-compose.yml")
# docker/entrypoint.py is a script inside the image, not a package: loaded from its file
_spec = importlib.util.spec_from_file_location("entrypoint", os.path.join(ROOT, "docker", "entrypoint.py"))
entrypoint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(entrypoint)


# ---------------------------------------------------------------------------
# the compose file and the entrypoint, without Docker
# ---------------------------------------------------------------------------

def experiment_flag_names():
    # in a child process: the frontend's and experiment.py's absl flags must not meet in this one
    out = subprocess.run([PY, "-c", "import json, run_experiment_mm_raw as r; "
                                    "print(json.dumps(sorted(r.experiment_flag_names())))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_compose_file_uses_only_experiment_flags_and_scales_by_one_variable():
    known = experiment_flag_names()
    with open(COMPOSE_FILE) as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    assert sorted(services) == ["actor", "learner"]
    for name, service in services.items():
        cmd = service["command"]
        assert isinstance(cmd, list), f"{name}: write the command as a list"
        for arg in cmd:
            assert arg.startswith("--"), f"{name}: {arg!r} is not a --flag"
            flag = arg[2:].split("=", 1)[0]
            assert flag in known or (flag.startswith("no") and flag[2:] in known), \
                f"service {name}: experiment.py has no flag --{flag}"
            assert flag not in ("job_name", "task", "learner_hosts", "actor_hosts"), \
                f"service {name}: --{flag} is the entrypoint's to set"
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile", "target": name}
        assert service["image"] == f"impala-{name}:latest"
        assert service["stop_signal"] == "SIGINT"
        assert service["environment"] == {"NUM_ACTORS": "${NUM_ACTORS:-2}", "NUM_LEARNERS": "${NUM_LEARNERS:-1}"}
    # learner and actors agree on the run: one flag list (train.sh's CartPole settings)
    assert services["learner"]["command"] == services["actor"]["command"]
    assert "--level_name=CartPole-v1" in services["learner"]["command"]
    # the replica count and the count every service is told come from the same variable
    assert services["actor"]["scale"] == "${NUM_ACTORS:-2}"
    assert services["learner"]["volumes"] == ["${IMPALA_RESULTS:-../results}:/app/results"]
    grace = int(services["learner"]["stop_grace_period"].rstrip("s"))
    assert grace >= 30, "the learner needs time to write its checkpoint"


def run_entrypoint(monkeypatch, env, argv=("--level_name=CartPole-v1",)):
    for k in ("IMPALA_ROLE", "NUM_ACTORS", "NUM_LEARNERS", "ACTOR_TASK", "LEARNER_HOST"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    seen = []
    monkeypatch.setattr(os, "execvp", lambda f, args: seen.append(list(args)))
    try:
        entrypoint.main(list(argv))
    except SystemExit as e:  # the mpirun supervisor's exit (patched below)
        if e.code not in (None, 0):
            raise
    assert len(seen) == 1
    return seen[0]


def test_entrypoint_learner_one_and_two_ranks(monkeypatch):
    cmd = run_entrypoint(monkeypatch, {"IMPALA_ROLE": "learner", "NUM_ACTORS": "3"})
    assert cmd[1:] == ["experiment.py", "--job_name=learner", "--learner_hosts=learner:8001",
                       "--actor_hosts=actor-0:8101,actor-1:8102,actor-2:8103", "--level_name=CartPole-v1"]
    monkeypatch.setattr(entrypoint, "supervise_mpirun", lambda cmd: os.execvp(cmd[0], cmd))
    cmd = run_entrypoint(monkeypatch, {"IMPALA_ROLE": "learner", "NUM_ACTORS": "2", "NUM_LEARNERS": "2"})
    assert cmd[0] == "mpirun" and cmd[cmd.index("-np") + 1] == "2"
    assert "--learner_hosts=learner:8001,learner:8002" in cmd and "--actor_hosts=actor-0:8101,actor-1:8102" in cmd


def test_entrypoint_actor_task_and_errors(monkeypatch, capsys):
    cmd = run_entrypoint(monkeypatch, {"IMPALA_ROLE": "actor", "NUM_ACTORS": "4", "NUM_LEARNERS": "2",
                                       "ACTOR_TASK": "3"})
    assert "--job_name=actor" in cmd and "--task=3" in cmd and "--learner_hosts=learner:8001,learner:8002" in cmd
    assert "feeds learner rank 1 of 2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        run_entrypoint(monkeypatch, {"IMPALA_ROLE": "actor", "NUM_ACTORS": "2", "ACTOR_TASK": "2"})
    assert e.value.code == 2
    assert "this is actor 2 (ACTOR_TASK) but NUM_ACTORS=2: set NUM_ACTORS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_entrypoint(monkeypatch, {"IMPALA_ROLE": "learner"}, argv=["--actor_hosts=a:1"])
    assert "--actor_hosts: the entrypoint sets this flag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_entrypoint(monkeypatch, {"IMPALA_ROLE": "learner", "NUM_ACTORS": "0"})
    assert "NUM_ACTORS='0' must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_entrypoint(monkeypatch, {})
    assert "IMPALA_ROLE='' must be learner or actor" in capsys.readouterr().err


@pytest.mark.parametrize("name,value", [("NUM_ACTORS", "¹²"), ("NUM_LEARNERS", "٣٤"), ("ACTOR_TASK", "８")])
def test_entrypoint_counts_take_ascii_digits_only(monkeypatch, capsys, name, value):
    """int() read '٣٤' as 34 and '８' as 8 (and refused '¹²' with a traceback)."""
    env = dict({"IMPALA_ROLE": "actor", "NUM_ACTORS": "100", "ACTOR_TASK": "0"}, **{name: value})
    with pytest.raises(SystemExit) as e:
        run_entrypoint(monkeypatch, env)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "docker/entrypoint.py: error: %s=%r must be an integer >= %d in ASCII digits 0-9\n" % (
        name, value, 0 if name == "ACTOR_TASK" else 1), err


def _fake_dns(answer_name):
    """A UDP DNS server on 127.0.0.1 that answers one PTR query the way Docker's does (the answer's
    owner name compressed to a pointer at the question)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)

    def serve():
        msg, peer = sock.recvfrom(512)
        end = 12
        while msg[end]:
            end += 1 + msg[end]
        question = msg[12:end + 5]
        rdata = b"".join(bytes([len(p)]) + p.encode() for p in answer_name.split(".")) + b"\0"
        reply = (msg[:2] + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0) + question
                 + struct.pack(">HHHIH", 0xC00C, 12, 1, 600, len(rdata)) + rdata)
        sock.sendto(reply, peer)
        sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1]


@pytest.mark.parametrize("name, number", [("impala_test_actor_3.impala_test_impala", 3),  # Compose v1
                                          ("proj-actor-12.proj_impala", 12),              # Compose v2
                                          ("proj-learner-1.proj_impala", None)])
def test_actor_replica_number_from_docker_dns(name, number):
    port = _fake_dns(name)
    names = entrypoint.reverse_lookup("172.18.0.5", server="127.0.0.1", port=port)
    assert names == [name]
    found = entrypoint.replica_from_names(names)
    assert (found[0] if found else None) == number


# ---------------------------------------------------------------------------
# the real cluster (marked docker)
# ---------------------------------------------------------------------------

def _sh(cmd, timeout=120, check=True, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise AssertionError("%s exited %d:\n%s%s" % (" ".join(cmd), out.returncode, out.stdout[-3000:],
                                                      out.stderr[-3000:]))
    return out


def _docker_answers():
    return shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True,
                                                     timeout=60).returncode == 0


def _compose_command():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 timeout=60).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _forward_policy():
    if not shutil.which("iptables"):
        return None
    out = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, timeout=30)
    m = re.match(r"-P FORWARD (\w+)", out.stdout)
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def docker_daemon(tmp_path_factory):
    """A Docker daemon and a compose command; installs and starts what is missing, stops what it
    started (and removes the docker0 bridge it made; its iptables chains stay, empty of
    containers). dockerd sets the iptables FORWARD policy to DROP when it starts, which cuts traffic
    between network namespaces bridged outside Docker: the policy found before is put back at once
    (Docker's own FORWARD rules accept its containers' traffic) and again after dockerd stops."""
    missing = [pkg for pkg, exe in (("docker.io", "dockerd"), ("docker-compose", None), ("debootstrap", "debootstrap"))
               if (exe and not shutil.which(exe)) or (exe is None and _compose_command() is None)]
    if missing:
        if os.geteuid() != 0:
            pytest.fail("the docker tests need %s; install them (apt-get install %s) or run as root"
                        % (", ".join(missing), " ".join(missing)))
        _sh(["apt-get", "update", "-qq"], timeout=600)
        _sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, timeout=900,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    compose = _compose_command()
    assert compose, "no `docker compose` and no `docker-compose` after installing docker-compose"
    daemon, policy, had_bridge = None, None, os.path.exists("/sys/class/net/docker0")
    if not _docker_answers():
        policy = _forward_policy()
        log = open(tmp_path_factory.mktemp("dockerd") / "dockerd.log", "w")
        daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 90
        while not _docker_answers():
            if daemon.poll() is not None or time.time() > deadline:
                log.close()
                text = open(log.name).read()[-3000:]
                if daemon.poll() is None:
                    daemon.kill()
                pytest.fail("dockerd did not start (exit %s):\n%s" % (daemon.poll(), text))
            time.sleep(1)
        if policy:
            subprocess.run(["iptables", "-P", "FORWARD", policy], timeout=30)
    try:
        yield compose
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(30)
            log.close()
            if policy:
                subprocess.run(["iptables", "-P", "FORWARD", policy], timeout=30)
            if not had_bridge and os.path.exists("/sys/class/net/docker0"):  # dockerd leaves it behind
                subprocess.run(["ip", "link", "delete", "docker0"], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def images(docker_daemon):
    start = time.time()
    out = subprocess.run([os.path.join(ROOT, "docker", "build.sh")], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, "docker/build.sh failed:\n" + out.stdout[-4000:] + out.stderr[-4000:]
    print("\ndocker/build.sh: %.0f s" % (time.time() - start))
    return docker_daemon


PROGRESS = re.compile(r"\[learner (\d+)\] frames .*?\| return\s+([-\d.]+|nan)")


def _project_leftovers(project):
    left = {}
    for what, cmd in (("containers", ["docker", "ps", "-a", "-q"]), ("networks", ["docker", "network", "ls", "-q"]),
                      ("volumes", ["docker", "volume", "ls", "-q"])):
        out = _sh(cmd + ["--filter", "label=com.docker.compose.project=" + project]).stdout.split()
        if out:
            left[what] = out
    names = _sh(["docker", "network", "ls", "--format", "{{.Name}}"]).stdout.split()
    if any(n.startswith(project + "_") for n in names):
        left.setdefault("networks", []).extend(n for n in names if n.startswith(project + "_"))
    return left


def wait_for_475(up, q, lines, start):
    """Reads `up`'s output until the learner (rank 0) reports a mean return >= 475; returns the
    learner ranks that reported progress."""
    best, ranks = float("-inf"), set()
    deadline = start + 600  # 1-5 min here on 2 shared cores; the bound is for a stuck run
    while best < 475:
        try:
            line = q.get(timeout=max(1.0, deadline - time.time()))
        except queue.Empty:
            line = None
        if line is None or time.time() > deadline:
            pytest.fail("no CartPole 475 within %.0f s (up %s); output:\n%s"
                        % (time.time() - start, "exited %s" % up.poll() if up.poll() is not None else "running",
                           "\n".join(lines[-80:])))
        m = PROGRESS.search(line)
        if m:
            ranks.add(int(m.group(1)))
            if m.group(1) == "0" and m.group(2) != "nan":
                best = max(best, float(m.group(2)))
    return ranks


def check_stopped(text, project, num_learners, num_actors, ranks):
    """The learner checkpointed at the stop and exited 0; every actor got its own task id, the actors
    were split over the ranks, every rank trained."""
    stopped = re.search(r"\[learner 0\] stopped by signal (\d+) after (\d+) frames .*; checkpoint (\S+)", text)
    assert stopped, "the learner did not report a checkpoint after the stop:\n" + "\n".join(text.splitlines()[-60:])
    assert int(stopped.group(1)) in (signal.SIGINT, signal.SIGTERM)
    learner = _sh(["docker", "ps", "-a", "-q", "--filter", "label=com.docker.compose.project=" + project,
                   "--filter", "label=com.docker.compose.service=learner"]).stdout.split()
    assert len(learner) == 1, learner
    code = _sh(["docker", "inspect", "-f", "{{.State.ExitCode}}", learner[0]]).stdout.strip()
    assert code == "0", "learner container exit code %s" % code
    tasks = sorted(int(t) for t in re.findall(r"actor task (\d+) of %d" % num_actors, text))
    assert tasks == list(range(num_actors)), tasks
    feeds = set(int(r) for r in re.findall(r"feeds learner rank (\d+) of %d" % num_learners, text))
    assert feeds == set(range(num_learners)) and ranks == set(range(num_learners)), (feeds, ranks)


def check_run_folder(results):
    """The run folder on the host holds a checkpoint, TensorBoard files and metrics, and the checkpoint
    plays well; returns its mean test return."""
    runs = glob.glob(str(results / "CartPole-v1_*"))
    assert len(runs) == 1, runs
    run = runs[0]
    assert glob.glob(os.path.join(run, "checkpoints", "ckpt-*.index")), os.listdir(run)
    assert glob.glob(os.path.join(run, "**", "events.out.tfevents.*"), recursive=True)
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    assert summary["reason"].startswith("stopped by signal") and summary["mean_return_20"] >= 400, summary
    with open(os.path.join(run, "metrics.csv")) as f:
        assert len(f.readlines()) >= 2
    played = _sh([PY, "experiment.py", "--mode=test", "--load_model_url=" + run, "--test_num_episodes=3"],
                 cwd=ROOT, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2"))
    mean = json.load(open(os.path.join(run, "test_results.json")))["mean_return"]
    # The checkpoint is the one written at the stop, some updates after the 475 report, and CartPole
    # policies swing after reaching it (one CI run played 207 from a run that had reported 475). A
    # random policy plays ~22: 150 says the container's checkpoint holds the trained policy.
    assert mean >= 150, played.stdout[-2000:]
    return mean


def tear_down(up, base, env, project):
    """Whatever happened: `up` killed, the project downed, and what `down` could not remove removed."""
    if up.poll() is None:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(30)
    subprocess.run(base + ["down", "-v", "--remove-orphans", "-t", "5"], env=env, capture_output=True, timeout=180)
    remove = {"containers": ["docker", "rm", "-f"], "networks": ["docker", "network", "rm"],
              "volumes": ["docker", "volume", "rm", "-f"]}
    for what, ids in _project_leftovers(project).items():
        subprocess.run(remove[what] + ids, capture_output=True, timeout=120)


def run_cluster(compose, tmp_path, num_learners, num_actors, stop_with):
    project = "impalatest%d_%d" % (os.getpid(), num_learners)
    results = tmp_path / "results"
    results.mkdir()
    env = dict(os.environ, NUM_ACTORS=str(num_actors), NUM_LEARNERS=str(num_learners), IMPALA_RESULTS=str(results))
    base = compose + ["-p", project, "-f", COMPOSE_FILE]
    lines, q = [], queue.Queue()
    up = subprocess.Popen(base + ["up", "--no-build", "--no-color"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def read():
        for line in up.stdout:
            lines.append(line.rstrip("\n"))
            q.put(lines[-1])
        q.put(None)

    threading.Thread(target=read, daemon=True).start()
    start = time.time()
    try:
        ranks = wait_for_475(up, q, lines, start)  # 1. up
        reached = time.time() - start
        # 2. stop: Ctrl-C on `up` (SIGINT, as a terminal sends it) or `compose stop`
        if stop_with == "sigint":
            up.send_signal(signal.SIGINT)
        else:
            _sh(base + ["stop"], env=env, timeout=180)
        up.wait(180)
        # after Ctrl-C, `up` stops showing the containers' output: read the whole logs
        text = _sh(base + ["logs", "--no-color"], env=env, timeout=120).stdout
        check_stopped(text, project, num_learners, num_actors, ranks)
        mean = check_run_folder(results)  # 3. the run folder on the host
        # 4. down leaves nothing of the project
        _sh(base + ["down", "-v", "--remove-orphans", "-t", "10"], env=env, timeout=180)
        assert _project_leftovers(project) == {}
        print("\n%d learner(s), %d actors: CartPole 475 %.0f s after `up`; played checkpoint: %.1f"
              % (num_learners, num_actors, reached, mean))
    finally:
        tear_down(up, base, env, project)


@pytest.mark.docker
@pytest.mark.timeout(2400)
def test_compose_one_learner_two_actors(images, tmp_path):
    run_cluster(images, tmp_path, num_learners=1, num_actors=2, stop_with="sigint")


@pytest.mark.docker
@pytest.mark.timeout(2400)
def test_compose_two_learner_ranks_two_actors(images, tmp_path):
    run_cluster(images, tmp_path, num_learners=2, num_actors=2, stop_with="stop")
