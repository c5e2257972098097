#!/usr/bin/env python3
"""A small example of each framework against a running `throng api`: each framework's own
OpenAI client, pointed at throng by its documented setting, making the kind of call its
simulations make. Prints one line per framework: `ok`, or the error it met.

  examples.py BASE_URL API_KEY MODEL [FRAMEWORK...]

FRAMEWORK is concordia, mesa-llm, agentscope, oasis, langchain, instructor, pydantic-ai,
autogen or dspy (default: all); OASIS runs from a virtualenv of its own, and the last five from
another (see run.sh).
"""

import asyncio
import contextlib
import importlib.util
import json
import os
import sys
import traceback
import types
from pathlib import Path

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


def _bid_model():
    from pydantic import BaseModel, ConfigDict, Field

    class Bid(BaseModel):
        # extra="forbid" writes `additionalProperties: false`, so the reply holds these alone.
        model_config = ConfigDict(extra="forbid")
        price: float = Field(ge=0.5, le=2.75)
        reason: str = Field(max_length=60)

    return Bid


def langchain():
    # LangChain's ChatOpenAI takes base_url and api_key; structured output as a json_schema
    # response format, and a tool bound with tool_choice="required".
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    Bid = _bid_model()
    llm = ChatOpenAI(model=MODEL, base_url=BASE, api_key=KEY, temperature=0, max_tokens=80)
    bid = llm.with_structured_output(Bid, method="json_schema").invoke("Place your bid.")
    assert isinstance(bid, Bid), bid

    @tool
    def move(direction: str) -> str:
        """Move on the grid, north or south."""
        return direction

    message = llm.bind_tools([move], tool_choice="required").invoke("Where do you go?")
    call = message.tool_calls[0]
    assert call["name"] == "move" and isinstance(call["args"]["direction"], str), call
    return f"with_structured_output {bid!r}, bind_tools {call['name']} {call['args']}"


def instructor_():
    # instructor wraps the OpenAI client; in its TOOLS mode the model is a forced tool call,
    # and create_partial streams the object as the call's arguments arrive.
    import instructor
    from openai import OpenAI

    Bid = _bid_model()
    client = instructor.from_openai(OpenAI(base_url=BASE, api_key=KEY), mode=instructor.Mode.TOOLS)
    messages = [{"role": "user", "content": "Place your bid."}]
    bid = client.chat.completions.create(
        model=MODEL, response_model=Bid, messages=messages, max_tokens=80, max_retries=0
    )
    partials = list(client.chat.completions.create_partial(
        model=MODEL, response_model=Bid, messages=messages, max_tokens=80, max_retries=0
    ))
    assert len(partials) > 1 and partials[-1].price == bid.price, (partials, bid)
    return f"create {bid!r}, create_partial: {len(partials)} partial objects"


def pydantic_ai():
    # pydantic-ai's OpenAI model with a provider holding base_url and api_key; the output type
    # is its final_result tool, which it forces, and a tool of its own is called first.
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider

    try:
        from pydantic_ai.models.openai import OpenAIChatModel as Model
    except ImportError:  # before pydantic-ai 1.0
        from pydantic_ai.models.openai import OpenAIModel as Model

    Bid = _bid_model()
    model = Model(MODEL, provider=OpenAIProvider(base_url=BASE, api_key=KEY))
    agent = Agent(model, output_type=Bid, model_settings={"max_tokens": 80, "temperature": 0})
    result = agent.run_sync("Place your bid.")
    assert isinstance(result.output, Bid), result.output
    return f"run_sync output {result.output!r}"


def autogen():
    # AutoGen's OpenAIChatCompletionClient takes base_url and, for a model it does not know,
    # model_info; structured output through its json_output with a Pydantic model, and an
    # AssistantAgent with a tool.
    from autogen_core.models import UserMessage
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    Bid = _bid_model()
    client = OpenAIChatCompletionClient(
        model=MODEL, base_url=BASE, api_key=KEY,
        model_info={"vision": False, "function_calling": True, "json_output": True,
                    "family": "unknown", "structured_output": True},
    )

    async def calls():
        result = await client.create(
            [UserMessage(content="Place your bid.", source="user")], json_output=Bid,
            extra_create_args={"max_tokens": 80},
        )
        return Bid.model_validate_json(result.content)

    bid = asyncio.run(calls())
    return f"create with json_output {bid!r}"


def dspy_():
    # DSPy with an `openai/` model sends no response format (it knows nothing of the model), so
    # a small model's typed fields fail to parse. Declared as a provider whose models support a
    # response schema, its JSONAdapter sends each signature's outputs as a json_schema response
    # format, which throng holds every reply to. lm15's `vllm` preset is the OpenAI-compatible
    # local server's dialect (its table's address is only a default: `api_base` wins).
    import dspy
    from dspy.lm15 import AccessPolicy, ModelSupport, ProviderDefinition, register_provider

    register_provider(
        ProviderDefinition.chat(
            AccessPolicy(provider="throng", env_keys=("THRONG_API_KEY",),
                         base_url="http://localhost:8000/v1"),
            compat="vllm",
        ),
        supports=ModelSupport(response_schema=True, function_calling=True),
        replace=True,
    )
    lm = dspy.LM(f"throng/{MODEL}", api_base=BASE, api_key=KEY, temperature=0, max_tokens=120,
                 cache=False)
    dspy.configure(lm=lm, adapter=dspy.JSONAdapter())

    class Bid(dspy.Signature):
        """Place a bid for power."""

        market: str = dspy.InputField()
        price: float = dspy.OutputField(desc="between 0.5 and 2.75")
        reason: str = dspy.OutputField()

    prediction = dspy.Predict(Bid)(market="demand is high")
    assert isinstance(prediction.price, float), prediction
    sent = lm.history[-1]["kwargs"].get("response_format")
    assert sent is not None and sent != {"type": "json_object"}, sent
    return f"Predict price={prediction.price} reason={prediction.reason[:30]!r}, schema sent"


