"""OpenAI's JSON to the frontend's requests and back: defaults, extensions, refusals that
name the field, response and chunk shapes, and OpenAI's error object per error kind."""

import json

import pytest

from specdec.serving.frontend import Completion, Delta, Usage
from specdec.serving.serving_errors import AdmissionError, ErrorKind, InvalidRequestError, NotFoundError, classify
from specdec.requests.stats import SpecStats
from specdec.sampling.token_logprobs import TokenLogprob
from specdec_http.openai_logprobs import LogprobsFormat
from specdec_http.openai_api import chat_request, completion_request, named_as_sent
from specdec_http.openai_responses import Call, UsageReport, chunk_events, completion_object, error_body

MODEL = "bundled:target"


def test_a_completion_request_takes_openais_defaults_and_the_servers_budget():
    request, stream = completion_request({"model": MODEL, "prompt": "def f():"}, MODEL)
    assert (request.prompt, request.max_new_tokens, stream) == ("def f():", None, False)
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k) == (1.0, 1.0, 0)
    assert (request.mode, request.gamma, request.proposer, request.timeout_s) == ("auto", None, None, None)


def test_fields_and_extensions_travel():
    body = {"model": MODEL, "prompt": [[5, 6, 7]], "max_tokens": 9, "temperature": 0, "top_p": 0.5, "top_k": 3,
            "seed": 2**64 - 1, "stop": "\n\n", "stop_token_ids": [2], "n": 1, "stream": True, "timeout_s": 1.5,
            "speculation": {"mode": "on", "gamma": 6, "proposer": "ngram"}, "logprobs": None, "user": "me"}
    request, stream = completion_request(body, MODEL)
    assert stream and request.prompt_token_ids == (5, 6, 7) and request.max_new_tokens == 9
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k, request.sampling.seed) == (
        0.0, 0.5, 3, 2**64 - 1)
    assert (request.stop, request.stop_token_ids, request.timeout_s, request.request_id) == (("\n\n",), (2,), 1.5, None)
    assert (request.mode, request.gamma, request.proposer) == ("on", 6, "ngram")


def test_a_chat_request_carries_its_messages_and_max_completion_tokens():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5}
    request, _ = chat_request(body, MODEL)
    assert request.messages == ({"role": "user", "content": "hi"},) and request.max_new_tokens == 5


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 129}, "n"),
    ({"prompt": ["x"] * 65, "n": 2}, "n"),
    ({"prompt": "x", "n": True}, "n"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "n": 2, "best_of": 3}, "best_of"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": ["a", [1]]}, "prompt"),
    ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"),
    ({"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"²": 1}}, "logit_bias"),  # a digit to str.isdigit, not to int()
    ({"prompt": "x", "logit_bias": {"1" * 5000: 1}}, "logit_bias"),  # past int()'s 4300 digits
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [5]}, "logit_bias"),
    ({"prompt": "x", "mystery": 1}, "mystery"),
    ({"prompt": 3}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "seed": -(2**63) - 1}, "seed"),
    ({"prompt": "x", "user": 7}, "user"),
    ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "no"}}, "stream_options"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": False, "stream_options": {"include_usage": False}}, "stream_options"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stream": True, "stream_options": "usage"}, "stream_options"),
    ({"prompt": "x", "speculation": {"gamma": -2}}, "speculation.gamma"),
    ({"prompt": "x", "speculation": {"colour": "blue"}}, "speculation"),
    ({"prompt": "x", "timeout_s": float("nan")}, "timeout_s"),
    ({"prompt": "x", "top_k": 2**31}, "top_k"),
    ({"prompt": "x", "stop": [[[[[[[[["a"]]]]]]]]]}, "stop"),
    ({"prompt": "x", "speculation": {"mode": [[[[[[[["on"]]]]]]]]}}, "speculation"),
])
def test_bad_or_unsupported_fields_are_refused_naming_them(body, param):
    with pytest.raises(InvalidRequestError) as error:
        completion_request(body, MODEL)
    assert error.value.param == param
    status, obj = error_body(classify(error.value), str(error.value), error.value)
    assert status == 400 and obj["error"]["param"] == param and obj["error"]["type"] == "invalid_request_error"


