"""The watch's decisions about a lost actor host (cluster/hostloss.py), on a plan from a real
workers CSV and hosts that record the scripts they are given: when a host counts as lost,
where its actors go, what is written and read back, what happens when it answers again.
tests/test_multihost.py runs the same on network-namespace hosts with real SSH and tmux."""
import json
import os

import pytest
from absl import flags

from cluster import hostloss
from cluster import plan as plan_lib
from cluster import workers_csv

FLAGS = flags.FLAGS


@pytest.fixture(autouse=True)
def parsed_flags():
    if not FLAGS.is_parsed():
        FLAGS(["test"])
    saved = FLAGS.actor_host_lost_s
    yield
    FLAGS.actor_host_lost_s = saved


class RecordingHost:
    def __init__(self, key, fail=False):
        self.key, self.label, self.fail, self.scripts = key, f"host {key}", fail, []

    def run(self, script, timeout=120.0):
        self.scripts.append(script)
        return (1, "", "tmux: no server") if self.fail else (0, "", "")


def make(tmp_path, actor_ips=("10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.4"), evaluator_ip=None):
    rows = ["job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password",
            "learner,10.0.0.1,8001,,22,root,"]
    rows += [f"actor,{ip},{9001 + i},,22,root," for i, ip in enumerate(actor_ips)]
    rows += [f"evaluator,{evaluator_ip},9100,,22,root,"] if evaluator_ip else []
    csv = tmp_path / "workers.csv"
    csv.write_text("\n".join(rows) + "\n")
    cluster = workers_csv.load(str(csv), local=["127.0.0.1"])
    plan = plan_lib.make_plan(cluster, [], str(tmp_path / "run"))
    os.makedirs(plan.logdir)
    hosts = {"local": RecordingHost("local")}
    ips = set(actor_ips) | {"10.0.0.1"} | ({evaluator_ip} if evaluator_ip else set())
    hosts.update({f"root@{ip}:22": RecordingHost(f"root@{ip}:22") for ip in ips})
    said = []
    return plan, hosts, hostloss.HostLoss(plan, hosts, said.append), said


def answering(hosts, *silent):
    return {k for k in hosts if k not in {f"root@{ip}:22" for ip in silent}}


def test_a_host_silent_for_the_wait_has_its_actors_started_on_the_least_loaded_others(tmp_path):
    FLAGS.actor_host_lost_s = 30
    plan, hosts, loss, said = make(tmp_path)
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == set()  # silent since the watch started, not yet lost
    loss.started -= 31
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == {"actor_2", "actor_3"}
    where = {w.name: w.host for w in plan.actor_windows}
    assert where == {"actor_0": "root@10.0.0.2:22", "actor_1": "root@10.0.0.3:22",
                     "actor_2": "root@10.0.0.2:22", "actor_3": "root@10.0.0.3:22"}
    started = hosts["root@10.0.0.2:22"].scripts[-1]
    assert "respawn-pane -k -t \"=$S:\"actor_2" in started and "--task=2" in started and "actor-2" in started
    assert any("actor host lost: host root@10.0.0.4:22 has not answered for 31 s" in s for s in said), said
    moves = json.load(open(hostloss.moves_path(plan.logdir)))["moves"]
    assert [(m["actor"], m["from_key"], m["to_key"]) for m in moves] == [
        ("actor_2", "root@10.0.0.4:22", "root@10.0.0.2:22"), ("actor_3", "root@10.0.0.4:22", "root@10.0.0.3:22")]
    # a later poll moves nothing more; the lost host's learner-less status is not asked again
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == set()

    # --action=status in another process reads the moves back
    again = plan_lib.make_plan(plan.cluster, [], plan.logdir)
    hostloss.apply_moves(again, hostloss.read_moves(plan.logdir))
    assert {w.name: w.host for w in again.actor_windows} == where


