"""nets/: shapes of each agent, LSTM reset on `first`, gradients, make_agent errors."""
import os
import numpy as np
import pytest
import tensorflow as tf

import nets

NUM_ACTIONS = 5
OBS = {  # agent name -> (observation shape, dtype)
    "SimpleConvNetAgent": ((84, 84, 4), np.uint8),
    "NatureConvNetAgent": ((84, 84, 4), np.uint8),
    "ResNetAgent": ((84, 84, 4), np.uint8),
    "ResNetLSTMAgent": ((84, 84, 4), np.uint8),
    "MLPAgent": ((4,), np.float32),
    "MLPLSTMAgent": ((4,), np.float32),
}
RECURRENT = ("ResNetLSTMAgent", "MLPLSTMAgent")


def observations(name, leading, seed=0):
    shape, dtype = OBS[name]
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, size=leading + shape, dtype=np.uint8)
    return rng.standard_normal(leading + shape).astype(np.float32)


def random_state(agent, batch_size, seed=1):
    """A non-zero core state, so a missing reset would show."""
    rng = np.random.default_rng(seed)
    return tf.nest.map_structure(
        lambda s: tf.constant(rng.standard_normal(s.shape), tf.float32),
        agent.initial_state(batch_size))


def test_agent_names_match_the_registry():
    assert nets.AGENT_NAMES == tuple(OBS)


@pytest.mark.parametrize("name", nets.AGENT_NAMES)
def test_step_and_unroll_shapes(name):
    agent = nets.make_agent(name, NUM_ACTIONS)
    T, B = 3, 2
    state = agent.initial_state(B)
    if name in RECURRENT:
        assert [s.shape for s in tf.nest.flatten(state)] == [(B, 256), (B, 256)]
    else:
        assert state == ()

    out, new_state = agent(observations(name, (B,)), np.zeros(B, bool), state)
    assert isinstance(out, nets.AgentOutput)
    assert out.action.shape == (B,) and out.action.dtype == tf.int32
    assert out.policy_logits.shape == (B, NUM_ACTIONS) and out.policy_logits.dtype == tf.float32
    assert out.baseline.shape == (B,) and out.baseline.dtype == tf.float32
    assert tf.nest.map_structure(lambda s: s.shape, new_state) == \
        tf.nest.map_structure(lambda s: s.shape, state)

    outs, final_state = agent.unroll(observations(name, (T, B)), np.zeros((T, B), bool), state)
    assert outs.action.shape == (T, B) and outs.action.dtype == tf.int32
    assert outs.policy_logits.shape == (T, B, NUM_ACTIONS)
    assert outs.baseline.shape == (T, B)
    assert np.all((outs.action.numpy() >= 0) & (outs.action.numpy() < NUM_ACTIONS))
    assert tf.nest.map_structure(lambda s: s.shape, final_state) == \
        tf.nest.map_structure(lambda s: s.shape, state)


@pytest.mark.parametrize("name", nets.AGENT_NAMES)
def test_unroll_matches_steps_and_tf_function(name):
    agent = nets.make_agent(name, NUM_ACTIONS)
    T, B = 4, 2
    obs = observations(name, (T, B))
    first = np.zeros((T, B), bool)
    first[2, 1] = True
    state0 = random_state(agent, B) if name in RECURRENT else ()
    outs, final = agent.unroll(obs, first, state0)

    state = state0
    for t in range(T):
        out, state = agent(obs[t], first[t], state)
        np.testing.assert_allclose(out.policy_logits, outs.policy_logits[t], atol=1e-5)
        np.testing.assert_allclose(out.baseline, outs.baseline[t], atol=1e-5)
    tf.nest.map_structure(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), state, final)

    graph_outs, _ = tf.function(agent.unroll)(obs, first, state0)
    np.testing.assert_allclose(graph_outs.policy_logits, outs.policy_logits, atol=1e-5)


@pytest.mark.parametrize("name", RECURRENT)
def test_lstm_resets_where_first_is_true(name):
    agent = nets.make_agent(name, NUM_ACTIONS)
    T, B, reset_t = 6, 2, 3
    obs = observations(name, (T, B))
    first = np.zeros((T, B), bool)
    first[reset_t, 0] = True  # batch element 0 starts a new episode at reset_t
    outs, _ = agent.unroll(obs, first, random_state(agent, B))
    fresh, _ = agent.unroll(obs[reset_t:], first[reset_t:], agent.initial_state(B))

    # Element 0 forgot everything before reset_t ...
    np.testing.assert_allclose(outs.policy_logits[reset_t:, 0], fresh.policy_logits[:, 0], atol=1e-5)
    np.testing.assert_allclose(outs.baseline[reset_t:, 0], fresh.baseline[:, 0], atol=1e-5)
    # ... element 1 did not (its state carried over).
    assert not np.allclose(outs.policy_logits[reset_t:, 1], fresh.policy_logits[:, 1], atol=1e-5)


