"""What the proposer must catch up on: everything the first time, only what is new after."""

from specdec.proposers.proposer_view import ProposerView


def test_a_row_is_read_whole_once_then_only_what_it_gained():
    view = ProposerView()
    assert view.catch_up("a", 64) == 64
    view.proposing("a", 64)
    assert view.read == 64 and view.catch_up("a", 67) == 3
    view.start_round()
    view.proposing("a", 67)
    view.proposing("b", 10)
    assert view.read == 3 + 10


def test_drafting_ahead_moves_what_was_seen_without_counting_as_this_rounds_wait():
    view = ProposerView()
    view.drafting_ahead("a", 20)
    assert view.read == 0 and view.catch_up("a", 22) == 2
    view.forget("a")
    assert view.catch_up("a", 22) == 22


def test_a_row_shorter_than_what_the_look_ahead_read_has_nothing_to_catch_up_on():
    """The look-ahead read the row with its unverified drafts; the verify rejected some."""
    view = ProposerView()
    view.drafting_ahead("a", 24)
    assert view.catch_up("a", 21) == 0
    view.proposing("a", 21)
    assert view.read == 0 and view.catch_up("a", 23) == 2
