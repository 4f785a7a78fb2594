"""One rule for the recurrent state everywhere: it restarts where an episode ends as the env reports
it (game over, a time limit, an env made anew), never at a lost life. The actors, the learner's
unroll, the evaluator and --mode=test (impala.evaluator.play_episodes) and the standalone player of
exported policies are each driven through a lost life in Breakout, and each must carry the LSTM
state across it. A lost life still ends the learner's discounting in training (`done`)."""
import importlib.util
import os

import numpy as np
import pytest
import tensorflow as tf

from envs import batch as env_batch
from impala import actor
from impala import agent as agent_lib
from impala import evaluator
from impala import export
from impala.timings import Timings

LEVEL, FRAME, T = "BreakoutNoFrameskip-v4", (42, 42), 40
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _agent():
    tf.random.set_seed(5)
    return agent_lib.build_agent(LEVEL, "ResNetLSTMAgent", T, FRAME)


def _unroll_through_a_lost_life(backend, agent, spec, env_spec):
    """Unrolls of one training env until one holds a lost life; returns that unroll's buffer."""
    batch = env_batch.make_batch(backend, LEVEL, 1, seed=2, training=True, frame_size=FRAME)
    group = actor.EnvGroup(batch, slice(0, 1), env_spec.obs_shape, env_spec.obs_dtype, agent.initial_state(1))
    buf = {f.name: np.zeros((1,) + f.shape, f.dtype) for f in spec.fields}
    step = actor.make_step(agent, 1, env_spec)
    try:
        for _ in range(40):
            start_state = [s.numpy().copy() for s in tf.nest.flatten(group.state)]
            actor.fill_unroll([group], buf, step, T, Timings(*actor.PHASES))
            if (buf["done"] & ~buf["episode_end"]).any():
                return buf, start_state
    finally:
        batch.close()
    pytest.fail("no lost life in 40 unrolls of %d steps" % T)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_actor_and_learner_carry_the_state_across_a_lost_life(backend):
    agent, spec, env_spec = _agent()
    buf, start_state = _unroll_through_a_lost_life(backend, agent, spec, env_spec)
    lost = np.flatnonzero(buf["done"][0] & ~buf["episode_end"][0])
    assert not buf["first"][0, lost + 1].any(), "the actor restarted the state at a lost life"
    np.testing.assert_array_equal(buf["first"][0, 1:][buf["episode_end"][0]], True)
    # the learner's unroll of the same unroll (time-major) acts as the actor acted, step for step
    obs = tf.constant(np.swapaxes(buf["observation"], 0, 1))
    first = tf.constant(np.swapaxes(buf["first"], 0, 1))
    state = tf.nest.pack_sequence_as(agent.initial_state(1), [tf.constant(s) for s in start_state])
    out, _ = agent.unroll(obs, first, state)
    np.testing.assert_allclose(out.policy_logits.numpy()[:T, 0], buf["behaviour_logits"][0], atol=2e-4)


def _firsts_and_lives(run_one_game):
    """(first flags, lives) as seen at each step of one game played by run_one_game(record)."""
    firsts, lives = [], []
    run_one_game(lambda first, life: (firsts.append(bool(first)), lives.append(life)))
    return np.array(firsts), np.array(lives)


def _check_one_game(firsts, lives):
    lost = np.flatnonzero(np.diff(lives) < 0) + 1  # the first step after each lost life
    assert len(lost) >= 1, "the game lost no life"
    assert firsts[0] and not firsts[1:].any(), "the state restarted inside a game (steps %s; lives lost at %s)" % (
        np.flatnonzero(firsts[1:]) + 1, lost)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_evaluation_and_test_mode_carry_the_state_across_a_lost_life(backend):
    agent, _, _ = _agent()
    env = evaluator.EvalEnv(LEVEL, backend, seed=4, frame_size=FRAME)
    act = evaluator.make_policy(agent, "sample")

    def one_game(record):
        def policy(o, f, s):
            record(f.numpy()[0], env.lives())
            return act(o, f, s)
        evaluator.play_episodes(policy, agent, env, 1, log=lambda line: None)

    try:
        _check_one_game(*_firsts_and_lives(one_game))
    finally:
        env.close()


