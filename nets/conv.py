"""The convolutional agents for frames.

SimpleConvNetAgent: the shallow IMPALA network (Espeholt et al. 2018, fig. 3 left), as in A3C:
conv 16 8x8 stride 4, conv 32 4x4 stride 2, fully connected 256, ReLUs. On frames smaller than 64
pixels (e.g. --width=--height=42) the first conv is 4x4 stride 2: the same receptive field, in
screen pixels, as 8x8 stride 4 on 84x84 frames, and the same 9x9 map after the second conv. The
8x8/4 conv on 42x42 frames leaves a 3x3 map that cannot place Pong's ball: a classifier of "ball
above the paddle" on that torso reached 70% on held-out frames, against 97% with 4x4/2 at 42x42 or
8x8/4 at 84x84 (3,000 Adam steps each).

NatureConvNetAgent: the DQN Nature paper's network (Mnih et al. 2015), the one OpenAI baselines'
and CleanRL's PPO use for the published Atari tables: conv 32 8x8 stride 4, conv 64 4x4 stride 2,
conv 64 3x3 stride 1, fully connected 512, ReLUs. At 84x84 its torso does 9.4M multiply-adds per
observation (4 stacked frames) against the shallow net's 3.0M.
"""
import sonnet as snt
import tensorflow as tf

from nets.base import FeedForwardAgent

SMALL_FRAME = 64  # below this height or width, the first conv is 4x4 stride 2
NATURE_MIN_FRAME = 36  # the smallest frame side on which the Nature net's third conv has a 1x1 map


class SimpleConvTorso(snt.Module):

    def __init__(self, frame_size=(84, 84), name="simple_conv_torso"):
        """frame_size: (width, height) of the frames; small frames get a smaller first conv."""
        super().__init__(name=name)
        small = min(frame_size) < SMALL_FRAME
        self._conv0 = snt.Conv2D(16, kernel_shape=4 if small else 8, stride=2 if small else 4,
                                 padding="VALID")
        self._conv1 = snt.Conv2D(32, kernel_shape=4, stride=2, padding="VALID")
        self._linear = snt.Linear(256)

    def __call__(self, frames, frame_scale=1.0):  # [N, H, W, C] float; frames * frame_scale in [0, 1]
        return conv_stack((self._conv0, self._conv1), self._linear, frames, frame_scale)


def conv_stack(convs, linear, frames, frame_scale):
    """The conv torsos' forward pass: ReLU after each conv in turn (the frame scale folded into the
    first), then ReLU(linear) of the flattened map."""
    x = tf.nn.relu(folded_conv(convs[0], frames, frame_scale))
    for conv in convs[1:]:
        x = tf.nn.relu(conv(x))
    return tf.nn.relu(linear(snt.Flatten()(x)))


def folded_conv(conv, x, scale):
    """conv(x * scale), the scale folded into the kernel: a product over the 8x8x4x16 kernel, not
    over every frame. Built (Sonnet builds on the first call) with the scale applied to x."""
    if scale == 1.0:
        return conv(x)
    if not hasattr(conv, "w"):  # not built yet
        return conv(x * scale)
    assert conv.padding_func is None and conv.data_format == "NHWC", "folded_conv: VALID/SAME NHWC convs only"
    y = tf.nn.convolution(x, conv.w * tf.constant(scale, x.dtype), strides=conv.stride, padding=conv.conv_padding,
                          dilations=conv.rate)
    return tf.nn.bias_add(y, conv.b) if conv.with_bias else y


class NatureConvTorso(snt.Module):

    def __init__(self, frame_size=(84, 84), name="nature_conv_torso"):
        """frame_size: (width, height); at least NATURE_MIN_FRAME pixels each way, so that the
        third conv has a map to see."""
        super().__init__(name=name)
        if min(frame_size) < NATURE_MIN_FRAME:
            raise ValueError("NatureConvNetAgent needs frames of at least %dx%d pixels (its convs leave no "
                             "map below that), got %dx%d: raise --width/--height (84 is the published "
                             "tables' size) or use SimpleConvNetAgent"
                             % (NATURE_MIN_FRAME, NATURE_MIN_FRAME, frame_size[0], frame_size[1]))
        self._conv0 = snt.Conv2D(32, kernel_shape=8, stride=4, padding="VALID")
        self._conv1 = snt.Conv2D(64, kernel_shape=4, stride=2, padding="VALID")
        self._conv2 = snt.Conv2D(64, kernel_shape=3, stride=1, padding="VALID")
        self._linear = snt.Linear(512)

    def __call__(self, frames, frame_scale=1.0):  # as SimpleConvTorso's
        return conv_stack((self._conv0, self._conv1, self._conv2), self._linear, frames, frame_scale)


class SimpleConvNetAgent(FeedForwardAgent):

    def __init__(self, actions, frame_size=(84, 84), name="simple_conv_net_agent"):
        super().__init__(lambda: SimpleConvTorso(frame_size), actions, name=name)


class NatureConvNetAgent(FeedForwardAgent):

    def __init__(self, actions, frame_size=(84, 84), name="nature_conv_net_agent"):
        super().__init__(lambda: NatureConvTorso(frame_size), actions, name=name)
