"""Incremental detokenization: token ids in, stable text out, a bounded window decoded per token.

Decoding the whole output again after every token costs O(output length) per token. Instead
(as vLLM does) only a short window of the most recent tokens is decoded:

    ids:   ... already returned ... | prefix ........ read | pending (text held back) ...
                                    ^ prefix offset        ^ read offset

* `decode(ids[prefix:read])` is text already returned; it is decoded again only as context, so
  that a tokenizer whose output depends on the previous token (a sentencepiece leading space,
  for example) yields the right text for the new tokens: new text = decode(ids[prefix:]) minus
  the first len(decode(ids[prefix:read])) characters.
* The new text is held back while it ends in U+FFFD (the replacement character): the last
  token(s) may hold the first bytes of a multi-byte UTF-8 character that a later token completes.
* Once it is returned, the offsets move on: prefix = read, read = len(ids).

Held-back tokens normally number at most 3 (a UTF-8 character has at most 4 bytes). Invalid
byte sequences (random ids) can keep the text ending in U+FFFD for longer; once more than
MAX_PENDING tokens are held, the text is returned up to the last token boundary where it is
final (no character spans the boundary). Only if none exists for MAX_HELD tokens (a vocabulary
whose tokens straddle characters, or special tokens decoding to "" inside a character) is
everything returned as decoded, possibly with a U+FFFD that a later token would have completed.
This keeps the window, and so the cost of each push, bounded.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

REPLACEMENT_CHAR = "\ufffd"  # what a decoder writes for incomplete / invalid UTF-8 bytes
MAX_PENDING = 4  # held-back tokens before looking for a final boundary among them
MAX_HELD = 32  # held-back tokens before returning the text whatever it ends in


_TOKEN_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decode -> {token id: decode([id])}


def _token_texts(decode: Callable[[list[int]], str]) -> dict[int, str]:
    """The single-token texts of `decode` seen so far, shared by every detokenizer using it."""
    try:
        return _TOKEN_TEXTS.setdefault(decode, {})
    except TypeError:  # a decode that takes no weak reference: a table of this detokenizer's own
        return {}


class TextPieces:
    """Text built from pieces; joined only when read (so appending stays O(piece))."""

    def __init__(self) -> None:
        self._pieces: list[str] = []

    def append(self, piece: str) -> None:
        if piece:
            self._pieces.append(piece)

    @property
    def text(self) -> str:
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, decoding only a bounded window per call."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._window: list[int] = []  # ids[prefix:] of the whole sequence (older ids are dropped)
        self._read = 0  # read offset, relative to the window
        self._prefix_text = ""  # decode(window[:read]): text already returned, kept as context
        self._pending = ""  # text of window[read:] that is held back (what flush() would return)
        self._returned = TextPieces()  # every piece of text returned so far
        self._token_texts = _token_texts(decode)  # decode([id]) by id: most windows hold one token

    @property
    def text(self) -> str:
        """All text returned so far (by push and flush). Joins the pieces on demand: O(length)
        when new text arrived since the last call, so read it at the end, not every token."""
        return self._returned.text

    @property
    def pending(self) -> str:
        """Text decoded but held back (it may still change); text + pending == decode(all ids)."""
        return self._pending

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became stable (may be "")."""
        self._window.append(token_id)
        decoded = self._decode(self._window)
        held = len(self._window) - self._read
        if not decoded.endswith(REPLACEMENT_CHAR):
            if len(decoded) > len(self._prefix_text) or held > MAX_PENDING:
                return self._advance(decoded, len(self._window))
        elif held > MAX_PENDING:
            return self._split(decoded, force=held > MAX_HELD)
        self._pending = decoded[len(self._prefix_text) :]
        return ""

    def flush(self) -> str:
        """At the end of the sequence: return the text still held back (even if incomplete)."""
        if self._read == len(self._window):
            return ""
        return self._advance(self._decode(self._window), len(self._window))

    def _advance(self, decoded: str, read: int) -> str:
        """Return decoded[len(prefix_text):] (decoded = decode(window[:read])); move the offsets
        on: prefix = old read, read = `read`."""
        new_text = decoded[len(self._prefix_text) :]
        del self._window[: self._read]
        self._read = read - self._read
        self._prefix_text = self._decode_prefix()
        if self._read < len(self._window):
            self._pending = self._decode(self._window)[len(self._prefix_text) :]
        else:
            self._pending = ""
        self._returned.append(new_text)
        return new_text

    def _decode_prefix(self) -> str:
        """decode(window[:read]); a single token's text from the shared table (decode is a
        function of the ids: the table saves one tokenizer call per token)."""
        if self._read != 1:
            return self._decode(self._window[: self._read])
        token = self._window[0]
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self._decode([token])
        return text

    def _split(self, decoded: str, force: bool) -> str:
        """Many tokens held back and the text still ends in U+FFFD: return the text up to the
        latest boundary among them that no character spans. A boundary j is final when
        decode(window[:j]) + decode(window[j:]) == decode(window) with decode(window[j:]) != ""
        (the bytes after j do not continue a character begun before j, and never will)."""
        for j in range(len(self._window) - 1, self._read, -1):
            head, tail = self._decode(self._window[:j]), self._decode(self._window[j:])
            if tail and head + tail == decoded:
                return self._advance(head, j)
        if force:
            return self._advance(decoded, len(self._window))
        self._pending = decoded[len(self._prefix_text) :]
        return ""
