"""Start-up check that draft and target speak the same vocabulary."""

from __future__ import annotations

from typing import Any


class TokenizerMismatchError(ValueError):
    """Draft and target map tokens to different ids; speculation would be meaningless."""


def check_tokenizers_compatible(target: Any, draft: Any, target_vocab_rows: int, draft_vocab_rows: int) -> None:
    """Raise TokenizerMismatchError unless both tokenizers map the same tokens to the same ids.

    `target` / `draft` are Hugging Face tokenizers (anything with get_vocab()). The models'
    embedding rows may differ (padding rows beyond the tokenizer are fine) but each model
    must have a row for every token of the tokenizer.
    """
    target_vocab: dict[str, int] = target.get_vocab()
    draft_vocab: dict[str, int] = draft.get_vocab()
    target_by_id = {i: t for t, i in target_vocab.items()}
    draft_by_id = {i: t for t, i in draft_vocab.items()}
    mismatches = [
        (i, target_by_id.get(i), draft_by_id.get(i))
        for i in sorted(set(target_by_id) | set(draft_by_id))
        if target_by_id.get(i) != draft_by_id.get(i)
    ]
    if mismatches:
        shown = ", ".join(f"id {i}: target {t!r} vs draft {d!r}" for i, t, d in mismatches[:5])
        raise TokenizerMismatchError(
            f"draft and target tokenizers differ in {len(mismatches)} token ids (first: {shown}); "
            "use a draft trained with the target's tokenizer"
        )
    if target.eos_token_id != draft.eos_token_id:
        raise TokenizerMismatchError(
            f"end-of-sequence ids differ: target {target.eos_token_id} vs draft {draft.eos_token_id}"
        )
    for name, rows in (("target", target_vocab_rows), ("draft", draft_vocab_rows)):
        if rows < len(target_vocab):
            raise TokenizerMismatchError(
                f"{name} model has {rows} vocabulary rows but the tokenizer has {len(target_vocab)} tokens"
            )
