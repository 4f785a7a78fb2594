"""The agents, by `--agent_name`.

    agent = make_agent("ResNetLSTMAgent", num_actions)  # or a distributions.DiagGaussian(d)
    state = agent.initial_state(batch_size)          # () for feed-forward agents
    output, state = agent(obs, first, state)           # one step, AgentOutput[B]
    outputs, state = agent.unroll(obs, first, state)   # time-major, AgentOutput[T, B]

Variables are created on the first call (Sonnet 2 builds lazily). The names below need no
TensorFlow, so a command line's checks (experiment.py's validate_run) answer a bad flag in a
fraction of a second; everything else loads nets/agents.py, and TensorFlow with it, on first use.
"""
import importlib

AGENT_NAMES = ("SimpleConvNetAgent", "NatureConvNetAgent", "ResNetAgent", "ResNetLSTMAgent", "MLPAgent",
               "MLPLSTMAgent")
RECURRENT = ("ResNetLSTMAgent", "MLPLSTMAgent")  # a test keeps both equal to nets/agents.py's classes
# Whether a recurrent agent layer-normalises what its LSTM reads when not told (--lstm_input_norm):
# without the norm ResNetLSTMAgent's gates became switches on Pong.
LSTM_INPUT_NORM = True


def is_recurrent(agent_name):
    """Whether the agent carries a core state along each unroll (its steps then depend on the
    steps before them)."""
    return agent_name in RECURRENT


def __getattr__(name):
    """make_agent, the agents' classes and nets/base.py's helpers, from nets/agents.py on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    agents = importlib.import_module("nets.agents")
    try:
        return getattr(agents, name)
    except AttributeError:
        raise AttributeError("module 'nets' has no attribute %r" % name) from None


__all__ = ["AGENT_NAMES", "AgentOutput", "freeze_casts", "is_recurrent", "LSTM_INPUT_NORM", "make_agent",
           "RunningNormaliser", "normalisers", "orthogonal_init", "preprocess_observation", "published_variables", "SimpleConvNetAgent",
           "NatureConvNetAgent", "ResNetAgent", "ResNetLSTMAgent", "MLPAgent", "MLPLSTMAgent"]
