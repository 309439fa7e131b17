"""Drives mnemo's OpenAI-compatible endpoint with the official `openai` package.

Reads MNEMO_BASE (the server's base URL) and MNEMO_KEY (an API key) from the environment and
prints one JSON object describing what the client saw; tests/api/clients.rs checks it.
MNEMO_STEPS (comma-separated; default: all) picks the steps: whole, stream, tool, models,
refused.
"""

import json
import os
import sys

import openai

base = os.environ["MNEMO_BASE"] + "/v1"
key = os.environ["MNEMO_KEY"]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
steps = os.environ.get("MNEMO_STEPS", "whole,stream,tool,models,refused").split(",")
seen = {}

# A whole completion, with the thread header read from the raw response.
question = {"role": "user", "content": "What am I allergic to?"}
whole_answer = ""
if "whole" in steps:
    raw = client.chat.completions.with_raw_response.create(model="mnemo", messages=[question])
    completion = raw.parse()
    seen["whole"] = {
        "content": completion.choices[0].message.content,
        "finish_reason": completion.choices[0].finish_reason,
        "object": completion.object,
        "model": completion.model,
        "usage": completion.usage.model_dump() if completion.usage else None,
        "thread": raw.headers.get("x-mnemo-thread"),
    }
    whole_answer = completion.choices[0].message.content

# The same conversation followed up, streamed, with usage in the last chunk.
follow_up = [
    question,
    {"role": "assistant", "content": whole_answer or "I do not know yet."},
    {"role": "user", "content": "And what should I cook tonight?"},
]
if "stream" in steps:
    with client.chat.completions.with_streaming_response.create(
        model="mnemo", messages=follow_up, stream=True, stream_options={"include_usage": True}
    ) as response:
        thread = response.headers.get("x-mnemo-thread")
        deltas, finish, usage = [], None, None
        for chunk in response.parse():
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                if choice.delta.content:
                    deltas.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
    seen["stream"] = {
        "content": "".join(deltas),
        "chunks": len(deltas),
        "finish_reason": finish,
        "usage": usage,
        "thread": thread,
    }

# The client's own tool: the model's call comes back unchanged.
if "tool" in steps:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    asked = [{"role": "user", "content": "What is the weather in Lisbon?"}]
    tooled = client.chat.completions.create(model="mnemo", messages=asked, tools=[weather])
    call = tooled.choices[0].message.tool_calls[0]
    seen["tool"] = {
        "finish_reason": tooled.choices[0].finish_reason,
        "name": call.function.name,
        "arguments": json.loads(call.function.arguments),
        "id": call.id,
    }
    # Its result sent back: the turn goes on to an answer.
    answered = client.chat.completions.create(
        model="mnemo",
        messages=asked
        + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 degrees"},
        ],
        tools=[weather],
    )
    seen["tool"]["answer"] = answered.choices[0].message.content

# Models in OpenAI's list shape.
if "models" in steps:
    seen["models"] = [model.id for model in client.models.list()]



def refusal(make):
    try:
        make()
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        return {"status": error.status_code, "class": type(error).__name__, "body": body}
    return None


if "refused" in steps:
    bad = openai.OpenAI(base_url=base, api_key="mnemo_not-a-real-key", max_retries=0)
    seen["bad_key"] = refusal(
        lambda: bad.chat.completions.create(model="mnemo", messages=[question])
    )
    seen["unknown_model"] = refusal(
        lambda: client.chat.completions.create(model="gpt-nonexistent", messages=[question])
    )
json.dump(seen, sys.stdout)
