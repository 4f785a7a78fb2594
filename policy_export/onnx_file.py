"""A SavedModel's `policy` function as an ONNX file (tf2onnx), or one line saying why not.

The ONNX graph takes the SavedModel signature's inputs under their names. An output whose name is
also an input's (a recurrent policy's lstm_hidden, lstm_cell) is called next_<name> there: ONNX
names each value once, so a graph cannot both take and return `lstm_hidden`."""
import contextlib
import logging
import os
import tempfile

import tensorflow as tf

ONNX_FILE = "policy.onnx"
OPSET = 17  # ONNX 1.12's opset: current runtimes, onnxruntime among them, run it
NEXT = "next_"


class _Records(logging.Handler):
    """Keeps tf2onnx's log records (it logs an op it has no conversion for, and goes on)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def _quiet():
    """tf2onnx's log lines and grappler's C++ start-up lines (written to fd 2 whatever
    TF_CPP_MIN_LOG_LEVEL says) go nowhere; the records come back for the failure line."""
    logger, handler = logging.getLogger("tf2onnx"), _Records()
    saved = logger.handlers, logger.propagate, logger.level
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.ERROR)
    stderr = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield handler.records
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)
            logger.handlers, logger.propagate = saved[0], saved[1]
            logger.setLevel(saved[2])


def _renamed(policy):
    """`policy` in a fresh tf.function (tf2onnx traces it anew), an output named as an input renamed."""
    inputs = {s.name for s in policy.input_signature}

    def step(*args):
        return {NEXT + k if k in inputs else k: v for k, v in policy(*args).items()}
    return tf.function(step, input_signature=policy.input_signature)


def _unconverted(model, records):
    """(op, reason) of the first TensorFlow op left in the ONNX graph, or None."""
    import onnx
    failed = {r.args[0]: "%s: %s" % (type(r.exc_info[1]).__name__, r.exc_info[1])
              for r in records if r.exc_info and r.args and r.msg.startswith("Failed to convert node")}
    for node in _nodes(model.graph):
        if not onnx.defs.has(node.op_type, node.domain):
            reason = failed.get(node.name, "tf2onnx has no conversion for it at opset %d" % OPSET)
            return node.op_type, reason.splitlines()[0]
    return None


def _nodes(graph):
    """The graph's nodes and those of its subgraphs (If branches, Loop bodies)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in list(attribute.graphs) + ([attribute.g] if attribute.HasField("g") else []):
                yield from _nodes(sub)


def write_onnx(policy, path):
    """Converts the tf.function `policy` (it has an input_signature) and writes it to `path`.
    Returns (the graph's output names in its order, None) when written, else (None, the line
    saying why not), nothing written."""
    try:
        import tf2onnx
        with _quiet() as records:
            model, _ = tf2onnx.convert.from_function(_renamed(policy), input_signature=policy.input_signature,
                                                     opset=OPSET)
            missing = _unconverted(model, records)
    except Exception as e:  # noqa: BLE001 -- any failure of the converter leaves the SavedModel standing
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return None, "%s not written: tf2onnx cannot convert the policy (%s: %s)" % (ONNX_FILE, type(e).__name__,
                                                                                      first)
    if missing:
        return None, "%s not written: tf2onnx cannot convert op %s (%s)" % ((ONNX_FILE,) + missing)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return [o.name for o in model.graph.output], None