def test_a_lost_evaluator_host_has_its_evaluator_started_on_an_actor_host_and_its_copy_ended_later(tmp_path):
    FLAGS.actor_host_lost_s = 30
    plan, hosts, loss, said = make(tmp_path, actor_ips=("10.0.0.2", "10.0.0.2", "10.0.0.3"), evaluator_ip="10.0.0.5")
    loss.started -= 31
    assert loss.observe(answering(hosts, "10.0.0.5"), {}) == {"evaluator_0"}
    assert [w.host for w in plan.evaluator_windows] == ["root@10.0.0.3:22"]  # the actor host with fewer workers
    started = hosts["root@10.0.0.3:22"].scripts[-1]
    assert "--job_name=evaluator" in started
    assert any("evaluator host lost: host root@10.0.0.5:22 has not answered for 31 s (--actor_host_lost_s); "
               "moving its evaluator" in s for s in said), said
    again = plan_lib.make_plan(plan.cluster, [], plan.logdir)  # --action=status reads the move back
    hostloss.apply_moves(again, hostloss.read_moves(plan.logdir))
    assert [w.host for w in again.evaluator_windows] == ["root@10.0.0.3:22"]
    loss.observe(answering(hosts), {("root@10.0.0.5:22", "evaluator_0"): object()})  # back: its copy goes
    assert 'kill-window -t "=$S:"evaluator_0' in hosts["root@10.0.0.5:22"].scripts[-1]
    assert any("evaluator: ended its stale copy on host root@10.0.0.5:22" in s for s in said), said


def test_a_host_that_answers_again_loses_only_its_copies_of_moved_actors(tmp_path):
    FLAGS.actor_host_lost_s = 5
    plan, hosts, loss, said = make(tmp_path, actor_ips=("10.0.0.2", "10.0.0.3", "10.0.0.3"))
    loss.started -= 6
    loss.observe(answering(hosts, "10.0.0.3"), {})
    back = hosts["root@10.0.0.3:22"]
    panes = {("root@10.0.0.3:22", "actor_1"): object(), ("root@10.0.0.3:22", "actor_2"): object()}
    assert loss.observe(answering(hosts), panes) == set()
    script = back.scripts[-1]
    assert 'kill-window -t "=$S:"actor_1' in script and 'kill-window -t "=$S:"actor_2' in script
    assert any("answers again after" in s for s in said) and any("actor 1: ended its stale copy" in s for s in said)


def test_with_no_other_actor_host_the_actors_wait_for_theirs(tmp_path):
    FLAGS.actor_host_lost_s = 5
    plan, hosts, loss, said = make(tmp_path, actor_ips=("10.0.0.4", "10.0.0.4"))
    loss.started -= 6
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == set()
    assert {w.host for w in plan.actor_windows} == {"root@10.0.0.4:22"}
    assert any("no other actor host answers: the actors of host root@10.0.0.4:22 wait" in s for s in said), said
    assert not os.path.exists(hostloss.moves_path(plan.logdir))


def test_a_start_that_fails_on_the_target_keeps_the_actor_where_it_was(tmp_path):
    FLAGS.actor_host_lost_s = 5
    plan, hosts, loss, said = make(tmp_path, actor_ips=("10.0.0.2", "10.0.0.4"))
    hosts["root@10.0.0.2:22"].fail = True
    loss.started -= 6
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == set()
    assert plan.actor_windows[1].host == "root@10.0.0.4:22"
    assert any("could not start it on host root@10.0.0.2:22: tmux: no server" in s for s in said), said
    hosts["root@10.0.0.2:22"].fail = False  # the next poll tries again
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == {"actor_1"}
    assert sum("actor host lost" in s for s in said) == 1, said


def test_zero_never_moves_and_a_bad_moves_file_is_one_line(tmp_path):
    FLAGS.actor_host_lost_s = 0
    plan, hosts, loss, said = make(tmp_path)
    loss.started -= 3600
    assert loss.observe(answering(hosts, "10.0.0.4"), {}) == set() and said == []
    with open(hostloss.moves_path(plan.logdir), "w") as f:
        f.write('{"moves": [{"actor": "actor_2"}]}')
    with pytest.raises(ValueError, match=r"actor_moves.json: not a list of actor moves .*move it aside"):
        hostloss.read_moves(plan.logdir)
