"""Fault injection on a real local cluster (bench/faults.py's scenarios, each asserted):
a killed actor is reported and the run goes on; a killed learner is resumed by
train_w_load and the same actors reconnect; a full checkpoint disk is an error line,
not a crash, and the previous checkpoint survives; a truncated newest checkpoint is
skipped on resume; a killed Horovod rank stops the whole run and it resumes."""
import os

import pytest

from bench import faults
from tests.test_experiment import _free_base_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check(result):
    assert result["ok"], result


@pytest.mark.slow  # a run with an actor killed mid-way, about 25 s
def test_killed_actor_is_reported_and_training_goes_on(tmp_path):
    r = faults.scenario_kill_actor(_free_base_port(), str(tmp_path))
    _check(r)
    assert r["detected_s"] < 5 + 3  # --actor_timeout_s=5, checked once a second


@pytest.mark.slow  # the default suite resumes a stopped run in test_experiment.py
def test_killed_learner_resumes_and_actors_reconnect(tmp_path):
    _check(faults.scenario_kill_learner(_free_base_port(), str(tmp_path)))


@pytest.mark.slow  # a whole run against a full disk
def test_full_checkpoint_disk_is_reported_and_old_checkpoint_intact(tmp_path):
    r = faults.scenario_checkpoint_disk_full(_free_base_port(), str(tmp_path))
    if r["what_happened"].startswith("SKIPPED"):
        pytest.skip(r["what_happened"])
    _check(r)


@pytest.mark.slow  # the replay fallback below also truncates the newest checkpoint and resumes
def test_truncated_newest_checkpoint_is_skipped_on_resume(tmp_path):
    _check(faults.scenario_truncated_checkpoint(_free_base_port(), str(tmp_path)))


@pytest.mark.slow  # the default suite has the buffer's round trip in test_learner.py
def test_a_resume_that_falls_back_gets_that_checkpoints_replay_buffer(tmp_path):
    _check(faults.scenario_resume_fallback_replay(_free_base_port(), str(tmp_path)))


@pytest.mark.slow  # a whole run with a backstop, about 13 s
def test_enqueues_cut_by_the_backstop_are_not_trained_twice(tmp_path):
    _check(faults.scenario_partial_accept(_free_base_port(), str(tmp_path)))


@pytest.mark.long
def test_killed_horovod_rank_stops_run_then_resumes(tmp_path):
    _check(faults.scenario_kill_horovod_rank(_free_base_port(), str(tmp_path)))
