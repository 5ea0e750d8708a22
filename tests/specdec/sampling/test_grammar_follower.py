"""A served draft's per-sequence grammar: its matcher starts after the prompt, follows the
tokens the target emitted as history deltas bring them (never a look-ahead's unverified
drafts), rolls back where a delta truncates the history, and is freed with the sequence; a
grammar that does not compile fails its own sequence only."""

from __future__ import annotations

from even_grammar import EvenGrammar
from specdec.requests.grammar_spec import GrammarSpec
from specdec.sampling.grammar_follower import GrammarFollowers
from specdec.sampling.grammar_matcher import GrammarBackend, GrammarError

VOCAB = 40
EVEN = GrammarSpec("regex", "even")
BAD = GrammarSpec("regex", "(")
PROMPT = [1, 3, 5]  # odd: the grammar would refuse them, so following them would show


class EvenBackend(GrammarBackend):
    """Compiles "even" (EvenGrammar) and nothing else; keeps every matcher it made."""

    def __init__(self) -> None:
        self.made: list[EvenGrammar] = []

    def check(self, spec) -> None:
        if spec.text != "even":
            raise GrammarError("does not compile")

    def matcher(self, spec, vocab_size: int) -> EvenGrammar:
        self.check(spec)
        self.made.append(EvenGrammar())
        return self.made[-1]


def started(*seq_ids: str) -> tuple[GrammarFollowers, EvenBackend]:
    backend = EvenBackend()
    followers = GrammarFollowers(backend, VOCAB)
    for seq_id in seq_ids:
        followers.start(seq_id, EVEN, len(PROMPT))
    return followers, backend


def test_the_matcher_takes_each_emitted_token_once_and_the_cursor_starts_where_it_is():
    followers, backend = started("s")
    history = [*PROMPT, 2, 4]
    cursor = followers.cursor("s", history, kept=0, confirmed=len(history))
    assert backend.made[0].tokens == [2, 4] and cursor.length == len(history)
    history = [*history, 6, 8]  # the next round's delta: offset 5, two new tokens
    cursor = followers.cursor("s", history, kept=5, confirmed=len(history))
    assert backend.made[0].tokens == [2, 4, 6, 8], "a token is taken once, not again each round"
    forked = []
    backend.made[0].fork = lambda: forked.append(1) or EvenGrammar(list(backend.made[0].tokens))
    walking = cursor.at(history)
    assert forked == [], "a cursor forks the matcher when it walks, not before"
    walking.accept(10)
    walking.accept(12)
    assert backend.made[0].tokens == [2, 4, 6, 8] and forked == [1], "the proposer walks a copy, forked once"


def test_a_look_aheads_unverified_drafts_are_left_to_the_cursor_and_a_truncating_delta_rolls_back():
    followers, backend = started("s")
    history = [*PROMPT, 2, 4, 7, 6]  # the round's history, then its 2 drafts (7 is one the grammar forbids)
    cursor = followers.cursor("s", history, kept=0, confirmed=len(history) - 2)
    assert backend.made[0].tokens == [2, 4] and cursor.length == 5
    assert cursor.at(history) is None, "the cursor, not the matcher, walks the drafts (and cannot past 7)"
    history = [*PROMPT, 2, 12, 14]  # a delta from offset 4 rewrote the history after its first output token
    followers.cursor("s", history, kept=4, confirmed=len(history))
    assert backend.made[0].tokens == [2, 12, 14]


def test_a_history_token_the_grammar_refuses_stops_the_masks_until_a_delta_replaces_it():
    followers, backend = started("s")
    assert followers.cursor("s", [*PROMPT, 2, 9, 4], kept=0, confirmed=6) is None, "it drafts unmasked"
    assert backend.made[0].tokens == [2]
    cursor = followers.cursor("s", [*PROMPT, 2, 8], kept=4, confirmed=5)
    assert cursor is not None and backend.made[0].tokens == [2, 8]


def test_a_grammar_that_does_not_compile_fails_its_sequence_alone_and_release_frees_both():
    followers, _ = started("good")
    followers.start("bad", BAD, len(PROMPT))
    assert followers.failed("bad") and followers.cursor("bad", [*PROMPT, 2], 0, 4) is None
    assert not followers.failed("good") and followers.cursor("good", [*PROMPT, 2], 0, 4) is not None
    followers.release("bad")
    followers.release("good")
    assert len(followers) == 0 and followers.failed("bad") is None
    nothing = GrammarFollowers(None, VOCAB)  # a worker without a grammar engine
    nothing.start("s", EVEN, 0)
    assert nothing.failed("s") and "s" not in nothing
