"""Bad requests get vLLM's OpenAI-shaped errors and status codes; the server keeps serving."""

from __future__ import annotations

import pytest
import requests

from tests.sim.serving.conftest import MAX_MODEL_LEN, MODEL, post

pytestmark = pytest.mark.slow  # a real sim serve process


def _error(r: requests.Response, status: int, err_type: str, param: str | None) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    assert err["type"] == err_type
    assert err["param"] == param
    return str(err["message"])


def _still_serving(sim) -> None:
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_missing_model_is_served_by_the_first_name_as_vllm_does(sim):
    r = post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200
    assert r.json()["model"] == MODEL


def test_unknown_model(sim):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "hi"}]})):
        r = post(sim, path, {"model": "gpt-4", **body})
        assert _error(r, 404, "NotFoundError", "model") == "The model `gpt-4` does not exist."
    _still_serving(sim)


def test_prompt_longer_than_max_model_len(sim):
    n = MAX_MODEL_LEN + 10
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": list(range(n)),
                                      "max_tokens": 1})
    msg = _error(r, 400, "BadRequestError", "input_tokens")
    assert msg == (f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, "
                   f"your request has {n} input tokens. Please reduce the length of the input "
                   f"messages. (parameter=input_tokens, value={n})")
    _still_serving(sim)


def test_prompt_plus_max_tokens_over_max_model_len(sim):
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": list(range(4000)),
                                      "max_tokens": 100})
    msg = _error(r, 400, "BadRequestError", "max_tokens")
    assert msg.startswith("'max_tokens' or 'max_completion_tokens' is too large: 100. This "
                          "model's maximum context length is 4096 tokens and your request has "
                          "4000 input tokens (100 > 4096 - 4000).")
    # The default of 16 does not fit either.
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": list(range(4090))})
    assert "too large: 16." in _error(r, 400, "BadRequestError", "max_tokens")
    _still_serving(sim)


@pytest.mark.parametrize("n", [-1, 0])
def test_max_tokens_below_one(sim, n):
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": n}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "hi"}],
                                                 "max_completion_tokens": n})):
        r = post(sim, path, {"model": MODEL, **body})
        msg = _error(r, 400, "BadRequestError", "max_tokens")
        assert msg == f"max_tokens must be at least 1, got {n}. (parameter=max_tokens, value={n})"
    _still_serving(sim)


def test_malformed_json(sim):
    r = requests.post(sim.url + "/v1/completions", data=b'{"prompt": "hi", "max_tokens": 3',
                      headers={"Content-Type": "application/json"}, timeout=10)
    msg = _error(r, 400, "Bad Request", None)
    assert "json_invalid" in msg and "JSON decode error" in msg
    r = requests.post(sim.url + "/v1/completions", data=b"[1, 2]",
                      headers={"Content-Type": "application/json"}, timeout=10)
    assert "valid dictionary" in _error(r, 400, "Bad Request", None)
    r = requests.post(sim.url + "/v1/completions", data=b'{"prompt": "hi"}',
                      headers={"Content-Type": "text/plain"}, timeout=10)
    assert "Only 'application/json' is allowed" in _error(r, 400, "Bad Request", None)
    _still_serving(sim)


@pytest.mark.parametrize(("body", "needle"), [
    ({"prompt": "hi", "max_tokens": "lots"}, "int_parsing"),
    ({"prompt": "hi", "max_tokens": 2.5}, "int_from_float"),
    ({"prompt": "hi", "stream": "maybe"}, "bool_parsing"),
    ({"prompt": "hi", "priority": "high"}, "int_parsing"),
    ({"prompt": "hi", "priority": 2**63}, "less_than_equal"),
    ({"prompt": "hi", "model": 7}, "string_type"),
    ({"prompt": {"text": "hi"}}, "'prompt'"),
    ({"max_tokens": 2}, "Either prompt or prompt_embeds must be provided"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}},
     "Stream options can only be defined when `stream=True`."),
])
def test_bad_fields(sim, body, needle):
    r = post(sim, "/v1/completions", body)
    assert needle in _error(r, 400, "Bad Request", None)


def test_chat_without_messages(sim):
    r = post(sim, "/v1/chat/completions", {"model": MODEL, "max_tokens": 2})
    msg = _error(r, 400, "Bad Request", None)
    assert "'messages'" in msg and "Field required" in msg


def test_n_other_than_one_and_batches(sim):
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "hi", "n": 2})
    assert "n must be 1" in _error(r, 400, "BadRequestError", "n")
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]})
    assert "batched prompts" in _error(r, 400, "BadRequestError", "prompt")
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": [[1, 2], [3]]})
    assert "batched prompts" in _error(r, 400, "BadRequestError", "prompt")
    # A batch of one is fine.
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": [[1, 2, 3]], "max_tokens": 1})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3
    _still_serving(sim)


def test_empty_prompt_and_min_tokens(sim):
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "   ", "max_tokens": 2})
    assert _error(r, 400, "BadRequestError", "prompt") == "The decoder prompt cannot be empty"
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2,
                                      "min_tokens": 5})
    assert "min_tokens must be less than or equal to max_tokens=2" in _error(
        r, 400, "BadRequestError", "min_tokens")


def test_long_token_id_prompts_count_exactly(sim):
    # Bodies this large take the server's fast id-counting path.
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": list(range(1000, 4500)),
                                      "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3500
    broken = b'{"prompt": [1, 2,, 3' + b", 7" * 9000 + b'], "max_tokens": 2}'
    r = requests.post(sim.url + "/v1/completions", data=broken, timeout=10,
                      headers={"Content-Type": "application/json"})
    assert "json_invalid" in _error(r, 400, "Bad Request", None)
    nested = {"model": MODEL, "prompt": "four words right here", "max_tokens": 1,
              "extra": {"prompt": list(range(5000))}}
    assert post(sim, "/v1/completions", nested).json()["usage"]["prompt_tokens"] == 4


def test_unknown_route_and_method(sim):
    r = requests.get(sim.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
    r = requests.get(sim.url + "/v1/completions", timeout=10)
    assert r.status_code == 405


def test_tokenize(sim):
    r = post(sim, "/tokenize", {"model": MODEL, "prompt": "Hello, world!"})
    body = r.json()
    assert body["count"] == 4 and len(body["tokens"]) == 4
    assert body["max_model_len"] == MAX_MODEL_LEN
    assert post(sim, "/tokenize", {"prompt": [5, 6, 7]}).json()["tokens"] == [5, 6, 7]
    chat = post(sim, "/tokenize", {"messages": [{"role": "user", "content": "a b c"}]}).json()
    assert chat["count"] == 3 + 4 + 3 == len(chat["tokens"])
    r = post(sim, "/tokenize", {"model": "nope", "prompt": "x"})
    assert _error(r, 404, "NotFoundError", "model")


def test_detokenize_needs_a_tokenizer(sim):
    """Without a tokenizer (this server counts by words) /detokenize answers 400 saying how to
    give one; with one it decodes (tests/conformance/test_metrics.py, against real vLLM)."""
    r = post(sim, "/detokenize", {"model": MODEL, "tokens": [5, 6, 7]})
    assert _error(r, 400, "BadRequestError", "tokens")
    assert "--tokenizer" in r.json()["error"]["message"]
    r = post(sim, "/detokenize", {"model": MODEL, "tokens": "abc"})
    assert r.status_code == 400
    r = post(sim, "/detokenize", {"model": "nope", "tokens": [1]})
    assert _error(r, 404, "NotFoundError", "model")
