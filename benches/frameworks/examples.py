#!/usr/bin/env python3
"""A small example of each framework against a running `throng api`: each framework's own
OpenAI client, pointed at throng by its documented setting, making the kind of call its
simulations make. Prints one line per framework: `ok`, or the error it met.

  examples.py BASE_URL API_KEY MODEL
"""

import asyncio
import json
import os
import sys
import traceback

BASE, KEY, MODEL = sys.argv[1:4]

BID = {
    "type": "object",
    "properties": {
        "price": {"type": "number", "minimum": 0.5, "maximum": 2.75},
        "reason": {"type": "string", "maxLength": 60},
    },
    "required": ["price", "reason"],
    "additionalProperties": False,
}


def concordia():
    # Concordia's GptLanguageModel builds openai.OpenAI(api_key=...): the base URL comes from
    # the environment, as the openai client reads it.
    os.environ["OPENAI_BASE_URL"] = BASE
    from concordia.language_model import gpt_model

    model = gpt_model.GptLanguageModel(MODEL, api_key=KEY)
    text = model.sample_text("Alice walks into the market and", max_tokens=20)
    assert isinstance(text, str)
    index, choice, _ = model.sample_choice("Which will Alice buy?", ["apples", "pears"])
    assert choice in ("apples", "pears")
    return f"sample_text {text[:30]!r}, sample_choice {choice!r}"


def mesa_llm():
    # mesa-llm's ModuleLLM calls LiteLLM with `openai/<model>` and api_base; the key is
    # OPENAI_API_KEY.
    os.environ["OPENAI_API_KEY"] = KEY
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from mesa_llm.module_llm import ModuleLLM

    llm = ModuleLLM(llm_model=f"openai/{MODEL}", api_base=BASE, system_prompt="You trade power.")
    response = llm.generate(
        "Place your bid.",
        response_format={"type": "json_schema", "json_schema": {"name": "bid", "schema": BID}},
    )
    value = json.loads(response.choices[0].message.content)
    assert 0.5 <= value["price"] <= 2.75
    tools = [{"type": "function", "function": {
        "name": "move", "description": "Move on the grid",
        "parameters": {"type": "object", "properties": {"direction": {"enum": ["north", "south"]}},
                       "required": ["direction"], "additionalProperties": False}}}]
    response = llm.generate("Where do you go?", tool_schema=tools, tool_choice="required")
    call = response.choices[0].message.tool_calls[0]
    assert call.function.name == "move"
    return f"json_schema {value}, tool call {call.function.arguments}"


def agentscope():
    # AgentScope's OpenAIChatModel takes the base URL in its credential; structured output is
    # a forced tool call, validated against the Pydantic model.
    from pydantic import BaseModel, Field

    from agentscope.credential import OpenAICredential
    from agentscope.message import UserMsg
    from agentscope.model import OpenAIChatModel

    class Bid(BaseModel):
        price: float = Field(ge=0.5, le=2.75)
        reason: str = Field(max_length=60)

    model = OpenAIChatModel(
        credential=OpenAICredential(api_key=KEY, base_url=BASE), model=MODEL, stream=False
    )
    result = asyncio.run(
        model.generate_structured_output([UserMsg(name="user", content="Place your bid.")], Bid)
    )
    return f"structured output {result}"[:120]


def main():
    for name, run in [("concordia", concordia), ("mesa-llm", mesa_llm), ("agentscope", agentscope)]:
        try:
            print(f"{name}: ok: {run()}", flush=True)
        except Exception as e:  # noqa: BLE001 - each framework's failure is reported, not raised
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            print(f"{name}: FAILED: {detail[:400]}", flush=True)


if __name__ == "__main__":
    main()
