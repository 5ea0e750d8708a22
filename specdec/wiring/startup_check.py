"""The start-up check: build, without models, Ray or Redis, every object a server builds
from its config, so that a config that cannot start is refused before anything starts.

The schema (`specdec.config.config`, `specdec.config.config_rules`) refuses what it knows, naming the key;
this check is its backstop. It constructs what the router and the workers construct from
the config at start-up (the load monitor with its policy, load switch, breaker and windows,
the store's windows, the look-ahead settings, the n-gram proposer, the lease table) and
turns the first failure into a ConfigError naming the section it was built from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdec.proposers import proposer_registry as registry
from specdec.config.config import ConfigError, SpecdecConfig
from specdec.serving.lease_table import LeaseTable
from specdec.policy.load_monitor import build_load_monitor
from specdec.policy.load_store import InProcessLoadStore


def startup_objects(config: SpecdecConfig) -> dict[str, Callable[[], Any]]:
    """Section key -> a builder of what a server builds from that section."""
    from specdec.wiring.engine_builder import build_draft_ahead  # torch: only when checking

    lm = config.load_monitor
    return {
        "load_monitor": lambda: (
            build_load_monitor(lm, None, "startup-check"),
            InProcessLoadStore(lm.window_s, lm.bucket_s, lm.replica_ttl_s, lm.cost_window_s),
        ),
        "speculation": lambda: (build_draft_ahead(), registry.ngram_builder(config.speculation)()),
        "serving.lease_ttl_s": lambda: LeaseTable(config.serving.lease_ttl_s),
    }


def check_startup(config: SpecdecConfig) -> None:
    """Raise ConfigError (one line, naming the section) when an object a server builds from
    `config` at start-up cannot be built."""
    for key, build in startup_objects(config).items():
        try:
            build()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{key}: {exc}") from None
