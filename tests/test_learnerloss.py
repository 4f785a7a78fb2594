"""The watch's decisions about a failed learner job (cluster/learnerloss.py), on a plan from a real
workers CSV and hosts that record the scripts they are given: when the job restarts, with which
learners, from what, what every actor is told, what is written and read back. tests/test_multihost.py
runs it on network-namespace hosts with the real experiment.py."""
import json
import os

import pytest
from absl import flags

from cluster import learnerloss
from cluster import plan as plan_lib
from cluster import workers_csv

FLAGS = flags.FLAGS
H1, H2, H3 = "root@10.0.0.1:22", "root@10.0.0.2:22", "root@10.0.0.3:22"


@pytest.fixture(autouse=True)
def parsed_flags():
    if not FLAGS.is_parsed():
        FLAGS(["test"])
    saved = (FLAGS.learner_restarts, FLAGS.learner_host_lost_s, FLAGS.learner_grow_back, FLAGS.tmux_sess)
    FLAGS.tmux_sess = "impala_test_no_such_session"  # learners_alive() asks this machine's tmux
    yield
    FLAGS.learner_restarts, FLAGS.learner_host_lost_s, FLAGS.learner_grow_back, FLAGS.tmux_sess = saved


class RecordingHost:
    def __init__(self, key, checkpoint=True):
        self.key, self.label, self.checkpoint, self.scripts = key, f"host {key}", checkpoint, []

    def run(self, script, timeout=120.0):
        self.scripts.append(script)
        if script.startswith("test -s "):
            return (0 if self.checkpoint else 1), "", ""
        return 0, "", ""


class Pane:
    alive = True


def make(tmp_path, checkpoint=True):
    """Learners on h1 and h2 (ranks 0, 1), actors 0-3 on h1, h2, h3, h3."""
    rows = ["job,ip,tf_port,cuda_visible_devices,ssh_port,ssh_username,ssh_password",
            "learner,10.0.0.1,8001,,22,root,", "learner,10.0.0.2,8002,,22,root,",
            "actor,10.0.0.1,9001,,22,root,", "actor,10.0.0.2,9002,,22,root,",
            "actor,10.0.0.3,9003,,22,root,", "actor,10.0.0.3,9004,,22,root,"]
    csv = tmp_path / "workers.csv"
    csv.write_text("\n".join(rows) + "\n")
    cluster = workers_csv.load(str(csv), local=["127.0.0.1"])
    plan = plan_lib.make_plan(cluster, ["--level_name=CartPole-v1"], str(tmp_path / "run"))
    os.makedirs(plan.logdir)
    hosts = {k: RecordingHost(k, checkpoint) for k in ("local", H1, H2, H3)}
    said = []
    return plan, hosts, learnerloss.LearnerLoss(plan, hosts, said.append), said


def argv(plan, name):
    return " ".join(next(w for w in plan.windows if w.name == name).argv)


def test_a_failed_job_restarts_from_the_newest_checkpoint_and_every_actor_follows(tmp_path):
    plan, hosts, loss, said = make(tmp_path)
    assert loss.on_exit("137", set(hosts))
    learners = argv(plan, "learners")
    assert "-np 2 -H 10.0.0.1:1,10.0.0.2:1" in learners
    assert f"--mode=train_w_load --load_model_url={plan.logdir}" in learners
    started = hosts["local"].scripts[-1]
    assert 'respawn-pane -k -t "=$S:"learners' in started and "--mode=train_w_load" in started
    for key, tasks in ((H1, [0]), (H2, [1]), (H3, [2, 3])):  # each actor host: its windows ended, then started
        script = hosts[key].scripts[-1]
        assert all(f'respawn-pane -k -t "=$S:"actor_{t}' in script for t in tasks), script
        assert "kill-window" in script
    assert "--mode=train_w_load" not in argv(plan, "actor_0")  # actors take the run's own flags
    assert any("the learners' mpirun exited with status 137 (restart 1/3)" in s for s in said), said
    [r] = json.load(open(learnerloss.restarts_path(plan.logdir)))["restarts"]
    assert r["learners"] == [0, 1] and r["resumed"] == os.path.join(plan.logdir, "checkpoints")


