"""The official ``openai`` SDK against the served simulator: completions and chat, streaming and
not, usage, model listing, errors as SDK exceptions."""

from __future__ import annotations

import openai
import pytest

from chunktune.core.tokens import count_chat_tokens, count_tokens
from tests.sim.serving.conftest import MAX_MODEL_LEN, MODEL

pytestmark = pytest.mark.slow  # a real sim serve process


@pytest.fixture(scope="module")
def client(sim):
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0,
                       timeout=30) as c:
        yield c


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL, "sim-alias"]
    assert models.data[0].owned_by == "vllm"
    assert models.data[0].model_extra["max_model_len"] == MAX_MODEL_LEN


def test_completion(client):
    prompt = "The quick brown fox, again."
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.model == MODEL
    assert r.choices[0].text == " tok" * 5
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == count_tokens(prompt) == 7
    assert r.usage.completion_tokens == 5
    assert r.usage.total_tokens == 12
    # The generated text counts as many tokens as were generated.
    assert count_tokens(r.choices[0].text) == 5


def test_completion_token_ids_and_default_max_tokens(client):
    r = client.completions.create(model="sim-alias", prompt=list(range(1000, 1123)))
    assert r.model == "sim-alias"
    assert r.usage.prompt_tokens == 123
    assert r.usage.completion_tokens == 16  # vLLM's completions default


def test_completion_stream_with_usage(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt=[1, 2, 3, 4], max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True,
                                                            "min_tokens": 6}))
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 6  # one token per SSE event
    assert "".join(c.choices[0].text for c in token_chunks) == " tok" * 6
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 5 + ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == 4
    assert chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1


def test_completion_stream_without_usage(client):
    chunks = list(client.completions.create(model=MODEL, prompt="a b", max_tokens=3,
                                            stream=True))
    assert len(chunks) == 3
    assert all(c.usage is None for c in chunks)


def test_chat(client):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello there, simulator!"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == " tok" * 4
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == count_chat_tokens(messages) == 3 + 5 + 2 * 4 + 3
    assert r.usage.completion_tokens == 4


def test_chat_max_completion_tokens_wins_and_default_is_capped(client):
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=9,
                                       max_completion_tokens=3)
    assert r.usage.completion_tokens == 3
    r = client.chat.completions.create(model=MODEL, messages=msgs)
    assert r.usage.completion_tokens == 8  # min(max_model_len - prompt, --default-max-tokens)


def test_chat_stream_with_usage(client):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "two words"}]}]
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    assert content == [" tok"] * 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.prompt_tokens == 2 + 4 + 3
    assert chunks[-1].usage.completion_tokens == 5


def test_errors_raise_the_sdks_exceptions(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert e.value.status_code == 404
    assert e.value.body["message"] == "The model `nope` does not exist."
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=MAX_MODEL_LEN)
    assert e.value.body["param"] == "max_tokens"
    assert e.value.body["type"] == "BadRequestError"
    # Still serving.
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=1).choices
