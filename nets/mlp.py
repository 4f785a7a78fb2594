"""Agents for vector observations (CartPole, Acrobot, MuJoCo, ...): two tanh layers of 64
under the policy head and two more under the baseline head (MLPAgent, as SB3's
and CleanRL's PPO), or one shared torso and an LSTM of 256 (MLPLSTMAgent). `hidden` and
`activation` (--mlp_hidden, --mlp_activation) change the torsos' widths and nonlinearity:
rl-baselines3-zoo's MuJoCo recipes use 256-256 ReLU."""
import sonnet as snt

from nets import LSTM_INPUT_NORM
from nets.base import FeedForwardAgent, LSTMAgent
from nets.gaussian import ACTIVATIONS

HIDDEN_SIZES = (64, 64)


def torso_maker(hidden=HIDDEN_SIZES, activation="tanh"):
    if activation not in ACTIVATIONS:
        raise ValueError("--mlp_activation=%s: choose one of %s" % (activation, ", ".join(ACTIVATIONS)))
    if not hidden or any(int(w) < 1 for w in hidden):
        raise ValueError("--mlp_hidden=%s: give positive layer widths, e.g. 64,64" % ",".join(map(str, hidden)))
    return lambda: snt.nets.MLP([int(w) for w in hidden], activation=ACTIVATIONS[activation], activate_final=True,
                                name="mlp_torso")


class MLPAgent(FeedForwardAgent):

    def __init__(self, actions, name="mlp_agent", hidden=HIDDEN_SIZES, activation="tanh"):
        super().__init__(torso_maker(hidden, activation), actions, name=name, separate_value_torso=True)


class MLPLSTMAgent(LSTMAgent):

    def __init__(self, actions, name="mlp_lstm_agent", hidden=HIDDEN_SIZES, activation="tanh", forget_bias=1.0,
                 input_norm=LSTM_INPUT_NORM):
        super().__init__(torso_maker(hidden, activation), actions, name=name, hidden_size=256,
                         forget_bias=forget_bias, input_norm=input_norm)
