"""Gaussian MLP policy and value net for continuous control (WALL-E's PPO).

Widths grow with the problem, as in the TRPO/PPO code WALL-E derives from:

    policy: obs -> hid1 = obs_dim * 10 -> hid2 = sqrt(hid1 * hid3) -> hid3 = act_dim * 10 -> mean
    value:  obs -> hid1 = obs_dim * 10 -> hid2 = sqrt(hid1 * 5)     -> 5                   -> V(obs)

(HalfCheetah-v5, obs 17, act 6: policy 170-101-60, value 170-29-5), tanh
hidden units, weights ~ N(0, 1/fan_in). The policy's log-variance does not
depend on the observation: it is the sum over the rows of a trainable
[logvar_speed, act_dim] matrix (zeros at start, logvar_speed = 10 * hid3 // 48)
plus `init_logvar` (-1.0); the row sum makes it learn `logvar_speed` times
faster than one variable would.

With `hidden` (e.g. (256, 256), flag --hidden) the nets are those of
Stable-Baselines3's MlpPolicy instead, as rl-baselines3-zoo tunes it (ortho_init
False): the given hidden widths for both nets, every Linear layer initialised as
PyTorch's default (weights and biases ~ U(+-1/sqrt(fan_in))), and a plain
state-independent log-std vector (`log_std_init`, trainable; logvar = 2 log_std).
`activation` ("tanh" or "relu") is the hidden units' nonlinearity for either kind.

Samplers run the policy in numpy from `policy.numpy_params()`: a list of (W, b)
per layer, the log-variance vector and the activation's name;
`samplers.policy_mean` is the same forward pass written with numpy matmuls.
"""
import math

import numpy as np
import sonnet as snt
import tensorflow as tf

HID_MULT = 10
VALUE_HID3 = 5
ACTIVATIONS = {"tanh": tf.tanh, "relu": tf.nn.relu}


def policy_widths(obs_dim, act_dim, hid_mult=HID_MULT):
    hid1, hid3 = obs_dim * hid_mult, act_dim * hid_mult
    return hid1, int(round(math.sqrt(hid1 * hid3))), hid3


def value_widths(obs_dim, hid_mult=HID_MULT):
    hid1 = obs_dim * hid_mult
    return hid1, int(round(math.sqrt(hid1 * VALUE_HID3))), VALUE_HID3


def _check_dims(obs_dim, act_dim=1):
    for name, dim in (("obs_dim", obs_dim), ("act_dim", act_dim)):
        if not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"{name} must be a positive integer, got {dim!r}")