def test_the_standalone_player_carries_the_state_across_a_lost_life():
    spec_ = importlib.util.spec_from_file_location("play_policy", os.path.join(ROOT, "sandbox", "play_policy.py"))
    player = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(player)
    _, _, env_spec = _agent()
    info = {"env_id": LEVEL, "recurrent": True, "env_wrappers": export.env_wrappers(LEVEL, FRAME),
            "observation": {"shape": list(env_spec.obs_shape), "dtype": "uint8"},
            "action_space": {"type": "Discrete", "n": 4, "dtype": "int32"}}
    env = player.make_env(info)
    rng = np.random.default_rng(0)

    def one_game(record):
        def serve(observation, deterministic, first, lstm_hidden, lstm_cell):
            record(first.numpy()[0], env.unwrapped.ale.lives())
            return {"action": tf.constant([rng.integers(4)]), "value": tf.zeros([1]),
                    "lstm_hidden": lstm_hidden, "lstm_cell": lstm_cell}
        initial = lambda batch_size: {"lstm_hidden": tf.zeros([1, 8]), "lstm_cell": tf.zeros([1, 8])}
        player.play(info, serve, initial, env, 1, False, seed=4)

    try:
        _check_one_game(*_firsts_and_lives(one_game))
    finally:
        env.close()


def test_lstm_state_tool_measures_a_cell_that_counts_steps(tmp_path):
    """bench/lstm_state.py on a checkpoint whose LSTM adds 1 to every cell each step (input, forget
    and candidate gates saturated open, whatever the input): |cell| is the step number in every unit,
    and three of the four gates' inputs (those at 20, not the output gate's at 0) are past |5|."""
    import json
    import subprocess
    import sys
    agent, _, _ = agent_lib.build_agent("CartPole-v1", "MLPLSTMAgent", 20)
    for v in agent.variables:
        if "/lstm/w_" in v.name:
            v.assign(tf.zeros_like(v))
        elif "/lstm/b" in v.name:  # Sonnet's gate order: input, forget, candidate, output
            h = v.shape[0] // 4
            v.assign(tf.constant([20.0] * (3 * h) + [0.0] * h))
    tf.train.CheckpointManager(tf.train.Checkpoint(agent=agent), str(tmp_path / "checkpoints"), 1).save()
    (tmp_path / "options.json").write_text(json.dumps({"level_name": "CartPole-v1", "agent_name": "MLPLSTMAgent",
                                                         "lstm_input_norm": True}))
    out = tmp_path / "state.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lstm_state.py"), str(tmp_path), "--games", "2",
                    "--steps", "1", "4", "8", "--out", str(out)], cwd=ROOT, check=True, timeout=120)
    games = json.loads(out.read_text())
    assert len(games) == 2 and all(g["length"] >= 8 and g["points"] == "" for g in games), games
    for g in games:
        for step, f in g["steps"].items():
            assert abs(f["median"] - int(step)) < 1e-3 and abs(f["max"] - int(step)) < 1e-3, (step, f)
            assert f["saturated"] == (256 if int(step) > 3 else 0) and f["over_100"] == 0 and f["units"] == 256
            assert f["gates_past_5"] == 0.75 and f["feature_norm"] > 0  # input, forget, candidate at 20; output at 0
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lstm_state.py"), str(tmp_path), "--untrained",
                    "--games", "1", "--steps", "8", "--out", str(out)], cwd=ROOT, check=True, timeout=120)
    fresh = json.loads(out.read_text())[0]["steps"]["8"]  # the same flags' net before training: no switches
    assert fresh["gates_past_5"] < 0.05 and fresh["max"] < 8, fresh
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lstm_state.py"), str(tmp_path / "nothing")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "does not exist" in bad.stderr
    # an options.json from before the layer norm was the default: rebuilt without it, so refused in a line
    (tmp_path / "options.json").write_text(json.dumps({"level_name": "CartPole-v1", "agent_name": "MLPLSTMAgent"}))
    older = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lstm_state.py"), str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert older.returncode != 0 and "Traceback" not in older.stderr, older.stderr
    assert "holds agent/_input_norm" in older.stderr and "pass --lstm_input_norm" in older.stderr, older.stderr