def test_a_chat_budget_or_prompt_the_core_refuses_is_named_as_the_client_sent_it():
    budget = ValueError("max_new_tokens 5000 exceeds the limit 4096")
    renamed = named_as_sent(budget, {"messages": [], "max_completion_tokens": 5000}, chat=True)
    assert renamed.param == "max_completion_tokens"
    assert str(renamed) == "max_completion_tokens: 5000 exceeds the limit 4096"
    assert named_as_sent(budget, {"messages": [], "max_tokens": 5000}, chat=True) is budget  # error_body: max_tokens
    assert named_as_sent(InvalidRequestError("prompt", "is too long"), {"messages": []}, chat=True).param == "messages"
    assert named_as_sent(InvalidRequestError("prompt", "is too long"), {"prompt": "x"}, chat=False).param == "prompt"


NEUTRAL_VALUES = [("repetition_penalty", 1.0), ("repetition_penalty", 1), ("presence_penalty", 0),
                  ("frequency_penalty", 0.0), ("logprobs", None), ("logprobs", False), ("min_p", 0),
                  ("min_p", 0.0), ("response_format", {"type": "text"}), ("best_of", 1), ("n", 1),
                  ("top_logprobs", 0), ("echo", False), ("logit_bias", {}), ("tool_choice", "none")]


@pytest.mark.parametrize("name, value", NEUTRAL_VALUES)
def test_the_neutral_values_clients_send_by_default_are_accepted_and_change_nothing(name, value):
    plain, _ = completion_request({"model": MODEL, "prompt": "x", "temperature": 0.5}, MODEL)
    request, _ = completion_request({"model": MODEL, "prompt": "x", "temperature": 0.5, name: value}, MODEL)
    assert request == plain


@pytest.mark.parametrize("name, value", [
    ("top_logprobs", 2), ("tools", [{"type": "function"}]),
])
def test_values_that_would_change_the_output_of_an_unimplemented_field_are_400_naming_it(name, value):
    with pytest.raises(InvalidRequestError) as error:
        completion_request({"model": MODEL, "prompt": "x", name: value}, MODEL)
    assert error.value.param == name and "supported" in str(error.value)