@pytest.mark.parametrize("name", nets.AGENT_NAMES)
def test_gradients_reach_every_variable(name):
    agent = nets.make_agent(name, NUM_ACTIONS)
    T, B = 2, 2
    obs = observations(name, (T, B))
    first = np.array([[True, False], [False, True]])
    state = agent.initial_state(B)
    agent.unroll(obs, first, state)  # builds the variables
    weights = tf.constant(np.random.default_rng(2).standard_normal((T, B, NUM_ACTIONS)), tf.float32)
    with tf.GradientTape() as tape:
        outs, _ = agent.unroll(obs, first, state)
        loss = tf.reduce_sum(outs.policy_logits * weights) + tf.reduce_sum(outs.baseline ** 2)
    variables = agent.trainable_variables
    grads = tape.gradient(loss, variables)
    assert variables
    for var, grad in zip(variables, grads):
        assert grad is not None, f"no gradient for {var.name}"
        assert float(tf.reduce_max(tf.abs(grad))) > 0, f"zero gradient for {var.name}"


@pytest.mark.parametrize("name", ["SimpleConvNetAgent", "NatureConvNetAgent", "ResNetLSTMAgent", "MLPAgent"])
def test_bfloat16_torso_keeps_float32_variables_and_outputs_close_to_float32(name):
    """--compute_dtype=bfloat16: same variables (float32, so checkpoints and published weights
    do not change), outputs and gradients within bfloat16's ~3 significant digits of float32's."""
    tf.random.set_seed(0)  # a fixed draw of weights: the bounds below are not a property of one draw's luck
    agent = nets.make_agent(name, NUM_ACTIONS)
    T, B = 3, 4
    obs = observations(name, (T, B))
    first = np.zeros((T, B), bool)
    state = agent.initial_state(B)

    def run():
        with tf.GradientTape() as tape:
            outs, _ = agent.unroll(obs, first, state)
            loss = tf.reduce_sum(outs.policy_logits ** 2) + tf.reduce_sum(outs.baseline ** 2)
        return outs, tape.gradient(loss, agent.trainable_variables)

    ref, ref_grads = run()
    names = [v.name for v in agent.trainable_variables]
    agent.compute_dtype = tf.bfloat16
    low, grads = run()
    assert [v.name for v in agent.trainable_variables] == names
    assert all(v.dtype == tf.float32 for v in agent.trainable_variables)
    assert low.policy_logits.dtype == tf.float32 and low.baseline.dtype == tf.float32
    scale = float(tf.reduce_max(tf.abs(ref.policy_logits))) + 1e-6
    err = float(tf.reduce_max(tf.abs(low.policy_logits - ref.policy_logits)))
    assert 0 < err < 0.05 * scale  # it did run in bfloat16, and close to float32
    assert all(g.dtype == tf.float32 for g in grads)
    # The whole gradient points where float32's does; a single small one (a conv bias summed over
    # every pixel) strays more with rounding, and CPUs with native bfloat16 round differently.
    assert _cosine(grads, ref_grads) > 0.995
    assert min(_cosine([g], [r]) for g, r in zip(grads, ref_grads)) > 0.95


def _cosine(a, b):
    a, b = (tf.concat([tf.reshape(t, [-1]) for t in ts], 0) for ts in (a, b))
    return float(tf.reduce_sum(a * b) / (tf.norm(a) * tf.norm(b) + 1e-12))


def test_frozen_casts_act_like_the_agent_until_the_weights_change_and_after_refresh():
    agent = nets.make_agent("SimpleConvNetAgent", NUM_ACTIONS)
    agent.compute_dtype = tf.bfloat16
    frames, first = observations("SimpleConvNetAgent", (3,)), np.zeros(3, bool)
    agent(frames, first, ())  # built
    before = agent(frames, first, ())[0].policy_logits.numpy()
    refresh = nets.freeze_casts(agent)
    np.testing.assert_array_equal(agent(frames, first, ())[0].policy_logits, before)
    w = agent._torso._linear.w
    w.assign(w * 3.0)
    stale = agent(frames, first, ())[0].policy_logits.numpy()
    np.testing.assert_array_equal(stale, before)  # the copies are read, not the variables
    refresh()
    assert np.abs(agent(frames, first, ())[0].policy_logits.numpy() - before).max() > 1e-3
    assert all(v.dtype == tf.float32 for v in agent.variables)  # the copies are not the agent's variables


