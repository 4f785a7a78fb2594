"""--obs_transfer: whether unrolls carry each step's newest frame or whole frame stacks. Decided
from the flags alone (no TensorFlow), so experiment.py's checks can refuse a bad pairing at once."""
from envs import batch as env_batch


def sends_frames(flags):
    """Whether unrolls carry only each step's newest frame (--obs_transfer): by default where
    the actors step Atari through ale-py's vector env, whose frame stacks the learner can
    rebuild exactly (transport.stack_frames). Raises ValueError naming the flag otherwise."""
    if flags.obs_transfer == "stacks":
        return False
    native = env_batch.resolve_backend(flags.env_backend, flags.level_name) == "native"
    if flags.obs_transfer == "frames" and not native:
        raise ValueError("--obs_transfer=frames needs the native Atari backend (its stacks start as black "
                         "frames, which the learner rebuilds); --level_name=%s --env_backend=%s steps the "
                         "Python backend: use --obs_transfer=stacks or auto" % (flags.level_name, flags.env_backend))
    return native