def _check_net(hidden, activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if hidden is not None and (len(hidden) == 0 or any(int(w) < 1 for w in hidden)):
        raise ValueError(f"hidden widths must be positive integers, got {hidden!r}")


def _mlp(widths, name):
    """Linear layers with N(0, 1/fan_in) weights and zero biases (WALL-E)."""
    init = snt.initializers.VarianceScaling(1.0, "fan_in", "normal")
    return [snt.Linear(w, w_init=init, name=f"{name}_{i}") for i, w in enumerate(widths)]


def _torch_default_mlp(in_dim, widths, name):
    """Linear layers initialised as torch.nn.Linear's default (what SB3 uses with
    ortho_init=False): kaiming_uniform(a=sqrt(5)) weights and the bias both come
    to U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    layers = []
    for i, (fan_in, w) in enumerate(zip((in_dim,) + tuple(widths[:-1]), widths)):
        bound = 1.0 / math.sqrt(fan_in)
        init = snt.initializers.RandomUniform(-bound, bound)
        layers.append(snt.Linear(w, w_init=init, b_init=init, name=f"{name}_{i}"))
    return layers


def _forward(layers, x, activation="tanh"):
    act = ACTIVATIONS[activation]
    for layer in layers[:-1]:
        x = act(layer(x))
    return layers[-1](x)


class GaussianPolicy(snt.Module):
    """obs [B, obs_dim] -> (mean [B, act_dim], logvar [act_dim]).

    hidden None: WALL-E's widths from hid_mult, row-sum logvar from init_logvar.
    hidden (w1, w2, ...): SB3's MlpPolicy, torch-default init, log_std from log_std_init.
    """

    def __init__(self, obs_dim, act_dim, hid_mult=HID_MULT, init_logvar=-1.0, hidden=None,
                 activation="tanh", log_std_init=0.0, name="gaussian_policy"):
        super().__init__(name=name)
        _check_dims(obs_dim, act_dim)
        _check_net(hidden, activation)
        self.obs_dim, self.act_dim, self.activation = int(obs_dim), int(act_dim), activation
        self.init_logvar, self.log_std = float(init_logvar), None
        if hidden is None:
            self.widths = policy_widths(self.obs_dim, self.act_dim, hid_mult)
            self._layers = _mlp(self.widths + (self.act_dim,), "policy")
            logvar_speed = max(1, 10 * self.widths[2] // 48)
            self.log_vars = tf.Variable(tf.zeros([logvar_speed, self.act_dim]), name="log_vars")
        else:
            self.widths = tuple(int(w) for w in hidden)
            self._layers = _torch_default_mlp(self.obs_dim, self.widths + (self.act_dim,), "policy")
            self.log_std = tf.Variable(tf.fill([self.act_dim], float(log_std_init)), name="log_std")
        self(tf.zeros([1, self.obs_dim]))  # create the variables now

    def logvar(self):
        if self.log_std is not None:
            return 2.0 * self.log_std
        return tf.reduce_sum(self.log_vars, axis=0) + self.init_logvar

    def __call__(self, obs):
        return _forward(self._layers, tf.convert_to_tensor(obs, tf.float32), self.activation), self.logvar()

    def numpy_params(self):
        """{"layers": [(W [in, out], b [out]), ...], "logvar": [act_dim], "activation": name}, float32 numpy."""
        layers = [(layer.w.numpy(), layer.b.numpy()) for layer in self._layers]
        return {"layers": layers, "logvar": self.logvar().numpy(), "activation": self.activation}


class ValueNet(snt.Module):
    """obs [B, obs_dim] -> V(obs) [B]; hidden as for GaussianPolicy."""

    def __init__(self, obs_dim, hid_mult=HID_MULT, hidden=None, activation="tanh", name="value_net"):
        super().__init__(name=name)
        _check_dims(obs_dim)
        _check_net(hidden, activation)
        self.obs_dim, self.activation = int(obs_dim), activation
        if hidden is None:
            self.widths = value_widths(self.obs_dim, hid_mult)
            self._layers = _mlp(self.widths + (1,), "value")
        else:
            self.widths = tuple(int(w) for w in hidden)
            self._layers = _torch_default_mlp(self.obs_dim, self.widths + (1,), "value")
        self(tf.zeros([1, self.obs_dim]))

    def __call__(self, obs):
        x = _forward(self._layers, tf.convert_to_tensor(obs, tf.float32), self.activation)
        return tf.squeeze(x, axis=-1)


def gaussian_log_prob(actions, mean, logvar):
    """log N(actions; mean, diag(exp(logvar))), summed over action dims: [B]."""
    return -0.5 * tf.reduce_sum(
        logvar + tf.square(actions - mean) / tf.exp(logvar) + math.log(2.0 * math.pi), axis=-1)


def gaussian_kl(old_mean, old_logvar, mean, logvar):
    """KL(old || new) between diagonal Gaussians, summed over action dims: [B]."""
    return 0.5 * tf.reduce_sum(
        logvar - old_logvar + (tf.exp(old_logvar) + tf.square(old_mean - mean)) / tf.exp(logvar) - 1.0,
        axis=-1)


def gaussian_entropy(logvar):
    """Entropy of a diagonal Gaussian with log-variances `logvar` [act_dim]: a scalar."""
    return 0.5 * tf.reduce_sum(logvar + math.log(2.0 * math.pi * math.e))
