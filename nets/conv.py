"""The shallow IMPALA network (Espeholt et al. 2018, fig. 3 left), as in A3C:
conv 16 8x8 stride 4, conv 32 4x4 stride 2, fully connected 256, ReLUs."""
import sonnet as snt
import tensorflow as tf

from nets.base import FeedForwardAgent


class SimpleConvTorso(snt.Module):

    def __init__(self, name="simple_conv_torso"):
        super().__init__(name=name)
        self._conv0 = snt.Conv2D(16, kernel_shape=8, stride=4, padding="VALID")
        self._conv1 = snt.Conv2D(32, kernel_shape=4, stride=2, padding="VALID")
        self._linear = snt.Linear(256)

    def __call__(self, frames):  # [N, H, W, C] float in [0, 1]
        x = tf.nn.relu(self._conv0(frames))
        x = tf.nn.relu(self._conv1(x))
        x = snt.Flatten()(x)
        return tf.nn.relu(self._linear(x))


class SimpleConvNetAgent(FeedForwardAgent):

    def __init__(self, num_actions, name="simple_conv_net_agent"):
        super().__init__(SimpleConvTorso, num_actions, name=name)
