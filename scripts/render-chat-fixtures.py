#!/usr/bin/env python3
"""Renders the chat-template fixtures in tests/data/chat_templates/fixtures/.

Each fixture is one conversation rendered through one family's published chat template
(tests/data/chat_templates/templates/*.jinja, sources in SOURCES.md) the way Hugging Face
transformers renders it in `apply_chat_template`: its `_compile_jinja_template` builds an
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, jinja2.ext.loopcontrols])`, replaces the `tojson` filter with
`json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`,
adds the globals `raise_exception` (raises `TemplateError(message)`) and `strftime_now`, and
renders with `messages`, `tools`, `documents`, `add_generation_prompt` and the tokenizer's
special tokens. The same is done here without transformers (it needs torch) so that the
fixtures can be rendered offline from the template text alone.

A fixture records the output, or, where the template raised, the error message.
`tests/chat_templates.rs` checks throng's renderer against every fixture.

Usage: scripts/render-chat-fixtures.py   (needs `pip install jinja2`; writes the fixtures)
"""

import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_templates"


class AssistantTracker(jinja2.ext.Extension):
    """transformers' `{% generation %}` block; it only marks assistant text, so for
    rendering it passes its body through unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(
            self.call_method("_render", []), [], [], body
        ).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def compile_template(source):
    """transformers.utils.chat_template_utils._compile_jinja_template, line for line."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


# family -> (template file, bos_token, eos_token), as in each model's tokenizer_config.json
FAMILIES = {
    "qwen2": ("qwen2.jinja", None, "<|im_end|>"),
    "qwen2.5": ("qwen2.5.jinja", None, "<|im_end|>"),
    "mistral-v0.1": ("mistral-v0.1.jinja", "<s>", "</s>"),
    "mistral-v0.2": ("mistral-v0.2.jinja", "<s>", "</s>"),
    "mistral-v0.3": ("mistral-v0.3.jinja", "<s>", "</s>"),
    "mixtral-8x7b": ("mixtral-8x7b.jinja", "<s>", "</s>"),
    "llama-3.1": ("llama-3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": 'The city and state, e.g. "Zürich, ZH" or <city> & it\'s state',
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a trader in a small market. Be brief."}
USER = {"role": "user", "content": "What price do you offer for 3 apples?"}
ASSISTANT = {"role": "assistant", "content": "  I offer 12 coins.  "}
USER2 = {"role": "user", "content": "And for 5?"}
NON_ASCII = {
    "role": "user",
    "content": 'Grüße aus Zürich — 東京 🍎! Reply as JSON: {"offer": 12, "items": ["a", "b"], '
    '"note": "it\'s <fine> & \\"quoted\\""}\n\tTabbed line.',
}

# Every family gets these.
COMMON = {
    "system_user": dict(messages=[SYSTEM, USER], add_generation_prompt=True),
    "multi_turn": dict(messages=[USER, ASSISTANT, USER2], add_generation_prompt=True),
    "non_ascii_json": dict(messages=[NON_ASCII], add_generation_prompt=True),
    "no_generation_prompt": dict(messages=[USER, ASSISTANT], add_generation_prompt=False),
    # Mistral's templates raise here (roles must alternate); ChatML ones render it.
    "two_users_after_system": dict(
        messages=[SYSTEM, USER, USER2], add_generation_prompt=True
    ),
}

QWEN_TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "type": "function",
            "function": {
                "name": "get_current_weather",
                "arguments": {"location": "Zürich", "unit": "celsius"},
            },
        }
    ],
}

EXTRA = {
    "qwen2.5": {
        "tools": dict(messages=[USER], tools=[WEATHER_TOOL], add_generation_prompt=True),
        "tools_with_system": dict(
            messages=[SYSTEM, USER], tools=[WEATHER_TOOL], add_generation_prompt=True
        ),
        "tool_call_and_response": dict(
            messages=[
                SYSTEM,
                {"role": "user", "content": "What is the weather in Zürich?"},
                QWEN_TOOL_CALL,
                {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}'},
                {"role": "tool", "content": "humidity 40%"},
            ],
            tools=[WEATHER_TOOL],
            add_generation_prompt=True,
        ),
    },
    "mistral-v0.3": {
        "tools": dict(
            messages=[USER, ASSISTANT, {"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER_TOOL],
            add_generation_prompt=True,
        ),
        "tool_call_and_response": dict(
            messages=[
                {"role": "user", "content": "What is the weather in Zürich?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "abc123def",
                            "type": "function",
                            "function": {
                                "name": "get_current_weather",
                                "arguments": {"location": "Zürich", "unit": "celsius"},
                            },
                        }
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "abc123def",
                    "content": '{"temperature": 21}',
                },
                {"role": "assistant", "content": "It is 21 degrees."},
                {"role": "user", "content": "Thanks!"},
            ],
            tools=[WEATHER_TOOL],
            add_generation_prompt=True,
        ),
        "bad_tool_call_id": dict(
            messages=[
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "short",
                            "type": "function",
                            "function": {"name": "get_current_weather", "arguments": {}},
                        }
                    ],
                },
            ],
            add_generation_prompt=False,
        ),
    },
    "llama-3.1": {
        "tools": dict(
            messages=[SYSTEM, USER], tools=[WEATHER_TOOL], add_generation_prompt=True
        ),
        "tool_call_and_response": dict(
            messages=[
                {"role": "user", "content": "What is the weather in Zürich?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {
                                "name": "get_current_weather",
                                "arguments": {"location": "Zürich", "unit": "celsius"},
                            },
                        }
                    ],
                },
                {"role": "ipython", "content": {"temperature": 21, "sky": "clear"}},
            ],
            tools=[WEATHER_TOOL],
            add_generation_prompt=True,
        ),
    },
}


def render(source, bos, eos, case):
    template = compile_template(source)
    kwargs = dict(
        messages=case["messages"],
        tools=case.get("tools"),
        documents=None,
        add_generation_prompt=case["add_generation_prompt"],
    )
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    try:
        return {"output": template.render(**kwargs)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    out_dir = ROOT / "fixtures"
    out_dir.mkdir(exist_ok=True)
    for old in out_dir.glob("*.json"):
        old.unlink()
    count = 0
    for family, (file, bos, eos) in FAMILIES.items():
        source = (ROOT / "templates" / file).read_text(encoding="utf-8")
        cases = dict(COMMON)
        cases.update(EXTRA.get(family, {}))
        for name, case in cases.items():
            fixture = {
                "family": family,
                "case": name,
                "template": file,
                "bos_token": bos,
                "eos_token": eos,
                "add_generation_prompt": case["add_generation_prompt"],
                "messages": case["messages"],
                "tools": case.get("tools"),
            }
            fixture.update(render(source, bos, eos, case))
            path = out_dir / f"{family}__{name}.json"
            path.write_text(
                json.dumps(fixture, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
            )
            count += 1
    print(f"jinja2 {jinja2.__version__}: wrote {count} fixtures to {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
