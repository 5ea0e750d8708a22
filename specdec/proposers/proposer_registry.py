"""The proposers a server can run, by name: what config, both command lines and both APIs read.

Three names exist. "draft" is a small draft model (in-process, or a draft worker behind
gRPC); "ngram" is prompt lookup in the request's own context (cheap, always loaded
beside the configured proposer so requests may pick it); "none" is plain target decoding
(γ = 0). The registry says which names a request may pick and builds the in-process
proposers; the distributed router builds "draft" as a gRPC client instead
(`specdec_rpc.worker.router_backend`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # config imports the names; keep torch out of that import
    from specdec.proposers.base import Proposer

DRAFT, NGRAM, NONE = "draft", "ngram", "none"
#: every configurable proposer name (speculation.proposer, `--proposer`)
NAMES = (DRAFT, NGRAM, NONE)
#: the names a request may pick (none of them: "none" is speculation mode OFF)
REQUESTABLE = (DRAFT, NGRAM)
ProposerName = Literal["draft", "ngram", "none"]


@dataclass(frozen=True)
class ProposerSpec:
    """One proposer: its name, what it is, and whether a request may pick it by name."""

    name: str
    description: str
    requestable: bool


SPECS = {
    DRAFT: ProposerSpec(DRAFT, "a small draft model guesses the next γ tokens", True),
    NGRAM: ProposerSpec(NGRAM, "n-gram lookup in the request's own context", True),
    NONE: ProposerSpec(NONE, "no proposer: plain target decoding (γ = 0)", False),
}


def check_name(name: str, field: str = "speculation.proposer", requestable: bool = False) -> str:
    """`name` if it is a known proposer (a requestable one when asked); ValueError naming the field."""
    allowed = REQUESTABLE if requestable else NAMES
    if name not in allowed:
        raise ValueError(f"{field}: unknown proposer {name!r} (one of {', '.join(allowed)})")
    return name


def loaded_names(configured: str) -> tuple[str, ...]:
    """The proposers a server with `configured` loads: n-gram always, the draft model only
    when it is the configured one (it costs memory and a worker)."""
    check_name(configured)
    return (DRAFT, NGRAM) if configured == DRAFT else (NGRAM,)


def build_proposers(configured: str, builders: dict[str, Callable[[], "Proposer"]]) -> dict[str, "Proposer"]:
    """The loaded proposers (see loaded_names), each made by its builder (called only for
    the proposers that are loaded)."""
    return {name: builders[name]() for name in loaded_names(configured)}


def ngram_builder(speculation: Any) -> Callable[[], "Proposer"]:
    """A builder of the n-gram proposer from the speculation section of the config."""
    from specdec.proposers.ngram_proposer import NgramProposer

    return lambda: NgramProposer(speculation.ngram.n_min, speculation.ngram.n_max)