def test_a_silent_learner_host_is_left_out_and_its_actors_follow_when_it_answers(tmp_path):
    FLAGS.learner_host_lost_s = 60
    plan, hosts, loss, said = make(tmp_path)
    without_h2 = {"local", H1, H3}
    assert not loss.observe(without_h2, Pane())  # silent since the watch started, not yet lost
    loss.started -= 61
    assert loss.observe(without_h2, Pane())
    assert [w.address for w in plan.cluster.learners] == ["10.0.0.1:8001"]
    assert "--learner_hosts=10.0.0.1:8001 " in argv(plan, "actor_1") and "-np 1" in argv(plan, "learners")
    assert any("learner host host root@10.0.0.2:22 has not answered for 61 s" in s for s in said), said
    # h2's rank is not asked to end (h2 does not answer); h1's rank is, before the new job starts
    assert any('$3 == "learner"' in s for s in hosts[H1].scripts)
    assert hosts[H2].scripts == []
    # actor 1 lives on h2: it gets the new learner list once h2 answers
    FLAGS.learner_grow_back = False
    hosts[H2].scripts.clear()
    assert not loss.observe({"local", H1, H2, H3}, Pane())
    assert 'respawn-pane -k -t "=$S:"actor_1' in hosts[H2].scripts[-1]
    assert "--learner_hosts=10.0.0.1:8001 " in hosts[H2].scripts[-1]

    # --action=status in another process reads the learner list back
    again = plan_lib.make_plan(plan.cluster, ["--level_name=CartPole-v1"], plan.logdir)
    again.csv_learners = plan.csv_learners
    learnerloss.apply_restarts(again, learnerloss.read_restarts(plan.logdir))
    assert argv(again, "learners") == argv(plan, "learners")


def test_a_host_that_answers_again_has_its_stale_rank_ended_and_the_job_grows_back(tmp_path):
    FLAGS.learner_host_lost_s = 10
    plan, hosts, loss, said = make(tmp_path)
    loss.started -= 11
    assert loss.observe({"local", H1, H3}, Pane())
    hosts[H1].scripts.clear()
    assert loss.observe(set(hosts), Pane())  # h2 is back: grow to 2 ranks
    assert '$3 == "learner"' in hosts[H2].scripts[0]  # its stale rank ended first
    assert any("kill -INT" in s for s in hosts[H1].scripts)  # the running rank interrupted (a checkpoint)
    assert "-np 2" in argv(plan, "learners")
    assert loss.failures == 1  # growing back is not a failure
    assert [r.learners for r in learnerloss.read_restarts(plan.logdir)] == [[0], [0, 1]]


def test_a_host_back_that_cannot_end_its_stale_rank_yet_is_tried_again_at_the_next_poll(tmp_path):
    FLAGS.learner_host_lost_s = 10
    plan, hosts, loss, said = make(tmp_path)
    loss.started -= 11
    assert loss.observe({"local", H1, H3}, Pane())
    refuse = hosts[H2].run
    hosts[H2].run = lambda script, timeout=0: (1, "", "Connect failed") if '$3 == "learner"' in script \
        else refuse(script, timeout)
    assert not loss.observe(set(hosts), Pane())
    assert "-np 1" in argv(plan, "learners")
    hosts[H2].run = refuse
    assert loss.observe(set(hosts), Pane())
    assert "-np 2" in argv(plan, "learners")


def test_no_checkpoint_yet_restarts_from_the_start(tmp_path):
    plan, hosts, loss, said = make(tmp_path, checkpoint=False)
    assert loss.on_exit("1", set(hosts))
    assert "--mode=train_w_load" not in argv(plan, "learners")
    assert any("from the start (no checkpoint was written yet)" in s for s in said), said


def test_what_a_restart_cannot_mend_and_the_limit_end_the_run(tmp_path):
    FLAGS.learner_restarts = 1
    plan, hosts, loss, said = make(tmp_path)
    assert not loss.on_exit("0", set(hosts))  # finished
    assert not loss.on_exit("2", set(hosts)) and not loss.on_exit("7", set(hosts))
    assert "not restarting them" in said[-1]
    assert loss.on_exit("137", set(hosts))
    assert not loss.on_exit("137", set(hosts))
    assert "--learner_restarts=1" in said[-1]
    FLAGS.learner_restarts = 0
    (tmp_path / "b").mkdir()
    plan, hosts, loss, said = make(tmp_path / "b")
    assert not loss.on_exit("137", set(hosts))


def test_a_corrupt_restarts_file_is_named_in_one_line(tmp_path):
    plan, hosts, loss, said = make(tmp_path)
    with open(learnerloss.restarts_path(plan.logdir), "w") as f:
        f.write('{"restarts": [{"learners": [5]}]}')
    with pytest.raises(ValueError, match=r"learner_restarts.json: not a list of learner restarts"):
        learnerloss.read_restarts(plan.logdir)
    with open(learnerloss.restarts_path(plan.logdir), "w") as f:
        json.dump({"restarts": [dict(time=0, learners=[5], hosts=[], why="", resumed="")]}, f)
    with pytest.raises(ValueError, match=r"learners \[5\] do not fit the workers CSV's 2 learner row"):
        learnerloss.apply_restarts(plan, learnerloss.read_restarts(plan.logdir))