def _without_torch():
    # `import oasis` imports its recommender module (oasis/social_platform/recsys.py), which
    # imports torch, sentence-transformers, scikit-learn and transformers at import time for
    # the embedding recommenders (twhin-bert, twitter). Each one not installed is replaced by a
    # module whose attributes raise when used, except the three that module's import itself
    # runs (torch.cuda.is_available, torch.device, torch.no_grad, TfidfVectorizer()). The
    # reddit and random recommenders are plain Python and run as OASIS wrote them.
    def stand_in(name, **attrs):
        module = types.ModuleType(name)

        def absent(attr):
            def fail(*args, **kwargs):
                raise ImportError(f"{name}.{attr}: not installed (an OASIS embedding recommender)")
            return fail

        module.__getattr__ = absent
        module.__dict__.update(attrs)
        sys.modules[name] = module

    if importlib.util.find_spec("torch") is None:
        stand_in("torch", cuda=types.SimpleNamespace(is_available=lambda: False),
                 device=lambda name: name, no_grad=lambda: (lambda function: function))
    for name in ("sentence_transformers", "transformers"):
        if importlib.util.find_spec(name) is None:
            stand_in(name)
    if importlib.util.find_spec("sklearn") is None:
        for name in ("sklearn", "sklearn.feature_extraction", "sklearn.metrics",
                     "sklearn.metrics.pairwise"):
            stand_in(name)
        stand_in("sklearn.feature_extraction.text", TfidfVectorizer=lambda: None)


def oasis():
    # OASIS's own SocialAgent (a camel ChatAgent whose social actions are tools) on OASIS's own
    # Platform (sqlite, reddit recommender): oasis.make, env.reset, one env.step with an
    # LLMAction, the step's tool call executed by camel against the platform. The model is
    # camel's OpenAI-compatible backend with `url=` and `api_key=`.
    _without_torch()
    work = Path(__file__).resolve().parents[2] / "target" / "frameworks" / "oasis"
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # OASIS writes ./log/ at import time and its database where it is told
    (work / "oasis.db").unlink(missing_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # OASIS prints to stdout
        import logging

        import oasis
        from camel.models import ModelFactory
        from camel.types import ModelPlatformType
        from camel.utils import BaseTokenCounter

        class Utf8Counter(BaseTokenCounter):
            # camel's default counter for an OpenAI-compatible model is tiktoken's o200k_base,
            # which tiktoken downloads on first use; this one counts UTF-8 bytes (at least the
            # tokens) and needs nothing.
            def count_tokens_from_messages(self, messages):
                return sum(len(str(m.get("content") or "").encode()) for m in messages)

            def encode(self, text):
                return list(text.encode())

            def decode(self, token_ids):
                return bytes(token_ids).decode(errors="replace")

        errors = []  # SocialAgent.perform_action_by_llm logs a failed step and returns

        class Errors(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.ERROR:
                    errors.append(record.getMessage())

        logging.getLogger("social.agent").addHandler(Errors())
        model = ModelFactory.create(
            model_platform=ModelPlatformType.OPENAI_COMPATIBLE_MODEL, model_type=MODEL,
            url=BASE, api_key=KEY, token_counter=Utf8Counter(),
            model_config_dict={"tool_choice": "required"},
        )
        graph = oasis.AgentGraph()
        agent = oasis.SocialAgent(
            agent_id=0, agent_graph=graph, model=model,
            user_info=oasis.UserInfo(user_name="alice", name="Alice", recsys_type="reddit",
                                     description="A gardener who posts about tomatoes."),
            available_actions=oasis.ActionType.get_default_reddit_actions(),
        )
        graph.add_agent(agent)

        async def step():
            env = oasis.make(agent_graph=graph, platform=oasis.DefaultPlatformType.REDDIT,
                             database_path="oasis.db")
            await env.reset()
            await env.step({agent: oasis.LLMAction()})
            await env.close()

        asyncio.run(step())
    assert not errors, errors[0]
    import sqlite3

    with contextlib.closing(sqlite3.connect(work / "oasis.db")) as db:
        actions = db.execute("SELECT action, info FROM trace WHERE action != 'sign_up'").fetchall()
    assert actions, "the step wrote no action to the platform's trace"
    call = next(m for m in agent.chat_history if m.get("tool_calls"))["tool_calls"][0]["function"]
    result = next(m for m in agent.chat_history if m["role"] == "tool")["content"]
    return f"env.step: tool call {call['name']} {call['arguments']} -> {result}, trace {actions}"


FRAMEWORKS = {"concordia": concordia, "mesa-llm": mesa_llm, "agentscope": agentscope,
              "oasis": oasis, "langchain": langchain, "instructor": instructor_,
              "pydantic-ai": pydantic_ai, "autogen": autogen, "dspy": dspy_}


def main():
    for name in sys.argv[4:] or FRAMEWORKS:
        run = FRAMEWORKS[name]
        try:
            print(f"{name}: ok: {run()}", flush=True)
        except Exception as e:  # noqa: BLE001 - each framework's failure is reported, not raised
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            print(f"{name}: FAILED: {detail[:400]}", flush=True)


if __name__ == "__main__":
    main()