def test_a_bfloat16_agent_builds_its_variables_in_float32():
    agent = nets.make_agent("SimpleConvNetAgent", NUM_ACTIONS)
    agent.compute_dtype = tf.bfloat16  # before the first call
    agent(observations("SimpleConvNetAgent", (2,)), np.zeros(2, bool), ())
    assert agent.trainable_variables and all(v.dtype == tf.float32 for v in agent.trainable_variables)


@pytest.mark.parametrize("size,kernel,stride", [(84, 8, 4), (42, 4, 2)])
def test_simple_conv_fits_its_first_conv_to_the_frame_size(size, kernel, stride):
    """8x8/4 on 84x84 frames, 4x4/2 on 42x42: the same 9x9 map after the second conv."""
    agent = nets.make_agent("SimpleConvNetAgent", NUM_ACTIONS, (size, size, 4))
    agent(np.zeros((1, size, size, 4), np.uint8), np.zeros(1, bool), ())
    torso = agent._torso
    assert tuple(torso._conv0.w.shape[:2]) == (kernel, kernel) and torso._conv0.stride == stride
    x = torso._conv1(torso._conv0(tf.zeros((1, size, size, 4))))
    assert x.shape == (1, 9, 9, 32)


def test_nature_conv_has_the_published_shapes_and_refuses_frames_too_small():
    """DQN's net on 84x84: a 7x7x64 map into 512 units (1.69M weights, as in the Nature paper's
    net with its own heads); below 36 pixels its third conv has nothing to see."""
    agent = nets.make_agent("NatureConvNetAgent", NUM_ACTIONS, (84, 84, 4))
    agent(np.zeros((1, 84, 84, 4), np.uint8), np.zeros(1, bool), ())
    torso = agent._torso
    assert [tuple(c.w.shape) for c in (torso._conv0, torso._conv1, torso._conv2)] == [
        (8, 8, 4, 32), (4, 4, 32, 64), (3, 3, 64, 64)]
    assert tuple(torso._linear.w.shape) == (7 * 7 * 64, 512)
    assert sum(int(np.prod(v.shape)) for v in torso.trainable_variables) == 1_684_128
    agent = nets.make_agent("NatureConvNetAgent", NUM_ACTIONS, (36, 36, 4))
    assert agent(np.zeros((1, 36, 36, 4), np.uint8), np.zeros(1, bool), ())[0].policy_logits.shape == (1, NUM_ACTIONS)
    with pytest.raises(ValueError, match=r"at least 36x36 pixels.*got 32x30: raise --width/--height"):
        nets.make_agent("NatureConvNetAgent", NUM_ACTIONS, (30, 32, 4))


@pytest.mark.parametrize("name", ["SimpleConvNetAgent", "NatureConvNetAgent", "ResNetAgent"])
def test_uint8_frames_are_scaled_to_unit_floats(name):
    """uint8 frames reach the torso unscaled, the 1/255 folded into the first conv's kernel
    (ResNet: scaled before it); floats in [0, 1] go through unfolded: the same outputs."""
    agent = nets.make_agent(name, NUM_ACTIONS)
    frames = observations(name, (2,))
    out_uint8, _ = agent(frames, np.zeros(2, bool), ())
    out_float, _ = agent(frames.astype(np.float32) / 255.0, np.zeros(2, bool), ())
    np.testing.assert_allclose(out_uint8.policy_logits, out_float.policy_logits, atol=1e-5)


def test_actions_are_sampled_from_the_logits():
    agent = nets.make_agent("MLPAgent", NUM_ACTIONS)
    obs, first = observations("MLPAgent", (4000,)), np.zeros(4000, bool)
    agent(obs, first, ())  # builds the variables
    bias = [v for v in agent.trainable_variables if "policy_logits/b" in v.name][0]
    bias.assign([3.0, 1.0, 0.0, 0.0, -9.0])  # a peaked, non-uniform policy
    out, _ = agent(obs, first, ())
    frequencies = np.bincount(out.action.numpy(), minlength=NUM_ACTIONS) / 4000
    expected = tf.reduce_mean(tf.nn.softmax(out.policy_logits), axis=0).numpy()
    np.testing.assert_allclose(frequencies, expected, atol=0.03)


