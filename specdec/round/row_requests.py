"""What one row asks of the target in a round: its verification (drafts cut by its grammar,
the masks of the positions verified, its cache reserve) and the prompt logprobs it still
lacks. The engine builds every VerifyRequest here, so a row's asks are written once."""

from __future__ import annotations

from specdec.proposers.drafts import Drafts
from specdec.requests.sequence import Sequence
from specdec.verifiers.verifier import VerifyRequest, VerifyResult


def verify_request(seq: Sequence, drafts: Drafts) -> VerifyRequest:
    """The row's verification; with a grammar, its draft cut after the first forbidden token
    and the masks of the positions verified (`GrammarRow.constrain`)."""
    mask = None
    if seq.grammar is not None:
        kept, mask = seq.grammar.constrain(drafts.token_ids)
        drafts = drafts.first(kept)
    request = VerifyRequest(seq.seq_id, seq.token_ids, drafts.token_ids, seq.request.sampling,
                            drafts.q if drafts.token_ids else None, seq.num_prompt_tokens,
                            seq.request.logprobs, mask, seq.reserve_tokens)
    return with_prompt_logprobs(seq, request)


def with_prompt_logprobs(seq: Sequence, request: VerifyRequest) -> VerifyRequest:
    """The row's verify request asking for the prompt logprobs it still lacks (the tokens
    this call reads; a prompt read in chunks collects them chunk by chunk)."""
    request.prompt_logprobs, request.prompt_logprobs_from = seq.prompt_logprobs_wanted, len(seq.prompt_logprobs)
    return request


def collect_prompt_logprobs(rows: list[Sequence], requests: list[VerifyRequest],
                            results: list[VerifyResult]) -> None:
    """Each row that asked keeps the prompt logprobs of the tokens this call read."""
    for seq, request, result in zip(rows, requests, results):
        if request.prompt_logprobs is not None:
            seq.prompt_logprobs.extend(result.prompt_logprobs or ())
