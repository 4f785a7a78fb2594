"""Agents for vector observations (CartPole, Acrobot, ...): two tanh layers of 64
under the policy head and two more under the baseline head (MLPAgent, as SB3's
and CleanRL's PPO), or one shared torso and an LSTM of 256 (MLPLSTMAgent)."""
import sonnet as snt
import tensorflow as tf

from nets.base import FeedForwardAgent, LSTMAgent

HIDDEN_SIZES = (64, 64)


def make_mlp_torso():
    return snt.nets.MLP(HIDDEN_SIZES, activation=tf.tanh, activate_final=True, name="mlp_torso")


class MLPAgent(FeedForwardAgent):

    def __init__(self, actions, name="mlp_agent"):
        super().__init__(make_mlp_torso, actions, name=name, separate_value_torso=True)


class MLPLSTMAgent(LSTMAgent):

    def __init__(self, actions, name="mlp_lstm_agent"):
        super().__init__(make_mlp_torso, actions, name=name, hidden_size=256)
