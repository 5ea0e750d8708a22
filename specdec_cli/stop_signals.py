"""StopSignals: SIGINT and SIGTERM stop `specdec serve` promptly, whatever it is waiting on.

The first signal raises `Interrupted` in the main thread, so a start that waits (for Ray,
a placement group, a model load) unwinds through its cleanup at once; later signals are
ignored (with a line on stderr) so that they cannot cut that cleanup short and leave
processes or placement groups behind. The cleanup itself is bounded (every wait in it has
a timeout).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """Raised by the first stop signal (a BaseException: cleanup code that catches
    Exception does not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """Installs the handlers; `wait()` blocks until a signal (raising Interrupted)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> "StopSignals":
        for sig in SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None:
            print(f"specdec serve: {signal.Signals(signum).name} ignored: already stopping",
                  file=sys.stderr, flush=True)
            return
        self.received = signum
        raise Interrupted(signum)

    def wait(self) -> None:
        """Block until a stop signal; raises Interrupted."""
        while True:
            time.sleep(0.5)