def test_min_p_penalties_and_logit_bias_map_into_the_sampling_params():
    body = {"prompt": "x", "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.1,
            "logit_bias": {"7": -100, "5": 10}}
    sampling = completion_request(body, MODEL)[0].sampling
    assert (sampling.min_p, sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (
        0.05, 0.5, -1.0, 1.1)
    assert sampling.logit_bias == ((5, 10.0), (7, -100.0))


@pytest.mark.parametrize("name, value", [("metadata", {"team": "a"}), ("store", False), ("service_tier", "auto"),
                                         ("prompt_cache_key", "k"), ("safety_identifier", "u")])
def test_openai_fields_that_change_nothing_returned_are_ignored(name, value):
    plain, _ = completion_request({"prompt": "x"}, MODEL)
    assert completion_request({"prompt": "x", name: value}, MODEL)[0] == plain


def test_top_k_minus_one_is_no_top_k_and_ignore_eos_travels():
    request, _ = completion_request({"prompt": "x", "top_k": -1, "ignore_eos": True}, MODEL)
    assert request.sampling.top_k == 0 and request.ignore_eos
    assert not completion_request({"prompt": "x", "ignore_eos": False}, MODEL)[0].ignore_eos


@pytest.mark.parametrize("seed, core_seed", [(-1, 2**64 - 1), (-(2**63), 2**63), (0, 0), (2**63 - 1, 2**63 - 1)])
def test_a_negative_int64_seed_is_its_twos_complement(seed, core_seed):
    assert completion_request({"prompt": "x", "seed": seed}, MODEL)[0].sampling.seed == core_seed


def test_chat_content_parts_are_joined_with_newlines():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request, _ = chat_request({"messages": [{"role": "user", "content": parts}]}, MODEL)
    assert request.messages == ({"role": "user", "content": "a\nb"},)


def test_an_unknown_model_is_404_model_not_found_in_openais_shape():
    with pytest.raises(NotFoundError) as error:
        completion_request({"model": "gpt-4", "prompt": "x"}, MODEL)
    status, obj = error_body(classify(error.value), str(error.value), error.value)
    assert status == 404 and obj["error"]["code"] == "model_not_found" and "gpt-4" in obj["error"]["message"]
    assert obj["error"]["type"] == "invalid_request_error" and obj["error"]["param"] is None


def test_logprobs_ask_for_the_alternatives_in_each_apis_terms():
    assert completion_request({"prompt": "x", "logprobs": 0}, MODEL)[0].logprobs == 0
    assert completion_request({"prompt": "x", "logprobs": 5}, MODEL)[0].logprobs == 5
    assert completion_request({"prompt": "x", "logprobs": False}, MODEL)[0].logprobs is None
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert chat_request({**chat, "logprobs": True, "top_logprobs": 3}, MODEL)[0].logprobs == 3
    assert chat_request({**chat, "logprobs": True}, MODEL)[0].logprobs == 0
    assert chat_request({**chat, "logprobs": False, "top_logprobs": 0}, MODEL)[0].logprobs is None
    for body, param in [({**chat, "top_logprobs": 2}, "top_logprobs"), ({**chat, "logprobs": 2}, "logprobs"),
                        ({**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs")]:
        with pytest.raises(InvalidRequestError) as error:
            chat_request(body, MODEL)
        assert error.value.param == param


def test_a_body_that_is_not_an_object_is_refused():
    with pytest.raises(InvalidRequestError, match="body"):
        completion_request(["prompt"], MODEL)


def completion(text="hi", ids=(1, 2), reason="stop") -> Completion:
    stats = SpecStats(rounds=2, drafted=4, accepted=1, emitted=len(ids), gamma=2)
    return Completion("req-1", text, list(ids), reason, stats, Usage(3, len(ids), cached_tokens=2))


def test_a_completion_becomes_a_text_completion_with_usage_and_speculation():
    obj = completion_object(Call("cmpl-1", "text_completion", MODEL, 0), completion())
    assert obj["object"] == "text_completion" and obj["model"] == MODEL
    assert obj["choices"] == [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}]
    assert obj["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                            "prompt_tokens_details": {"cached_tokens": 2}}
    assert obj["speculation"]["rounds"] == 2 and obj["speculation"]["acceptance_rate"] == 0.25


def test_a_chat_completion_has_an_assistant_message():
    obj = completion_object(Call.new(chat=True, model=MODEL), completion())
    assert obj["id"].startswith("chatcmpl-") and obj["object"] == "chat.completion"
    assert obj["choices"][0]["message"] == {"role": "assistant", "content": "hi"}


def events(data: list[str]) -> list[dict]:
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in data)
    return [json.loads(e[len("data: "):]) for e in data]


def test_chat_chunks_carry_the_role_first_and_the_outcome_last():
    call, report = Call("chatcmpl-1", "chat.completion", MODEL, 0), UsageReport.of({"include_usage": True})
    [first] = events(chunk_events(call, Delta("de", [1], usage=Usage(4, 1)), first=True, report=report))
    assert first["object"] == "chat.completion.chunk" and "usage" not in first
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "de"}
    assert first["choices"][0]["finish_reason"] is None
    last = Delta("f", [2], "length", SpecStats(rounds=1), Usage(4, 2, cached_tokens=0))
    chunk, usage = events(chunk_events(call, last, first=False, report=report))
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert chunk["choices"][0]["delta"] == {"content": "f"} and chunk["choices"][0]["finish_reason"] == "length"
    assert chunk["speculation"]["rounds"] == 1 and "usage" not in chunk
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 6
    assert len(chunk_events(call, last, first=False, report=UsageReport.of(None))) == 1


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk_and_need_include_usage():
    call, continuous = Call("cmpl-1", "text_completion", MODEL, 0), {"include_usage": True,
                                                                       "continuous_usage_stats": True}
    [first] = events(chunk_events(call, Delta("de", [1], usage=Usage(4, 1)), True, UsageReport.of(continuous)))
    assert first["usage"] == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5,
                              "prompt_tokens_details": {"cached_tokens": 0}}
    last = Delta("f", [2], "length", SpecStats(rounds=1), Usage(4, 2))
    chunk, usage = events(chunk_events(call, last, False, UsageReport.of(continuous)))
    assert chunk["usage"] == usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                                                "prompt_tokens_details": {"cached_tokens": 0}}
    alone = UsageReport.of({"continuous_usage_stats": True})  # as vLLM: nothing without include_usage
    assert "usage" not in events(chunk_events(call, last, False, alone))[0]


