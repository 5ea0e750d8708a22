"""xgrammar behind the core's grammar interface (`specdec.sampling.grammar_matcher`).

The tokenizer info is built from the local tokenizer object the server already loaded (never
from the hub), once per vocabulary size; its stop tokens are the engine's end-of-sequence ids,
so the mask allows them exactly where the grammar may end. Compiled grammars are kept in an
LRU cache keyed by the spec: a JSON schema compiles once however many requests send it.
JSON is compact (no free whitespace: a sampled output cannot spend its budget on blanks), and
a json_schema is strict (no properties beyond those listed).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from specdec.sampling.grammar_matcher import Grammar, GrammarBackend, GrammarError, GrammarMatcher

DEFAULT_CACHE_SIZE = 64  # distinct compiled grammars kept


def parsed_grammar(spec: Grammar) -> xgr.Grammar:
    """The spec as an xgrammar Grammar (no tokenizer needed); GrammarError (naming
    grammar.text) when it does not parse, or grammar.kind for a kind it does not know (a
    spec that arrives over the worker protocol was never checked as GrammarSpec is)."""
    try:
        if spec.kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "json_schema":
            json.loads(spec.text)  # a clear message for text that is no JSON at all
            return xgr.Grammar.from_json_schema(spec.text, any_whitespace=False, strict_mode=True)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.text)
        if spec.kind == "ebnf":
            return xgr.Grammar.from_ebnf(spec.text)
    except (RuntimeError, ValueError) as exc:
        raise GrammarError(f"the {spec.kind} does not compile: {_reason(exc)}") from None
    raise GrammarError(f"unknown grammar kind {spec.kind!r}", "grammar.kind")


def _reason(exc: Exception) -> str:
    """xgrammar's message without its source location prefix ("[time] file.cc:12: ...")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


class XGrammarMatcher(GrammarMatcher):
    """An xgrammar GrammarMatcher (its masks are already the packed int32 format)."""

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher

    def fill_mask(self, out: np.ndarray) -> None:
        self._matcher.fill_next_token_bitmask(torch.from_numpy(out[None]))  # shares out's memory

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(int(token)))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)

    def fork(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._matcher.fork())

    @property
    def ended(self) -> bool:
        return bool(self._matcher.is_terminated())


class XGrammarBackend(GrammarBackend):
    """Grammars for one tokenizer (a transformers tokenizer, the emulated one included).

    stop_token_ids: the ids that end a sequence (the engine's EOS ids).
    """

    def __init__(self, tokenizer: Any, stop_token_ids: tuple[int, ...], cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._tokenizer = tokenizer
        self._stop_ids = [int(t) for t in stop_token_ids]
        self._compilers: dict[int, xgr.GrammarCompiler] = {}
        self._compiled: OrderedDict[tuple[int, str, str], xgr.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # requests are validated on other threads than the engine's

    def check(self, spec: Grammar) -> None:
        parsed_grammar(spec)

    def matcher(self, spec: Grammar, vocab_size: int) -> GrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(self.compiled(spec, vocab_size)))

    def compiled(self, spec: Grammar, vocab_size: int) -> xgr.CompiledGrammar:
        """The spec compiled for logits of vocab_size tokens (from the LRU cache when it is there)."""
        key = (vocab_size, spec.kind, spec.text)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
            compiler = self._compiler(vocab_size)
        compiled = compiler.compile_grammar(parsed_grammar(spec))
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
        return compiled

    @property
    def cached(self) -> int:
        """How many compiled grammars the cache holds."""
        return len(self._compiled)

    def _compiler(self, vocab_size: int) -> xgr.GrammarCompiler:
        """The compiler for one vocabulary size (its tokenizer info built from the local tokenizer)."""
        if vocab_size not in self._compilers:
            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=vocab_size,
                                                      stop_token_ids=self._stop_ids)
            self._compilers[vocab_size] = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compilers[vocab_size]
