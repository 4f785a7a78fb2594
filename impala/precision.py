"""--compute_dtype=auto: the precision of the agent's torso on this host, chosen by timing it.

bfloat16 pays only where the CPU's oneDNN kernels run it natively, and no CPU flag says where:
on 2-core machines the Pong recipe's update was 1.5x faster in bfloat16 on an AMD EPYC with
AVX512_BF16, 1.4x slower on an Intel Xeon that also has AVX512_BF16, and 4.8x slower on an AMD
EPYC without AVX-512 (bench/results/<machine>/compute_dtype.md). So each process times its own
work in both precisions at start-up and keeps the faster: the learner a gradient step on one
minibatch, an actor one inference step of its env group. Actors and the evaluator on different
hosts may choose differently; the variables, the published weights and the checkpoints are float32
either way. Horovod learner ranks must not: ranks that traced different updates submit allreduces
of different names and wait for each other for ever, so they decide on the mean of their times.

bfloat16 must win by BF16_MARGIN, not by any amount: such a timing runs while the other processes
start beside it, and on the Intel Xeon a one-pass timing of this kind found bfloat16 1.16x faster
while the whole update ran 1.34x slower in it (bench/results/LOG.md, the Intel Xeon's Atari levers).
Where bfloat16 pays it pays 1.3x to 1.8x, and float32 rounds less."""
import time

import numpy as np
import tensorflow as tf

DTYPES = ("float32", "bfloat16")
REPEATS = 3  # timed calls per precision after a warm-up, alternating; the fastest of each counts
BF16_MARGIN = 1.2  # float32's time over bfloat16's that bfloat16 needs to be chosen


def _probe_inputs(agent, obs_shape, obs_dtype, batch):
    """A batch of random observations of the env's shape (frames 0..255), all episode starts."""
    rng = np.random.RandomState(0)
    shape = (batch,) + tuple(obs_shape)
    if np.dtype(obs_dtype) == np.uint8:
        obs = rng.randint(0, 256, size=shape).astype(np.uint8)
    else:
        obs = rng.standard_normal(shape).astype(obs_dtype)
    return tf.constant(obs), tf.ones([batch], tf.bool), agent.initial_state(batch)


def _work(agent, train):
    """The timed work as a tf.function: the agent's forward pass, and with `train` its
    gradients as well. Its inputs are arguments, so the graph cannot fold them away."""
    def forward(obs, first, state):
        out, _ = agent(obs, first, state)
        return tf.reduce_sum(out.policy_logits) + tf.reduce_sum(out.baseline)

    def gradients(obs, first, state):
        with tf.GradientTape() as tape:
            loss = forward(obs, first, state)
        return tape.gradient(loss, agent.trainable_variables)
    return tf.function(gradients if train else forward, autograph=False)


def time_dtypes(agent, obs_shape, obs_dtype, batch, train, repeats=REPEATS):
    """{dtype name: the fastest of `repeats` calls in seconds} of the work _work describes on
    `batch` observations; the agent's compute_dtype is left as it was."""
    inputs = _probe_inputs(agent, obs_shape, obs_dtype, batch)
    before, fns = agent.compute_dtype, {}
    try:
        for name in DTYPES:  # the torso reads compute_dtype when the function is traced: the warm-up
            agent.compute_dtype = tf.as_dtype(name)
            fns[name] = _work(agent, train)
            tf.nest.map_structure(lambda t: t.numpy(), fns[name](*inputs))
    finally:
        agent.compute_dtype = before
    best = {name: float("inf") for name in DTYPES}
    for _ in range(repeats):
        for name in DTYPES:
            t0 = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), fns[name](*inputs))
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def resolve(flags, agent, env_spec, batch, train, agree=None):
    """Sets agent.compute_dtype from --compute_dtype, timing both precisions when it is `auto`
    (a `batch`-observation gradient step with `train`, an inference step without) and taking
    bfloat16 where it is BF16_MARGIN times faster. `agree`: for processes that must choose
    alike, maps this process's times to the ones all of them decide on. Returns a
    sentence for the process's log that says what was chosen and why, or None when the flag
    named the precision."""
    if flags.compute_dtype != "auto":
        agent.compute_dtype = tf.as_dtype(flags.compute_dtype)
        return None
    times = time_dtypes(agent, env_spec.obs_shape, env_spec.obs_dtype, batch, train)
    if agree is not None:
        times = agree(times)
    chosen = "bfloat16" if times["float32"] >= BF16_MARGIN * times["bfloat16"] else "float32"
    agent.compute_dtype = tf.as_dtype(chosen)
    return ("compute dtype %s (--compute_dtype=auto: %s on %d observations took %s%s)"
            % (chosen, "a gradient step" if train else "an inference step", batch,
               ", ".join("%.1f ms in %s" % (1000 * times[n], n) for n in DTYPES),
               "" if agree is None else ", the mean over the ranks"))
