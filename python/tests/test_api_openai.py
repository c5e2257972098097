"""`throng api` through the official `openai` client and LiteLLM (which mesa-llm uses): what a
framework that speaks OpenAI's API meets when its base_url points at throng, on SmolLM2."""

import json
import os
import subprocess
import threading
import time

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from conftest import require  # noqa: E402

KEY = "test-key"
MODEL = "smollm2-135m-instruct"

BID = {
    "type": "object",
    "properties": {
        "price": {"type": "number", "minimum": 0.5, "maximum": 2.75},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 40},
        "side": {"enum": ["buy", "sell"]},
        "reason": {"type": "string", "maxLength": 60},
    },
    "required": ["price", "quantity", "side", "reason"],
    "additionalProperties": False,
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "create_post",
            "description": "Post a message on the timeline",
            "parameters": {
                "type": "object",
                "properties": {"content": {"type": "string", "maxLength": 80}},
                "required": ["content"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "follow",
            "description": "Follow a user",
            "parameters": {
                "type": "object",
                "properties": {"user_id": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["user_id"],
                "additionalProperties": False,
            },
        },
    },
]


def start(throng_bin, *extra):
    """`throng api` on a free port; its base_url, read from what it prints."""
    proc = subprocess.Popen(
        [str(throng_bin), "api", "--addr", "127.0.0.1:0", "--api-key", KEY, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = None
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("base_url="):
            base = line.removeprefix("base_url=")
            break
    if base is None:
        err = proc.stderr.read()
        proc.wait()
        if "smollm2" in err.lower() and "download" in err.lower():
            require("SmolLM2-135M-Instruct", err)
        raise AssertionError(f"throng api did not start: {err}")
    # Keep reading its output so that a full pipe never blocks it.
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, base


@pytest.fixture(scope="module")
def api(throng_bin):
    proc, base = start(throng_bin)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api, api_key=KEY, max_retries=0, timeout=600)


def ask(text):
    return [
        {"role": "system", "content": "You are a trader in an energy market."},
        {"role": "user", "content": text},
    ]


def test_a_chat_completion_has_text_and_usage(client):
    r = client.chat.completions.create(model=MODEL, messages=ask("Say hello."), max_tokens=20, seed=1)
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_every_json_schema_reply_satisfies_its_schema_float_bounds_included(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("Place your bid for the next hour."),
        response_format={"type": "json_schema", "json_schema": {"name": "bid", "schema": BID, "strict": True}},
        n=8,
        temperature=1.0,
        seed=3,
        max_tokens=120,
    )
    assert len(r.choices) == 8
    valid = 0
    for c in r.choices:
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), BID)
            valid += 1
    assert valid >= 6, [c.message.content for c in r.choices]


def test_json_object_gives_an_object(client):
    r = client.chat.completions.create(
        model=MODEL, messages=ask("Describe your plan as JSON."),
        response_format={"type": "json_object"}, max_tokens=80, seed=2,
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_tools_are_answered_as_tool_calls_valid_against_their_parameters(client):
    for choice in ("required", {"type": "function", "function": {"name": "follow"}}, "auto"):
        r = client.chat.completions.create(
            model=MODEL, messages=ask("Act on the social network."), tools=TOOLS,
            tool_choice=choice, max_tokens=80, seed=4,
        )
        c = r.choices[0]
        if choice == "auto" and c.message.tool_calls is None:
            assert isinstance(c.message.content, str)
            continue
        assert c.finish_reason == "tool_calls", c
        call = c.message.tool_calls[0]
        tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
        if isinstance(choice, dict):
            assert call.function.name == "follow"
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    # The call and its result go back in the history.
    messages = ask("Act on the social network.") + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "done"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=60, seed=5)
    assert r.choices[0].message.tool_calls or r.choices[0].message.content is not None


def test_a_stream_joins_to_the_whole_reply_and_ends_with_usage(client):
    kwargs = dict(model=MODEL, messages=ask("Count to five."), max_tokens=30, seed=6, temperature=0.7)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_a_keyword_that_cannot_be_enforced_is_refused_by_name(client):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=ask("Tags?"),
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
        )
    assert "uniqueItems" in str(e.value) and "/properties/tags" in str(e.value)


def test_errors_arrive_as_the_clients_exceptions(api, client):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=api, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=ask("hi"))
    assert MODEL in str(e.value)
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_a_full_queue_answers_429_with_retry_after(throng_bin):
    import httpx

    proc, base = start(throng_bin, "--queue", "1")
    try:
        c = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=600)

        def admitted():
            stats = httpx.get(f"{base}/throng/stats", headers={"Authorization": f"Bearer {KEY}"})
            return stats.json()["admitted"]

        for _attempt in range(5):
            busy = threading.Thread(
                target=lambda: c.chat.completions.create(
                    model=MODEL, messages=ask("Tell a long story."), max_tokens=300, seed=11
                )
            )
            busy.start()
            while admitted() < 1 and busy.is_alive():
                time.sleep(0.01)
            try:
                c.chat.completions.create(model=MODEL, messages=ask("hi"), max_tokens=2)
            except openai.RateLimitError as e:
                assert 1 <= int(e.response.headers["retry-after"]) <= 60
                busy.join()
                return
            busy.join()
        pytest.fail("a request beyond the queue was never refused")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_client_that_disconnects_frees_its_sequence(api, client):
    import httpx

    stream = client.chat.completions.create(
        model=MODEL, messages=ask("Tell a very long story."), max_tokens=500, stream=True
    )
    next(iter(stream))
    stream.close()
    deadline = time.time() + 120
    while True:
        stats = httpx.get(f"{api}/throng/stats", headers={"Authorization": f"Bearer {KEY}"}).json()
        status = stats["engines"][0]["status"]
        if stats["admitted"] == 0 and status["running"] == 0:
            assert status["cancelled"] >= 1
            break
        assert time.time() < deadline, stats
        time.sleep(0.1)


def test_litellm_as_mesa_llm_uses_it(api):
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    litellm = pytest.importorskip("litellm")
    r = litellm.completion(
        model=f"openai/{MODEL}", api_base=api, api_key=KEY, messages=ask("Place your bid."),
        response_format={"type": "json_schema", "json_schema": {"name": "bid", "schema": BID}},
        max_tokens=120, seed=8,
    )
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), BID)
    r = litellm.completion(
        model=f"openai/{MODEL}", api_base=api, api_key=KEY, messages=ask("Act."),
        tools=TOOLS, tool_choice="required", max_tokens=80, seed=9,
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name in ("create_post", "follow")
    chunks = list(litellm.completion(
        model=f"openai/{MODEL}", api_base=api, api_key=KEY, messages=ask("Count."),
        max_tokens=10, stream=True, seed=10,
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
