"""throng.Engine: decisions as one batch, equal to the command line's, with the interpreter's
lock released, and errors as exceptions carrying throng's messages."""

import json
import re
import subprocess
import threading

import pytest

import throng

# A bounded schema: an integer in a range, a choice, a short string.
SCHEMA = {
    "type": "object",
    "properties": {
        "price": {"type": "integer", "minimum": 10, "maximum": 90},
        "action": {"enum": ["raise", "hold", "cut"]},
        "why": {"type": "string", "maxLength": 24},
    },
    "required": ["price", "action", "why"],
    "additionalProperties": False,
}

PROMPTS = [
    f"You sell electricity; last round's price was {p} and demand {d}. "
    "Set this round's price, as JSON."
    for p, d in [(20, "high"), (45, "low"), (70, "steady"), (33, "rising"), (58, "falling"), (81, "high")]
]


def valid(value):
    assert set(value) == {"price", "action", "why"}
    assert isinstance(value["price"], int) and 10 <= value["price"] <= 90
    assert value["action"] in ("raise", "hold", "cut")
    assert isinstance(value["why"], str) and len(value["why"]) <= 24


def requests(seeds):
    return [
        {
            "messages": [{"role": "user", "content": p}],
            "json_schema": SCHEMA,
            "temperature": 0.8,
            "seed": s,
            "max_tokens": 48,
        }
        for p, s in zip(PROMPTS, seeds)
    ]


def cli_lines(throng_bin, tmp_path, reqs):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    out = subprocess.run(
        [str(throng_bin), "generate", "--requests", str(path)],
        capture_output=True,
        text=True,
    )
    # A request that fails has an `error` line, and the command then exits 1.
    assert out.returncode == 0 or '"error"' in out.stdout, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def without_timings(line):
    # A warm prefix cache changes only how many prompt tokens were cached.
    return {k: v for k, v in line.items() if k not in ("timings", "cached_tokens")}


def test_every_decision_is_valid_and_equals_throng_generate(smollm2, throng_bin, tmp_path):
    seeds = [11, 12, 13, 14, 15, 16]
    results = smollm2.decide(
        [[{"role": "user", "content": p}] for p in PROMPTS],
        SCHEMA,
        temperature=0.8,
        seed=seeds,
        max_tokens=48,
    )
    assert len(results) == len(PROMPTS)
    lines = cli_lines(throng_bin, tmp_path, requests(seeds))
    for result, line in zip(results, lines):
        assert result["finish_reason"] == "stop"
        valid(result["value"])
        assert json.loads(result["text"]) == result["value"]
        assert len(result["tokens"]) == result["generated_tokens"]
        assert (result["value"], result["text"], result["generated_tokens"]) == (
            line["value"],
            line["text"],
            line["generated_tokens"],
        )


def test_a_string_prompt_is_one_user_message(smollm2):
    as_text = smollm2.decide(PROMPTS[:2], SCHEMA, seed=[1, 2], max_tokens=48)
    as_messages = smollm2.decide(
        [[{"role": "user", "content": p}] for p in PROMPTS[:2]], SCHEMA, seed=[1, 2], max_tokens=48
    )
    assert [r["text"] for r in as_text] == [r["text"] for r in as_messages]


def test_generate_returns_the_lines_of_throng_generate(smollm2, throng_bin, tmp_path):
    reqs = requests([5, 6, 7, 8, 9, 10])
    reqs.append({"prompt": "no such field", "colour": "red", "tag": "bad"})
    ours = smollm2.generate(reqs)
    theirs = cli_lines(throng_bin, tmp_path, reqs)
    assert [without_timings(l) for l in ours[:-1]] == [without_timings(l) for l in theirs[:-1]]
    # The same error, named by its place in the list rather than by a file's line.
    assert ours[-1]["error"].startswith("request 6: ")
    assert theirs[-1]["error"].endswith(ours[-1]["error"].removeprefix("request 6: "))
    assert "unknown field `colour`" in ours[-1]["error"] and ours[-1]["tag"] == "bad"


def test_stream_yields_every_result_once_with_decides_values(smollm2):
    seeds = [21, 22, 23, 24, 25, 26]
    batch = smollm2.decide(PROMPTS, SCHEMA, temperature=0.8, seed=seeds, max_tokens=48)
    streamed = list(smollm2.stream(PROMPTS, SCHEMA, temperature=0.8, seed=seeds, max_tokens=48))
    assert sorted(r["index"] for r in streamed) == list(range(len(PROMPTS)))
    for r in streamed:
        assert r["text"] == batch[r["index"]]["text"]


def test_a_stream_left_unread_does_not_hold_the_engine(smollm2):
    stream = smollm2.stream(PROMPTS, SCHEMA, max_tokens=48)
    first = next(stream)
    assert "index" in first
    del stream
    # The engine is free again: the abandoned requests were dropped.
    assert len(smollm2.decide(PROMPTS[:1], SCHEMA, max_tokens=48)) == 1


def test_another_thread_runs_while_decide_works(smollm2):
    done = threading.Event()
    count = [0]

    def spin():
        while not done.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        before = count[0]
        smollm2.decide(PROMPTS * 4, SCHEMA, temperature=0.8, max_tokens=48)
        during = count[0] - before
    finally:
        done.set()
        spinner.join()
    # Holding the lock for the whole call would leave the spinner at (almost) zero.
    assert during > 100_000, during


def test_a_schema_the_decoder_cannot_compile_raises_schema_error(smollm2):
    with pytest.raises(throng.SchemaError) as e:
        smollm2.decide(["hi"], {"type": "object", "properties": {"x": {"type": "no-such-type"}}})
    assert "prompt 0" in str(e.value) and "JSON schema cannot be used" in str(e.value)


