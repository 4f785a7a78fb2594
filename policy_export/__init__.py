"""What IMPALA's and WALL-E's `--mode=export` share: the export folder (a TensorFlow SavedModel,
policy.json, policy.onnx) and its checks, for any tf.Module whose `policy` is a tf.function with
an input signature. The systems' own modules (impala/export.py, walle/export.py) build that module
from their agents; this package imports neither system, only envs/."""