def test_make_agent_rejects_bad_names_and_action_counts():
    with pytest.raises(ValueError) as err:
        nets.make_agent("ResNetLstmAgent", NUM_ACTIONS)
    message = str(err.value)
    assert "--agent_name" in message and "'ResNetLstmAgent'" in message
    assert all(name in message for name in nets.AGENT_NAMES)
    for bad in (0, None, 2.5):
        with pytest.raises(ValueError, match="num_actions"):
            nets.make_agent("MLPAgent", bad)


def test_observation_normaliser_pools_the_moments_of_every_batch():
    """Running mean and variance over all batches seen, with its prior of one sample at
    mean 0, variance 1, as Sample Factory's RunningMeanStd (Chan's parallel formula)."""
    norm = nets.RunningNormaliser((3,), "n")
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=[2.0, -1.0, 0.5], scale=[0.1, 3.0, 1.0], size=(5, 4, 3)).astype(np.float32)
               for _ in range(4)]
    for b in batches:
        norm.update(tf.constant(b))
    x = np.concatenate([b.reshape(-1, 3) for b in batches]).astype(np.float64)
    n = 1 + len(x)  # the prior counts as one sample
    mean = x.sum(0) / n
    var = (1.0 + (0 - mean) ** 2 + ((x - mean) ** 2).sum(0)) / n
    assert float(norm.count.numpy()) == n
    np.testing.assert_allclose(norm.mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), var, rtol=1e-4)


def test_observation_normaliser_standardises_and_clips():
    norm = nets.RunningNormaliser((2,), "n")
    norm.mean.assign([0.5, 0.0])
    norm.var.assign([0.04, 1e-4])  # the second: a nearly constant pixel
    y = norm(tf.constant([[0.7, 0.0], [0.5, 0.3]])).numpy()
    np.testing.assert_allclose(y[:, 0], [0.2 / np.sqrt(0.04 + 1e-5), 0.0], rtol=1e-5)
    np.testing.assert_allclose(y[:, 1], [0.0, nets.RunningNormaliser.CLIP])  # 0.3 / 0.01 = 30, clipped


def test_an_agent_normalises_its_observations_and_publishes_the_statistics():
    """With an obs_normaliser the agent reads standardised frames; its published variables
    are the trainable ones, then the statistics (which the actors need to act alike)."""
    agent = nets.make_agent("SimpleConvNetAgent", NUM_ACTIONS, (42, 42, 4))
    agent.obs_normaliser = nets.RunningNormaliser((42, 42, 4), "obs_normaliser")
    frames = observations("SimpleConvNetAgent", (3,))[:, :42, :42]
    first = np.zeros(3, bool)
    fresh, _ = agent(frames, first, ())  # mean 0, variance 1: the frames as they were
    agent.obs_normaliser.update(tf.constant(frames[None] / 255.0, tf.float32))
    moved, _ = agent(frames, first, ())
    assert not np.allclose(fresh.policy_logits, moved.policy_logits)
    published = nets.published_variables(agent)
    assert published[:-2] == list(agent.trainable_variables)
    assert published[-2] is agent.obs_normaliser.mean and published[-1] is agent.obs_normaliser.var
    plain = nets.make_agent("SimpleConvNetAgent", NUM_ACTIONS, (42, 42, 4))
    plain(frames, first, ())
    assert nets.published_variables(plain) == list(plain.trainable_variables)


def test_a_return_normaliser_reports_the_baseline_in_return_units():
    agent = nets.make_agent("MLPAgent", NUM_ACTIONS)
    obs, first = observations("MLPAgent", (3,)), np.zeros(3, bool)
    raw, _ = agent(obs, first, ())
    agent.return_normaliser = nets.RunningNormaliser((), "return_normaliser")
    agent.return_normaliser.mean.assign(2.0)
    agent.return_normaliser.var.assign(9.0)
    out, _ = agent(obs, first, ())
    np.testing.assert_allclose(out.baseline, raw.baseline * np.sqrt(9.0 + 1e-5) + 2.0, rtol=1e-5)
    np.testing.assert_allclose(out.policy_logits, raw.policy_logits)
    published = nets.published_variables(agent)
    assert published[-2] is agent.return_normaliser.mean and published[-1] is agent.return_normaliser.var


