"""How `specdec serve` closes the workers to everyone but its routers.

The draft and target workers answer internal gRPC calls (GetInfo, Propose, Verify) that can
take cache slots, so only the routers may reach them. Starting its own Ray (one machine),
`specdec serve` binds the workers to loopback (`serving.worker_host`, unless the config names
an interface) and, when no internal secret is configured, generates one for this run: it is
put into this process's environment (SPECDEC_INTERNAL_SECRET) before Ray starts, so the
router replicas and the workers Ray starts inherit it, and a call without it is refused
before any handler runs. Joining a running Ray (--address), its processes' environment is
not ours to set: without a configured secret the workers stay open, which is said loudly.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, MutableMapping

from specdec.config.config import SpecdecConfig
from specdec_rpc.worker.internal_auth import SECRET_ENV, configured_secret

LOOPBACK = "127.0.0.1"
UNAUTHENTICATED_WARNING = ("internal calls are not authenticated: any process that reaches the workers' ports can "
                           "take their cache slots; set security.internal_secret_file (or SPECDEC_INTERNAL_SECRET "
                           "on every Ray node)")


def _warn(line: str) -> None:
    print(f"specdec serve: warning: {line}", file=sys.stderr, flush=True)


def secure_local_workers(config: SpecdecConfig, joining: bool, environ: MutableMapping[str, str] | None = None,
                         warn: Callable[[str], None] = _warn) -> SpecdecConfig:
    """The config the workers start with: loopback unless joining or configured, and a
    generated internal secret in `environ` when none is configured and Ray starts here."""
    environ = os.environ if environ is None else environ
    if configured_secret(config.security.internal_secret_file, environ) is None:
        if joining:
            warn(UNAUTHENTICATED_WARNING)
        else:
            environ[SECRET_ENV] = secrets.token_urlsafe(32)  # this run's; Ray's processes inherit it
    if joining or config.serving.worker_host:
        return config
    return config.model_copy(update={"serving": config.serving.model_copy(update={"worker_host": LOOPBACK})})
