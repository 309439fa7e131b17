"""Schemathesis hooks for mnemo (loaded through SCHEMATHESIS_HOOKS by scripts/schemathesis): a
serializer for `application/x-ndjson` request bodies, the memory import, writing each
generated object as one JSON line."""

import json

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    items = value if isinstance(value, list) else [value]
    return "".join(json.dumps(item) + "\n" for item in items).encode("utf-8")
