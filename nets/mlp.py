"""Agents for vector observations (CartPole, Acrobot, ...): a shared torso of
two tanh layers of 64, then the policy and baseline heads (MLPAgent) or an
LSTM of 256 first (MLPLSTMAgent)."""
import sonnet as snt
import tensorflow as tf

from nets.base import FeedForwardAgent, LSTMAgent

HIDDEN_SIZES = (64, 64)


def make_mlp_torso():
    return snt.nets.MLP(HIDDEN_SIZES, activation=tf.tanh, activate_final=True, name="mlp_torso")


class MLPAgent(FeedForwardAgent):

    def __init__(self, num_actions, name="mlp_agent"):
        super().__init__(make_mlp_torso, num_actions, name=name)


class MLPLSTMAgent(LSTMAgent):

    def __init__(self, num_actions, name="mlp_lstm_agent"):
        super().__init__(make_mlp_torso, num_actions, name=name, hidden_size=256)