def test_a_prompt_longer_than_the_context_raises_prompt_too_long(smollm2):
    long = "word " * (smollm2.max_context + 10)
    with pytest.raises(throng.PromptTooLongError) as e:
        smollm2.decide(["short", long], SCHEMA)
    assert "prompt 1" in str(e.value) and "shorten it" in str(e.value)
    assert isinstance(e.value, throng.RequestError) and isinstance(e.value, throng.ThrongError)


def test_a_failed_prompt_keeps_the_other_prompts_results(smollm2):
    long = "word " * (smollm2.max_context + 10)
    with pytest.raises(throng.PromptTooLongError) as e:
        smollm2.decide([PROMPTS[0], long, PROMPTS[1], long], SCHEMA, seed=[1, 2, 3, 4], max_tokens=48)
    assert e.value.index == 1
    assert "prompts 3 failed too" not in str(e.value) and "prompt 3 failed too" in str(e.value)
    results = e.value.results
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert "error" in results[1] and "error" in results[3] and "shorten it" in results[3]["error"]
    # The others were decided, as a call without the long prompts decides them.
    alone = smollm2.decide(PROMPTS[:2], SCHEMA, seed=[1, 3], max_tokens=48)
    for got, want in zip([results[0], results[2]], alone):
        valid(got["value"])
        assert got["text"] == want["text"]


def test_a_reply_cut_off_by_max_tokens_raises_naming_the_prompt(smollm2):
    with pytest.raises(throng.CutOffError) as e:
        smollm2.decide(PROMPTS[:2], SCHEMA, max_tokens=4)
    assert isinstance(e.value, throng.RequestError)
    message = str(e.value)
    assert message.startswith("prompt 0: ") and "max_tokens=4" in message
    assert 'on_length="none"' in message and "prompt 1 failed too" in message
    assert e.value.index == 0
    assert [r["finish_reason"] for r in e.value.results] == ["length", "length"]
    # Asked for, cut-off replies come back as they are, unmissably marked.
    kept = smollm2.decide(PROMPTS[:2], SCHEMA, max_tokens=4, on_length="none")
    assert [(r["finish_reason"], r["value"]) for r in kept] == [("length", None)] * 2
    assert all(r["generated_tokens"] == 4 for r in kept)
    with pytest.raises(throng.ArgumentError, match="on_length='ignore': give one of 'raise', 'none'"):
        smollm2.decide(PROMPTS[:1], SCHEMA, on_length="ignore")


def test_an_unknown_model_raises_model_error():
    with pytest.raises(throng.ModelError) as e:
        throng.Engine("no-such-model-anywhere")
    assert "no-such-model-anywhere" in str(e.value)


def test_a_missing_model_file_raises_model_error(tmp_path):
    with pytest.raises(throng.ModelError) as e:
        throng.Engine(str(tmp_path / "missing.gguf"))
    assert "missing.gguf" in str(e.value)


@pytest.mark.parametrize(
    "given, named, takes",
    [
        ({"weights": "int3"}, "weights='int3'", "'int8'"),
        ({"kv_format": "f8"}, "kv_format='f8'", "'f16'"),
        ({"device": "gpu"}, "device='gpu'", "'cuda:N'"),
        ({"max_seqs": 0}, "max_seqs=0", "positive int"),
        ({"max_seqs": True}, "max_seqs=True", "positive int"),
        ({"kv_memory": "lots"}, "kv_memory='lots'", "2GiB"),
        ({"prefix_cache": "no"}, "prefix_cache='no'", "True or False"),
        ({"max_batch_tokens": 1.5}, "max_batch_tokens=1.5", "positive int"),
    ],
)
def test_a_bad_engine_argument_is_an_argument_error_naming_it(given, named, takes):
    with pytest.raises(throng.ArgumentError) as e:
        throng.Engine(**given)
    message = str(e.value)
    assert message.startswith(named) and takes in message, message
    # A ThrongError, and what Python code catches for a bad argument; not the command line's
    # words.
    assert isinstance(e.value, (throng.ThrongError, ValueError, TypeError))
    assert "--" not in message and "help" not in message


@pytest.mark.parametrize(
    "given, named",
    [
        ({"max_tokens": -5}, "max_tokens=-5: give a positive int"),
        ({"max_tokens": 2.5}, "max_tokens=2.5: give a positive int"),
        ({"temperature": "hot"}, "temperature='hot': give a number from 0 up"),
        ({"temperature": -1}, "temperature=-1: give a number from 0 up"),
        ({"top_p": 0}, "top_p=0: give a number above 0, at most 1"),
        ({"top_k": 0}, "top_k=0: give a positive int"),
        ({"seed": -1}, "seed=-1: give a non-negative int"),
        ({"seed": [1, "2"]}, "seed[1]='2': give a non-negative int"),
        ({"system": 3}, "system=3: give a string"),
    ],
)
def test_a_bad_decide_argument_is_an_argument_error_naming_it(smollm2, given, named):
    for call in (smollm2.decide, smollm2.stream):
        with pytest.raises(throng.ArgumentError) as e:
            call(PROMPTS[:2], SCHEMA, **given)
        assert str(e.value).startswith(named), str(e.value)
    generate_only = {k: v for k, v in given.items() if k not in ("system",)}
    if generate_only and not isinstance(given.get("seed"), list):
        with pytest.raises(throng.ArgumentError, match=re.escape(named.split(":")[0])):
            smollm2.generate(requests([1, 2]), **generate_only)


def test_prompts_must_be_a_list(smollm2):
    with pytest.raises(TypeError, match="wrap a single prompt in a list"):
        smollm2.decide("one prompt", SCHEMA)
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        smollm2.decide(["a", "b", "c"], SCHEMA, seed=[1, 2])
