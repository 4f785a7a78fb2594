"""Seconds spent per named phase, summed until read (in the spirit of TorchBeast's prof.Timings):
the actor's env / inference / transfer split sent with each unroll, the learner's wait / learn /
publish split, both read by the bottleneck report (monitor.py)."""
import contextlib
import time

import numpy as np


class Timings:
    """Phase -> seconds, kept as one float64 array (so an unroll can carry it as is)."""

    def __init__(self, *phases):
        self.phases = phases
        self._index = {p: i for i, p in enumerate(phases)}
        self.seconds = np.zeros(len(phases), np.float64)

    def add(self, phase, seconds):
        self.seconds[self._index[phase]] += seconds

    @contextlib.contextmanager
    def time(self, phase):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)

    def __getitem__(self, phase):
        return float(self.seconds[self._index[phase]])

    def reset(self):
        self.seconds[:] = 0.0
