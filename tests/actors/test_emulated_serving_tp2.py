"""A tensor-parallel emulated target (2 ranks, each an emulated device; the leader waits for
its follower) serves the same greedy output as the emulated target alone, in-process."""

from __future__ import annotations

import pytest

from specdec_rpc.client import SpecdecClient
from emulated_pair import PROMPTS, started, target_alone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app_tp2():
    app = started(2)
    yield app
    app.shutdown()


def test_a_tensor_parallel_emulated_target_serves_the_same_output(app_tp2):
    with SpecdecClient(app_tp2.address) as client:
        response = client.generate(PROMPTS[1], max_new_tokens=30, mode="on")
    assert list(response.token_ids) == target_alone()(PROMPTS[1], 30)
