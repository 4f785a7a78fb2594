"""The deep IMPALA network (Espeholt et al. 2018, fig. 3 right).

Three sections of 16, 32, 32 channels; each is a 3x3 conv, a 3x3 max-pool of
stride 2, and two residual blocks (ReLU, conv 3x3, ReLU, conv 3x3, + input).
Then ReLU, fully connected 256, ReLU, and optionally an LSTM of 256.
"""
import sonnet as snt
import tensorflow as tf

from nets import LSTM_INPUT_NORM
from nets.base import FeedForwardAgent, LSTMAgent

SECTION_CHANNELS = (16, 32, 32)
BLOCKS_PER_SECTION = 2


class ResidualBlock(snt.Module):

    def __init__(self, channels, name=None):
        super().__init__(name=name)
        self._conv0 = snt.Conv2D(channels, kernel_shape=3, padding="SAME")
        self._conv1 = snt.Conv2D(channels, kernel_shape=3, padding="SAME")

    def __call__(self, x):
        out = self._conv0(tf.nn.relu(x))
        out = self._conv1(tf.nn.relu(out))
        return x + out


class ConvSection(snt.Module):

    def __init__(self, channels, name=None):
        super().__init__(name=name)
        self._conv = snt.Conv2D(channels, kernel_shape=3, padding="SAME")
        self._blocks = [ResidualBlock(channels) for _ in range(BLOCKS_PER_SECTION)]

    def __call__(self, x):
        x = self._conv(x)
        x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME")
        for block in self._blocks:
            x = block(x)
        return x


class ResNetTorso(snt.Module):

    def __init__(self, name="resnet_torso"):
        super().__init__(name=name)
        self._sections = [ConvSection(c) for c in SECTION_CHANNELS]
        self._linear = snt.Linear(256)

    def __call__(self, frames, frame_scale=1.0):  # [N, H, W, C] float; frames * frame_scale in [0, 1]
        x = frames * frame_scale if frame_scale != 1.0 else frames
        for section in self._sections:
            x = section(x)
        x = snt.Flatten()(tf.nn.relu(x))
        return tf.nn.relu(self._linear(x))


class ResNetAgent(FeedForwardAgent):

    def __init__(self, actions, name="resnet_agent"):
        super().__init__(ResNetTorso, actions, name=name)


class ResNetLSTMAgent(LSTMAgent):

    def __init__(self, actions, name="resnet_lstm_agent", forget_bias=1.0, input_norm=LSTM_INPUT_NORM):
        super().__init__(ResNetTorso, actions, name=name, hidden_size=256, forget_bias=forget_bias,
                         input_norm=input_norm)
