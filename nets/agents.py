"""The agents, by `--agent_name` (imported through nets/__init__.py, which names them without
importing TensorFlow).

    agent = make_agent("ResNetLSTMAgent", num_actions)  # or a distributions.DiagGaussian(d)
    state = agent.initial_state(batch_size)          # () for feed-forward agents
    output, state = agent(obs, first, state)           # one step, AgentOutput[B]
    outputs, state = agent.unroll(obs, first, state)   # time-major, AgentOutput[T, B]

Variables are created on the first call (Sonnet 2 builds lazily).
"""
from nets import LSTM_INPUT_NORM, distributions
from nets.base import (AgentOutput, LSTMAgent, RunningNormaliser, freeze_casts, normalisers, orthogonal_init,
                       preprocess_observation, published_variables)
from nets.conv import NatureConvNetAgent, SimpleConvNetAgent
from nets.mlp import MLPAgent, MLPLSTMAgent
from nets.resnet import ResNetAgent, ResNetLSTMAgent

_AGENTS = {
    "SimpleConvNetAgent": SimpleConvNetAgent,
    "NatureConvNetAgent": NatureConvNetAgent,
    "ResNetAgent": ResNetAgent,
    "ResNetLSTMAgent": ResNetLSTMAgent,
    "MLPAgent": MLPAgent,
    "MLPLSTMAgent": MLPLSTMAgent,
}
FRAME_SIZED = ("SimpleConvNetAgent", "NatureConvNetAgent")  # built for the frame size they are given


def make_agent(agent_name, actions, obs_shape=None, mlp_hidden=None, mlp_activation=None, lstm_forget_bias=1.0,
               lstm_input_norm=LSTM_INPUT_NORM):
    """The agent called `agent_name` acting with `actions`: a number of discrete actions or a
    distribution of nets/distributions.py (DiagGaussian(d) for d-dimensional continuous actions);
    `obs_shape` ([H, W, C] frames) lets SimpleConvNetAgent fit its first conv to the frame size (and
    NatureConvNetAgent refuse frames too small for it);
    `mlp_hidden` (widths) and `mlp_activation` ("tanh", "relu") shape the MLP agents' torsos;
    `lstm_forget_bias` goes to the recurrent agents' forget gate; `lstm_input_norm` layer-normalises
    what their LSTM reads."""
    if agent_name not in _AGENTS:
        raise ValueError(
            f"--agent_name={agent_name!r} is not a known agent; choose one of: "
            f"{', '.join(_AGENTS)}")
    try:
        policy = distributions.make(actions)
    except ValueError as e:
        raise ValueError(f"{agent_name}: {e}") from None
    if agent_name in FRAME_SIZED and obs_shape is not None and len(obs_shape) == 3:
        return _AGENTS[agent_name](policy, frame_size=(obs_shape[1], obs_shape[0]))  # (width, height)
    recurrent = issubclass(_AGENTS[agent_name], LSTMAgent)
    options = {"forget_bias": float(lstm_forget_bias), "input_norm": bool(lstm_input_norm)} if recurrent else {}
    if agent_name in ("MLPAgent", "MLPLSTMAgent"):
        options.update((k, v) for k, v in (("hidden", mlp_hidden), ("activation", mlp_activation)) if v is not None)
    return _AGENTS[agent_name](policy, **options)
