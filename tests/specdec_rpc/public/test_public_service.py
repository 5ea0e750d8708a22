"""PublicService on an in-process backend: the public API's behaviour without Ray or a network."""

import asyncio

import pytest
from grpc_health.v1 import health_pb2

from specdec.config.config import load_config
from specdec_rpc.public.public_service import SERVICE_NAME, PublicService
from specdec.wiring.engine_builder import build_served_engine
from specdec_rpc.public.status_codes import NotReadyError
from specdec_rpc.v1 import specdec_pb2 as pb


@pytest.fixture(scope="module")
def service():
    backend = build_served_engine(load_config(overrides={"cache": {"num_slots": 4}}))
    yield PublicService(backend)
    backend.close()


def request(prompt_ids, n, **speculation):
    return pb.GenerateRequest(prompt_token_ids=prompt_ids, max_new_tokens=n,
                              speculation=pb.SpeculationParams(**speculation))


@pytest.mark.parametrize(
    "speculation",
    [{}, {"proposer": pb.PROPOSER_KIND_NGRAM, "mode": pb.SPECULATION_MODE_ON}, {"mode": pb.SPECULATION_MODE_OFF}],
)
def test_greedy_output_equals_the_target_alone(service, prompt_ids, hf_greedy, speculation):
    response = asyncio.run(service.generate(request(prompt_ids[0], 16, **speculation)))
    assert list(response.token_ids) == hf_greedy(prompt_ids[0], 16)
    stats, off = response.stats, speculation.get("mode") == pb.SPECULATION_MODE_OFF
    assert stats.speculation_enabled == (stats.gamma > 0) and stats.gamma <= 4
    assert (stats.drafted == 0 and stats.gamma == 0) if off else stats.drafted > 0


def test_stream_chunks_add_up_to_the_unary_response(service, tokenizer):
    message = pb.GenerateRequest(prompt="def fibonacci(n):", max_new_tokens=24)

    async def main():
        return [c async for c in service.generate_stream(message)], await service.generate(message)

    chunks, response = asyncio.run(main())
    assert len(chunks) > 1 and all(not c.finish_reason for c in chunks[:-1])
    assert [t for c in chunks for t in c.token_ids] == list(response.token_ids)
    assert "".join(c.text for c in chunks) == response.text
    assert chunks[-1].finish_reason == response.finish_reason and chunks[-1].stats.rounds == response.stats.rounds


def test_bad_input_raises_value_error_naming_the_field(service):
    with pytest.raises(ValueError, match="max_new_tokens"):
        asyncio.run(service.generate(pb.GenerateRequest(prompt="x", max_new_tokens=10**6)))
    with pytest.raises(ValueError, match="prompt"):
        asyncio.run(service.generate(pb.GenerateRequest(prompt="x " * 3000)))


def test_health_and_not_ready():
    loading = PublicService()
    assert loading.health() == health_pb2.HealthCheckResponse.NOT_SERVING
    assert loading.health("no.such.Service") == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    with pytest.raises(NotReadyError, match="loading"):
        asyncio.run(loading.generate(pb.GenerateRequest(prompt="x")))


