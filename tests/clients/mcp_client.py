"""Drives mnemo's MCP server with the official `mcp` package, over Streamable HTTP or, with
MNEMO_MCP_COMMAND set (a JSON list: the `mnemo mcp` command line), over stdio.

Reads MNEMO_BASE, MNEMO_KEY and MNEMO_STEPS (comma-separated: tools, remember, recall,
research, facts, forget, refused) from the environment and prints one JSON object of what it
saw. `facts` remembers each statement of the JSON list MNEMO_FACTS; `forget` asks to forget
MNEMO_FORGET.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

base = os.environ["MNEMO_BASE"]
key = os.environ["MNEMO_KEY"]
steps = os.environ.get("MNEMO_STEPS", "tools").split(",")
statuses = []  # every HTTP status the SDK's requests got


async def record(response):
    statuses.append(response.status_code)


def texts(result):
    return [block.text for block in result.content if getattr(block, "text", None) is not None]


def server():
    command = os.environ.get("MNEMO_MCP_COMMAND")
    if command:
        argv = json.loads(command)
        return StdioServerParameters(command=argv[0], args=argv[1:])
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
        event_hooks={"response": [record]},
    )
    return streamable_http_client(base + "/mcp", http_client=http)


async def main():
    seen = {}
    async with Client(server()) as client:
        if "tools" in steps:
            listed = await client.list_tools()
            seen["tools"] = {
                tool.name: {"description": tool.description, "schema": tool.input_schema}
                for tool in listed.tools
            }
        if "remember" in steps:
            result = await client.call_tool(
                "remember", {"content": "My favourite colour is teal", "kind": "preference"}
            )
            seen["remember"] = {"error": result.is_error, "texts": texts(result)}
        if "facts" in steps:
            seen["facts"] = []
            for fact in json.loads(os.environ["MNEMO_FACTS"]):
                result = await client.call_tool("remember", {"content": fact})
                seen["facts"].append({"error": result.is_error, "texts": texts(result)})
        if "forget" in steps:
            result = await client.call_tool("forget", {"query": os.environ["MNEMO_FORGET"]})
            seen["forget"] = {"error": result.is_error, "texts": texts(result)}
        if "recall" in steps:
            result = await client.call_tool("recall_memory", {"query": "favourite colour", "k": 5})
            seen["recall"] = {"error": result.is_error, "texts": texts(result)}
        if "research" in steps:
            progress = []

            async def on_progress(value, total, message):
                progress.append({"progress": value, "total": total, "message": message})

            result = await client.call_tool(
                "deep_research",
                {"query": "Where do the moth-whales of Vellacorn Bay migrate?", "search_api": "local"},
                progress_callback=on_progress,
            )
            seen["research"] = {"error": result.is_error, "texts": texts(result), "progress": progress}
            # A follow-up of that research, by its id.
            if not result.is_error and len(texts(result)) > 1:
                earlier = json.loads(texts(result)[1])["research_id"]
                follow = await client.call_tool(
                    "deep_research",
                    {"query": "Where do the moth-whales go in winter?", "search_api": "local", "follow_up_of": earlier},
                )
                seen["follow_up"] = {"error": follow.is_error, "texts": texts(follow), "of": earlier}
    json.dump(seen, sys.stdout)


try:
    asyncio.run(main())
except BaseException as error:  # the refusal of bad credentials is the expected outcome
    if "refused" not in steps:
        raise
    text = repr(error)
    while getattr(error, "exceptions", None):
        error = error.exceptions[0]
        text += " | " + repr(error)
    json.dump({"refused": text, "statuses": statuses}, sys.stdout)
