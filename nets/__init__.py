"""The agents, by `--agent_name`.

    agent = make_agent("ResNetLSTMAgent", num_actions)
    state = agent.initial_state(batch_size)          # () for feed-forward agents
    output, state = agent(obs, first, state)           # one step, AgentOutput[B]
    outputs, state = agent.unroll(obs, first, state)   # time-major, AgentOutput[T, B]

Variables are created on the first call (Sonnet 2 builds lazily).
"""
import operator

from nets.base import (AgentOutput, RunningNormaliser, freeze_casts, normalisers, orthogonal_init,
                       preprocess_observation, published_variables)
from nets.conv import SimpleConvNetAgent
from nets.mlp import MLPAgent, MLPLSTMAgent
from nets.resnet import ResNetAgent, ResNetLSTMAgent

_AGENTS = {
    "SimpleConvNetAgent": SimpleConvNetAgent,
    "ResNetAgent": ResNetAgent,
    "ResNetLSTMAgent": ResNetLSTMAgent,
    "MLPAgent": MLPAgent,
    "MLPLSTMAgent": MLPLSTMAgent,
}
AGENT_NAMES = tuple(_AGENTS)


def make_agent(agent_name, num_actions, obs_shape=None):
    """The agent called `agent_name` with `num_actions` discrete actions; `obs_shape`
    ([H, W, C] frames) lets SimpleConvNetAgent fit its first conv to the frame size."""
    if agent_name not in _AGENTS:
        raise ValueError(
            f"--agent_name={agent_name!r} is not a known agent; choose one of: "
            f"{', '.join(AGENT_NAMES)}")
    try:
        count = operator.index(num_actions)
    except TypeError:
        count = 0
    if count < 1:
        raise ValueError(
            f"{agent_name} needs a positive integer number of discrete actions, "
            f"got num_actions={num_actions!r} (is the env's action space continuous?)")
    if agent_name == "SimpleConvNetAgent" and obs_shape is not None and len(obs_shape) == 3:
        return SimpleConvNetAgent(count, frame_size=(obs_shape[1], obs_shape[0]))  # (width, height)
    return _AGENTS[agent_name](count)


__all__ = ["AGENT_NAMES", "AgentOutput", "freeze_casts", "make_agent", "RunningNormaliser", "normalisers",
           "orthogonal_init", "preprocess_observation", "published_variables", "SimpleConvNetAgent",
           "ResNetAgent", "ResNetLSTMAgent", "MLPAgent", "MLPLSTMAgent"]
