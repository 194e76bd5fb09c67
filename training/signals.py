"""SIGINT (Ctrl-C) and SIGTERM (kill, a scheduler's time limit) stop training after the current
step instead of mid-step, so the loop can save a checkpoint and exit with 128 + the signal number
(130 for SIGINT, 143 for SIGTERM), the shell's convention for "ended by a signal".

A second signal of the same kind is not caught: Ctrl-C twice aborts at once.
"""
import signal


class StopRequest:
    def __init__(self):
        self.signum = 0  # the signal received, 0 while none
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
