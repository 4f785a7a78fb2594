"""The one stop signal of an IMPALA process: SIGINT (Ctrl-C) and SIGTERM (kill, docker stop, Slurm's
time limit) set a flag that every loop reads between steps, so a learner ends its update and writes
its checkpoint, and an actor sends the unroll in hand, instead of dying half-way."""
import signal


class StopSignal:
    """Installs the handlers once made; call it (or read `requested`) to ask whether to stop."""

    def __init__(self, signals=(signal.SIGINT, signal.SIGTERM)):
        self.requested, self.signum = False, None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.requested, self.signum = True, signum

    def __call__(self):
        return self.requested