def test_the_names_nets_gives_without_tensorflow_are_its_agents():
    """nets/__init__.py names the agents without importing TensorFlow; nets/agents.py builds them."""
    from nets import agents
    assert nets.AGENT_NAMES == tuple(agents._AGENTS)
    assert nets.RECURRENT == tuple(n for n, c in agents._AGENTS.items() if issubclass(c, agents.LSTMAgent))


def test_a_bad_command_line_is_answered_without_loading_tensorflow():
    """experiment.py's checks of a vector-observation run import no TensorFlow (3 s on 2 cores), so a
    bad flag is refused at once."""
    import subprocess
    import sys
    code = ("import sys, experiment\n"
            "experiment.FLAGS(['experiment.py', '--level_name=CartPole-v1', '--agent_name=MLPAgent',"
            " '--replay_parameters=[{\"type\": \"queue\", \"capacity\": 1, \"sample_ratio\": 1}]'])\n"
            "experiment.validate_run()\n"
            "print('tensorflow' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("bias", [1.0, 0.0, -2.0])
def test_the_lstm_forget_bias_sets_how_much_of_a_cell_one_step_keeps(name, bias):
    """With the LSTM's weights at zero its gates are sigmoids of their biases alone (the forget
    gate's starts at the forget bias, the others at 0) and the candidate is tanh(0): a cell of 1
    keeps exactly sigmoid(bias) of itself after one step."""
    agent = nets.make_agent(name, NUM_ACTIONS, lstm_forget_bias=bias)
    state = agent.initial_state(2)
    agent(tf.constant(observations(name, (2,))), tf.constant([True, True]), state)
    weights = [v for v in agent.trainable_variables if "reset_lstm/lstm/w" in v.name]
    assert len(weights) == 2
    for v in weights:
        v.assign(tf.zeros_like(v))
    ones = tf.nest.map_structure(tf.ones_like, state)
    _, new = agent(tf.constant(observations(name, (2,))), tf.constant([False, False]), ones)
    np.testing.assert_allclose(new.cell.numpy(), 1 / (1 + np.exp(-bias)), rtol=1e-6)


def test_a_run_builds_its_recurrent_net_with_the_forget_bias_its_flags_name():
    import experiment
    from impala import agent as agent_lib

    class Flags:
        lstm_forget_bias = -1.5
    agent, _, _ = agent_lib.build_agent("CartPole-v1", "MLPLSTMAgent", 8, net=agent_lib.net_options(Flags))
    b = [v for v in agent.trainable_variables if "reset_lstm/lstm/b" in v.name][0].numpy()
    np.testing.assert_array_equal(np.split(b, 4), [[0] * 256, [-1.5] * 256, [0] * 256, [0] * 256])
    assert {"lstm_forget_bias", "lstm_input_norm"} <= set(experiment.RUN_FLAGS)  # test mode, train_w_load: the same net


@pytest.mark.parametrize("name", RECURRENT)
def test_an_lstm_input_norm_keeps_the_gates_where_the_torso_features_grow(name):
    """--lstm_input_norm: the LSTM reads the torso's features standardised (mean 0, variance 1 per
    step), so scaling the deep torso's last layer by 1000 (ReLU after it: the features grow, their
    shape stays) leaves the gates' inputs as they were; without it they grow with it. The MLP
    torso's tanh changes shape under that scaling, so there only the standardising is checked."""
    obs, first = tf.constant(observations(name, (3,))), tf.constant([True, False, False])
    for norm in (True, False):
        agent = nets.make_agent(name, NUM_ACTIONS, lstm_input_norm=norm)
        state = random_state(agent, 3)
        agent(obs, first, state)
        assert any("lstm_input_norm" in v.name for v in agent.trainable_variables) == norm
        gates, read = agent.gate_inputs(obs, first, state)
        if norm:
            np.testing.assert_allclose(tf.reduce_mean(read, -1), 0, atol=1e-4)
            np.testing.assert_allclose(tf.math.reduce_variance(read, -1), 1, rtol=1e-2)
        if name == "MLPLSTMAgent":
            continue
        last = [v for v in agent.trainable_variables if v.name.endswith("resnet_torso/linear/w:0")][0]
        last.assign(last * 1000.0)
        grown, _ = agent.gate_inputs(obs, first, state)
        same = np.allclose(grown, gates, rtol=1e-3, atol=1e-3)
        assert same == norm, (name, norm)
