"""bench/learner_efficiency.py: its FLOP counter on known ops, and the bench end to end (--quick)."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from bench import learner_efficiency as le

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def graph_of(fn, *specs):
    return tf.function(fn, autograph=False).get_concrete_function(*specs).graph


def test_matmul_flops_are_2mnk():
    m, n, k = 32, 48, 64
    g = graph_of(tf.matmul, tf.TensorSpec([m, k]), tf.TensorSpec([k, n]))
    assert le.count_flops(g) == le.matmul_flops(m, n, k) == 2 * m * n * k


def test_conv_flops_from_the_shapes():
    n, h, w, cin, cout, kh = 2, 10, 12, 3, 5, 3
    g = graph_of(lambda x, f: tf.nn.conv2d(x, f, 1, "VALID"), tf.TensorSpec([n, h, w, cin]),
                 tf.TensorSpec([kh, kh, cin, cout]))
    assert le.count_flops(g) == le.conv_flops(n, h - 2, w - 2, cout, kh, kh, cin)


def test_gradients_are_counted():
    """The backward of a SAME conv and a matmul: the profiler counts both gradient convs and matmuls."""
    x, f, a, b = (tf.Variable(tf.ones(s)) for s in ([2, 8, 8, 3], [3, 3, 3, 4], [6, 7], [7, 5]))

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.conv2d(x, f, 1, "SAME")) + tf.reduce_sum(tf.matmul(a, b))
        return tape.gradient(loss, [x, f, a, b])
    conv, mm = le.conv_flops(2, 8, 8, 4, 3, 3, 3), le.matmul_flops(6, 5, 7)
    # forward + 2 backward each, plus the sums' and the add's elementwise ops
    assert 3 * (conv + mm) <= le.count_flops(graph_of(step)) < 3 * (conv + mm) + 1000


def test_lstm_core_flops_zero_without_core():
    assert le.lstm_core_flops(object(), 100) == 0


@pytest.mark.long
def test_quick_end_to_end(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "learner_efficiency.py"), "--quick",
                           "--rounds", "1", "--reps", "1", "--out", str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "learner_efficiency_quick.md").read_text()
    for part in ("matmul float32", "SimpleConvNetAgent", "MLPAgent", "fwd+bwd", "Machine:"):
        assert part in text