@pytest.mark.parametrize("exc, status, code", [
    (AdmissionError("admission limit reached"), 429, "admission_limit"),
    (TimeoutError("deadline exceeded"), 504, "deadline_exceeded"),
    (RuntimeError("boom"), 500, None),
])
def test_each_error_kind_has_its_http_status(exc, status, code):
    got, obj = error_body(classify(exc), str(exc), exc)
    assert got == status and obj["error"]["code"] == code and obj["error"]["param"] is None
    assert set(obj["error"]) == {"message", "type", "param", "code"}


def test_unavailable_is_503():
    assert error_body(ErrorKind.UNAVAILABLE, "loading")[0] == 503


def test_a_tpot_target_travels_in_the_speculation_object():
    request, _ = completion_request({"prompt": "x", "speculation": {"tpot_target_ms": 40}}, MODEL)
    assert request.tpot_target_ms == 40.0
    assert completion_request({"prompt": "x"}, MODEL)[0].tpot_target_ms is None


@pytest.mark.parametrize("target", [0, -1.5, "fast", True, float("inf")])
def test_a_tpot_target_that_is_not_a_positive_finite_number_is_a_400_naming_it(target):
    with pytest.raises(InvalidRequestError) as error:
        completion_request({"prompt": "x", "speculation": {"tpot_target_ms": target}}, MODEL)
    assert error.value.param == "speculation.tpot_target_ms"
    assert error_body(classify(error.value), str(error.value), error.value)[0] == 400


TOKENS = [TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.5))), TokenLogprob(2, float("-inf"), ((1, -0.1), (3, -2.5)))]


def text_of(token_id: int) -> str:
    return {1: "de", 2: "f", 3: "é"}[token_id]


def test_completion_logprobs_are_parallel_lists_with_text_offsets_running_on_across_chunks():
    call, how = Call("cmpl-1", "text_completion", MODEL, 0), LogprobsFormat(text_of)
    [chunk] = events(chunk_events(call, Delta("de", [1], logprobs=TOKENS[:1]), True, UsageReport(), how))
    [last] = events(chunk_events(call, Delta("f", [2], "length", SpecStats(), Usage(1, 2), TOKENS[1:]), False,
                                 UsageReport(), how))
    assert chunk["choices"][0]["logprobs"] == {"tokens": ["de"], "token_logprobs": [-0.5], "text_offset": [0],
                                               "top_logprobs": [{"de": -0.5, "f": -1.5}]}
    assert last["choices"][0]["logprobs"]["text_offset"] == [2]
    assert last["choices"][0]["logprobs"]["token_logprobs"] == [-9999.0]  # removed by top-k / top-p: no -inf in JSON
    unary = completion_object(call, Completion("r", "def", [1, 2], "length", SpecStats(), Usage(1, 2), TOKENS),
                              LogprobsFormat(text_of))
    assert unary["choices"][0]["logprobs"]["text_offset"] == [0, 2]


def test_chat_logprobs_are_token_objects_with_bytes():
    call = Call("chatcmpl-1", "chat.completion", MODEL, 0)
    obj = completion_object(call, Completion("r", "def", [1, 2], "stop", SpecStats(), Usage(1, 2), TOKENS),
                            LogprobsFormat(text_of))
    first, second = obj["choices"][0]["logprobs"]["content"]
    assert first == {"token": "de", "logprob": -0.5, "bytes": [100, 101], "top_logprobs": [
        {"token": "de", "logprob": -0.5, "bytes": [100, 101]}, {"token": "f", "logprob": -1.5, "bytes": [102]}]}
    assert second["top_logprobs"][1] == {"token": "é", "logprob": -2.5, "bytes": [195, 169]}
    assert completion_object(call, completion())["choices"][0]["logprobs"] is None  # not asked for
