"""What a round's verdict does to one row: the emitted tokens are advanced through its grammar,
cut at its first stop condition and appended; its statistics count what was kept. A failure
here (e.g. decoding) fails this row alone."""

from __future__ import annotations

import dataclasses
import logging

from specdec.requests.sequence import Sequence
from specdec.requests.stats import SpecStats
from specdec.requests.stop_conditions import FINISH_STOP
from specdec.round.round_output import FINISH_ERROR, RoundOutput
from specdec.verifiers.verifier import VerifyRequest, VerifyResult

logger = logging.getLogger(__name__)


def apply_verdict(seq: Sequence, request: VerifyRequest, result: VerifyResult, gamma: int,
                  totals: SpecStats) -> tuple[RoundOutput, tuple[int, int]]:
    """Add a round's tokens to one sequence and count them in its stats and `totals` (γ: the
    round's, as the planner records it). Returns the output and the (drafted, accepted)
    counts of the round."""
    if not seq.preempted:  # a resumed row re-reads blocks it computed itself: not the client's cache hits
        seq.stats.cached_tokens = max(seq.stats.cached_tokens, min(result.cached_tokens, seq.num_prompt_tokens))
    try:
        emitted = result.emitted if seq.grammar is None else seq.grammar.advance(result.emitted)
        decision = seq.stop_checker.append(emitted)
    except Exception as exc:
        logger.warning("request %s failed: %s: %s", seq.seq_id, type(exc).__name__, exc)
        return fail_row(seq, exc), (0, 0)
    if decision.finish_reason is None and seq.grammar is not None and seq.grammar.ended:
        decision = dataclasses.replace(decision, finish_reason=FINISH_STOP)  # the grammar's end ends the output
    kept = emitted[: decision.num_kept]
    logprobs = None if result.logprobs is None else result.logprobs[: decision.num_kept]
    seq.token_ids.extend(kept)
    seq.logprobs.extend(logprobs or ())
    seq.finish_reason = decision.finish_reason
    first = seq.request.prompt_logprobs is not None and seq.stats.rounds == 0
    drafted, accepted = SpecStats.kept_counts(len(request.draft_token_ids), result.num_accepted, len(kept))
    for stats in (seq.stats, totals):
        stats.record_round(drafted, accepted, gamma)
        stats.emitted += len(kept)
    output = RoundOutput(seq.seq_id, kept, seq.finish_reason, decision.text, logprobs=logprobs,
                         prompt_logprobs=list(seq.prompt_logprobs) if first else None)
    return output, (drafted, accepted)


def fail_row(seq: Sequence, exc: BaseException) -> RoundOutput:
    """End one request with its error (its slots are freed when it retires)."""
    seq.finish_reason, seq.error = FINISH_ERROR, exc
    return RoundOutput(seq.seq_id, [], FINISH_ERROR, error=exc)