def test_a_loaded_service_is_serving(service):
    assert service.health() == service.health(SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING


def test_stats_acceptance_rate_and_mean_accepted_length_come_from_the_same_counts(service, prompt_ids):
    asyncio.run(service.generate(request(prompt_ids[1], 24, mode=pb.SPECULATION_MODE_ON)))
    stats = service.stats()
    assert stats.drafted > 0
    assert stats.acceptance_rate == pytest.approx(stats.accepted / stats.drafted)
    assert stats.window_mean_accepted_length == pytest.approx(stats.mean_accepted_length)
    assert stats.mean_accepted_length == pytest.approx((stats.accepted + stats.rounds) / stats.rounds)


def test_a_draft_worker_that_is_down_is_reported_not_hidden(prompt_ids, hf_greedy, tokenizer):
    """Requests still get the target's output; the request's stats and GetStats say that
    speculation was unavailable, and why."""
    from specdec.wiring.engine_builder import EngineParts, load_runner
    from specdec.verifiers.target_verifier import TargetVerifier
    from specdec_rpc.worker.remote_proposer import RemoteProposer

    config = load_config(overrides={"cache": {"num_slots": 2}})
    draft = RemoteProposer("127.0.0.1:1", timeout_s=1.0)
    target = TargetVerifier(load_runner(config.models.target, config.models, config.cache))
    backend = build_served_engine(config, EngineParts(target, draft=lambda: draft, tokenizer=tokenizer))
    try:
        service = PublicService(backend)
        response = asyncio.run(service.generate(request(prompt_ids[0], 8, mode=pb.SPECULATION_MODE_ON)))
        assert list(response.token_ids) == hf_greedy(prompt_ids[0], 8)
        assert not response.stats.speculation_enabled and response.stats.drafted == 0
        stats = service.stats()
        assert not stats.speculation_enabled and stats.reason.startswith("speculation unavailable: draft worker")
    finally:
        backend.close()


def test_stats_carry_the_measured_choice_of_drafting_ahead_and_the_status_shows_it():
    from dataclasses import replace

    from specdec.serving.server_status import ServerStatus
    from specdec_cli.client_cli import format_status
    from specdec_rpc.public.public_service import to_stats_response

    status = ServerStatus(ready=True, problems=(), rounds=90, drafted=200, accepted=120, acceptance_rate=0.6,
                          mean_accepted_length=2.3, requests_running=1, requests_waiting=0,
                          round_profile_ms={"round_ms": 12.0}, rounds_profiled=90, draft_ahead=(40, 0.5),
                          overlap_choice=(180.0, 0.0, True))
    profile = to_stats_response(status).round_profile
    assert (profile.rows_drafted_ahead, profile.look_ahead_hit_rate) == (40, 0.5)
    looked = (profile.look_ahead_tokens_per_s, profile.sequential_tokens_per_s, profile.looking_ahead)
    assert looked == (180.0, 0.0, True)
    line = next(line for line in format_status(to_stats_response(status)).splitlines() if line.startswith("drafting"))
    assert "on for a lone request" in line and "50% of 40" in line
    assert "180 tokens/s looking ahead, not measured yet without" in line
    always = replace(status, overlap_choice=None)  # the default: a lone request always looks ahead
    line = next(line for line in format_status(to_stats_response(always)).splitlines() if line.startswith("drafting"))
    assert "50% of 40 look-aheads used" in line and "for a lone request" not in line


def test_stats_carry_each_round_cost_coefficient_under_its_own_name():
    from specdec.policy.round_cost import RoundCostModel
    from specdec.policy.policy_status import PolicyStatus
    from specdec_cli.client_cli import _round_cost
    from specdec_rpc.public.public_service import _set_policy_view

    cost = RoundCostModel(verify=(0.010, 0.0015, 0.0004, 0.0002, 0.007, 0.045), draft=(0.003, 0.002, 0.0005, 0.00005),
                          overhead_s=0.0003, prompt_tokens=64.0, drafting_scale=0.8, plain_scale=1.25)
    response = pb.GetStatsResponse()
    _set_policy_view(response, PolicyStatus(round_cost=cost))
    c = response.round_cost
    assert (c.verify_fixed_ms, c.verify_row_ms, c.verify_drafted_token_ms, c.verify_prompt_token_ms,
            c.verify_speculating_ms, c.verify_prompt_round_ms) == pytest.approx((10.0, 1.5, 0.4, 0.2, 7.0, 45.0))
    assert (c.draft_fixed_ms, c.draft_step_ms, c.draft_row_step_ms, c.draft_catch_up_token_ms, c.overhead_ms) == \
        pytest.approx((3.0, 2.0, 0.5, 0.05, 0.3))
    assert (c.drafting_scale, c.plain_scale) == pytest.approx((0.8, 1.25))
    line = _round_cost(response)
    assert "10.00 + 1.50/row + 0.40/drafted token + 0.200/prompt token (mean prompt 64) + 7.00 when verifying" in line
    assert "+ 45.00 when reading prompts" in line
    assert "drafting rounds x0.80, plain rounds x1.25" in line


def test_score_only_returns_the_prompts_logprobs_and_no_tokens(service, prompt_ids):
    prompt = prompt_ids[0]
    scored = asyncio.run(service.generate(pb.GenerateRequest(prompt_token_ids=prompt, prompt_logprobs=1,
                                                             score_only=True)))
    generated = asyncio.run(service.generate(pb.GenerateRequest(prompt_token_ids=prompt, prompt_logprobs=1,
                                                                max_new_tokens=2)))
    assert not scored.token_ids and scored.finish_reason == "length" and len(generated.token_ids) == 2
    assert [t.token_id for t in scored.prompt_logprobs] == list(prompt[1:])  # the first token has none
    assert [t.logprob for t in scored.prompt_logprobs] == pytest.approx([t.logprob for t in generated.prompt_logprobs])


@pytest.mark.parametrize("fields, reason", [({}, "needs prompt_logprobs"),
                                            ({"prompt_logprobs": 1, "max_new_tokens": 4}, "generates nothing")])
def test_score_only_without_scores_or_with_a_budget_names_score_only(service, fields, reason):
    with pytest.raises(ValueError, match=f"score_only: {reason}"):
        asyncio.run(service.generate(pb.GenerateRequest(prompt="x", score_only=True, **fields)))
