"""Keeping the process's own SIGTERM / SIGINT handlers across `ray.init`.

`ray.init` in a driver installs Ray's C++ SIGTERM handler, which prints a stack and aborts
(exit 134) and leaves Ray's processes to die on their own: `specdec serve` answered
SIGTERM, what Kubernetes, systemd and `docker stop` send, that way. A Python handler the
process had installed before (specdec_cli/stop_signals.py: drain, then shut down) is put
back afterwards; without one, Ray's stays.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """Restore, on exit, the Python-level handlers of SIGTERM and SIGINT that were set on entry."""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, handler)
