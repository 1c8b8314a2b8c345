"""``specdec serve``'s HTTP API over loopback with a real client: OpenAI shapes, streaming, errors, metrics."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from specdec_cli.api import LLM, SamplingParams

CHAT = [{"role": "user", "content": "Name a colour."}]


def sse_payloads(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_models_and_health(client, served) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    (model,) = client.get("/v1/models").json()["data"]
    assert model["id"] == served[1].model_name and model["object"] == "model"


def test_greedy_completion_and_chat_equal_the_python_api(client, overrides) -> None:
    chat = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8, "temperature": 0}).json()
    completion = client.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 6,
                                                      "temperature": 0}).json()
    (chat_ref,) = LLM(overrides).chat(CHAT, SamplingParams(temperature=0, max_tokens=8))
    (raw_ref,) = LLM([*overrides, "model.chat_template=false"]).generate("The sky is",
                                                                        SamplingParams(temperature=0, max_tokens=6))
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"] == {
        "role": "assistant", "content": chat_ref.text}
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"] == raw_ref.text
    usage = chat["usage"]
    assert usage["prompt_tokens"] == len(chat_ref.prompt_token_ids) and usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    assert usage["acceptance_length"] == pytest.approx(chat_ref.metrics.acceptance_length)
    assert usage["draft_tokens_accepted"] == chat_ref.metrics.draft_tokens_accepted
    assert chat["choices"][0]["finish_reason"] == "length"


def test_streaming_chat_sends_the_same_text_and_ends_with_done(client) -> None:
    body = {"messages": CHAT, "max_tokens": 8, "temperature": 0.9, "seed": 3}
    whole = client.post("/v1/chat/completions", json=body).json()
    with client.stream("POST", "/v1/chat/completions",
                       json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]  # same seed, same tokens
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 8


def test_stop_strings_cut_the_text_streamed_or_not(client) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 11}
    full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = full[4:7]
    cut = client.post("/v1/completions", json={**body, "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == full[: full.find(stop)]
    with client.stream("POST", "/v1/completions", json={**body, "stop": stop, "stream": True}) as response:
        chunks = [json.loads(p) for p in sse_payloads(response)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == cut["text"]


def test_several_prompts_make_several_choices(client) -> None:
    reply = client.post("/v1/completions", json={"prompt": ["a b c", "1 2 3"], "max_tokens": 3}).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1] and reply["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize(("body", "message"), [
    ('{"prompt": "x",', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"max_tokens": 3}', "prompt: Field required"),
    ('{"prompt": "x", "top_p": 5}', "top_p=5.0 must be a number in (0, 1]"),
    ('{"prompt": "x", "max_tokens": 0}', "max_tokens=0 must be an integer >= 1"),
    ('{"prompt": "x", "seed": -1}', "seed=-1 must be an integer in [0, 2**63 - 1]"),
    ('{"prompt": "x", "n": 2}', "only n=1 is supported"),
    ('{"prompt": "", "max_tokens": 2}', "prompt[0] must be a non-empty string"),
    ('{"prompt": "x", "max_tokens": 100000}', "exceeds max_seq_len"),
    ('{"prompt": "x", "temperature": "hot"}', "temperature: Input should be a valid number"),
])
def test_bad_bodies_are_400_with_an_openai_error(client, body: str, message: str) -> None:
    response = client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"


def test_bad_chats_and_other_models_are_refused_and_the_server_stays_up(client) -> None:
    bad_role = client.post("/v1/chat/completions", json={"messages": [{"role": "bot", "content": "x"}]})
    last_assistant = client.post("/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "x"}]})
    other = client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": CHAT})
    assert bad_role.status_code == 400 and "messages.0.role" in bad_role.json()["error"]["message"]
    assert last_assistant.status_code == 400 and "last message must be from the user" in last_assistant.text
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert client.get("/health").status_code == 200


SAMPLE = re.compile(r'^(specdec_[a-z0-9_]+)(\{[a-z_]+="[^"]*"\})? (-?[0-9.e+-]+|\+Inf|NaN)$')


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value; every line must be a comment or a valid sample."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def test_metrics_are_prometheus_text_with_speculation_and_latency(client) -> None:
    client.post("/v1/completions", json={"prompt": "a a a a a a", "max_tokens": 6})
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = parse_metrics(response.text)
    assert samples["specdec_acceptance_length"] >= 1.0 and samples['specdec_verify_steps_total{accepted="0"}'] > 0
    assert all(0 <= v <= 1 for k, v in samples.items() if k.startswith("specdec_per_position_acceptance"))
    assert samples["specdec_queue_depth"] == 0 and "specdec_tokens_per_second" in samples
    for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        buckets = [v for k, v in samples.items() if k.startswith(f"specdec_{histogram}_bucket")]
        assert buckets == sorted(buckets) and buckets[-1] == samples[f"specdec_{histogram}_count"] > 0
    finished = sum(v for k, v in samples.items() if k.startswith("specdec_requests_total"))
    assert samples["specdec_time_to_first_token_seconds_count"] == finished
