"""Which rows of a ragged forward run together: split only where padding costs more than a forward."""


import pytest

from specdec.models.padding_groups import padding_groups


def padded_cost(counts, groups, overhead):
    return sum(overhead + len(g) * max(counts[i] for i in g) for g in groups)


def test_rows_of_similar_lengths_stay_one_forward():
    assert padding_groups([1, 1, 1, 1]) == [[0, 1, 2, 3]]
    assert padding_groups([5] * 8) == [list(range(8))]
    assert padding_groups([9, 9, 5, 5, 1, 1, 1, 1]) == [list(range(8))]  # a tie keeps one forward


def test_a_prompt_among_decode_rows_runs_apart():
    assert padding_groups([1, 64, 1, 1]) == [[1], [0, 2, 3]]
    assert padding_groups([64, 50]) == [[0, 1]]  # padding 14 tokens costs less than a forward


@pytest.mark.parametrize("counts", [[1, 64, 1, 9, 9, 3], [40, 2, 2, 17, 1], [8, 1, 8, 1, 8, 1, 30]])
def test_the_split_is_the_cheapest_of_all_partitions(counts):
    overhead = 32
    groups = padding_groups(counts, overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(counts)))
    best = min(padded_cost(counts, partition, overhead) for partition in _partitions(list(range(len(counts)))))
    assert padded_cost(counts, groups, overhead) == best


def test_rows_without_tokens_are_refused():
    with pytest.raises(ValueError, match=">= 1 token"):
        padding_groups([3, 0])
    with pytest.raises(ValueError):
        padding_groups([])


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1:]]
