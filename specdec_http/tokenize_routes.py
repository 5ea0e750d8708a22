"""vLLM's `/tokenize` and `/detokenize`: the served tokenizer, as the server itself uses it.

    POST /tokenize    {"model"?, "prompt": str} or {"model"?, "messages": [...]}
                      -> {"tokens": [...], "count", "max_model_len"}
    POST /detokenize  {"model"?, "tokens": [...]} -> {"prompt": str}

The tokens are exactly the prompt a completion (or, with `messages`, a chat completion
through the tokenizer's chat template) would be generated from, with the same limits; the
text is decoded as outputs are (special tokens skipped). An unknown model is 404, a bad
field 400 naming it, as for the generation routes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from specdec.serving.chat_template import check_messages
from specdec.serving.frontend import Frontend
from specdec.serving.serving_errors import InvalidRequestError
from specdec.serving.text_request import TextRequest
from specdec_http.openai_api import check_model

TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_generation_prompt"}
DETOKENIZE_FIELDS = {"model", "tokens"}


async def tokenize(frontend: Frontend, body: Any) -> dict[str, Any]:
    """The token ids of a prompt (or of chat messages rendered by the chat template)."""
    _check_fields(body, TOKENIZE_FIELDS, frontend.model)
    if body.get("add_generation_prompt") not in (None, True):  # the chat routes always add it
        raise InvalidRequestError("add_generation_prompt", "only true is supported (as the chat route renders)")
    if ("prompt" in body) == ("messages" in body):
        raise InvalidRequestError("prompt", "set exactly one of prompt and messages")
    if "messages" in body:
        request = TextRequest(messages=check_messages(body["messages"]))
    elif isinstance(body["prompt"], str) and body["prompt"]:
        request = TextRequest(prompt=body["prompt"])
    else:
        raise InvalidRequestError("prompt", "must be a non-empty string")
    ids = list((await frontend.prepare(request)).prompt_token_ids)
    return {"tokens": ids, "count": len(ids), "max_model_len": frontend.max_model_len}


async def detokenize(frontend: Frontend, body: Any) -> dict[str, Any]:
    """The text of token ids, decoded as outputs are."""
    _check_fields(body, DETOKENIZE_FIELDS, frontend.model)
    served = frontend.ready()
    tokens, vocab = body.get("tokens"), served.loop.engine.verifier.vocab_size
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
    ):
        raise InvalidRequestError("tokens", f"must be a list of token ids in [0, {vocab})")
    return {"prompt": await asyncio.to_thread(served.decode, tokens)}


def _check_fields(body: Any, allowed: set[str], model: str) -> None:
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    for name in body:
        if name not in allowed:
            raise InvalidRequestError(name, "unrecognized request argument")
    check_model(body.get("model"), model)
