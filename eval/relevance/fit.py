#!/usr/bin/env python3
"""Fits mnemo's relevance model (src/memory/relevance) on the features `mnemo eval relevance
--features FILE` and `mnemo eval locomo --features FILE` write, for one or more embedders at
once (needs numpy: `python3 -m pip install numpy`).

    mnemo eval relevance --model-dir models/multilingual-e5-small-q4 \
        --model-dir models/all-MiniLM-L6-v2 --features /tmp/features.jsonl
    python3 eval/relevance/fit.py /tmp/features.jsonl            # prints the fit and the table
    python3 eval/relevance/fit.py /tmp/features.jsonl --write    # also writes coefficients.json
    python3 eval/relevance/fit.py /tmp/features.jsonl --holdout en-u4,zh-u4
                                        # fits without those users, reports them apart

The model: two pieces of evidence that a memory is about a query, each a logistic curve,
combined as a noisy OR,

    p = 1 - (1 - sigmoid(a + b * z)) * (1 - sigmoid(c + d * coverage))

where z is the cosine's z-score against the query's background and coverage the idf-weighted
share of the query's informative words the memory holds (recall, as the keyword index counts
it) or the share of the named words it holds (forget: every word of a short request is meant). Either can show relevance; a
paraphrase shares no word and a name shares no meaning. Fitted by maximum likelihood
(gradient descent) on the pairs of every decision ("recall": a query and each memory of its
user; "forget": what a forget request names and each memory), each decision on its own pairs:
one model per embedder, and one on every embedder's pairs pooled for embedders the fit has
not seen (the z-score is what
makes their cosines comparable).
"""

import json
import math
import sys

import numpy as np
from collections import defaultdict
from pathlib import Path

NAMES = (
    "meaning_intercept",
    "meaning_z",
    "meaning_turn",
    "meaning_han",
    "words_intercept",
    "words_coverage",
    "words_turn",
)
START = [-5.0, 0.8, 0.0, 0.0, -5.0, 8.0, 0.0]
STEPS = 20000
RATE = 0.2
OUT = Path(__file__).resolve().parents[2] / "src/memory/relevance/coefficients.json"


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, x))))


def probability(w, pair):
    turn = 1.0 if pair.get("turn") else 0.0
    han = 1.0 if pair.get("han") else 0.0
    meaning = sigmoid(w[0] + w[1] * pair["z"] + w[2] * turn + w[3] * han)
    words = sigmoid(w[4] + w[5] * pair["coverage"] + w[6] * turn)
    return 1.0 - (1.0 - meaning) * (1.0 - words)


def fit(pairs):
    """Gradient descent with momentum on the weighted log loss (each pair's "weight": the
    datasets weigh alike however many pairs each has). An indicator's term is fitted only
    when the pairs hold both of its values."""
    z = np.array([p["z"] for p in pairs])
    c = np.array([p["coverage"] for p in pairs])
    t = np.array([1.0 if p.get("turn") else 0.0 for p in pairs])
    h = np.array([1.0 if p.get("han") else 0.0 for p in pairs])
    y = np.array([1.0 if p["label"] else 0.0 for p in pairs])
    weight = np.array([p.get("weight", 1.0) for p in pairs])
    weight = weight / weight.sum()
    varies = lambda x: bool(x.any()) and not bool(x.all())
    w = np.array(START)
    velocity = np.zeros(len(START))
    expit = lambda x: 1.0 / (1.0 + np.exp(-np.clip(x, -40.0, 40.0)))
    for _ in range(STEPS):
        meaning = expit(w[0] + w[1] * z + w[2] * t + w[3] * h)
        words = expit(w[4] + w[5] * c + w[6] * t)
        p = np.clip(1.0 - (1.0 - meaning) * (1.0 - words), 1e-9, 1 - 1e-9)
        dp = weight * (-y / p + (1.0 - y) / (1.0 - p))
        d_meaning = dp * (1.0 - words) * meaning * (1.0 - meaning)
        d_words = dp * (1.0 - meaning) * words * (1.0 - words)
        gradient = np.array([
            d_meaning.sum(), (d_meaning * z).sum(), (d_meaning * t).sum(), (d_meaning * h).sum(),
            d_words.sum(), (d_words * c).sum(), (d_words * t).sum(),
        ])
        if not varies(t):
            gradient[2] = gradient[6] = 0.0
        if not varies(h):
            gradient[3] = 0.0
        velocity = 0.9 * velocity - RATE * gradient
        w = w + velocity
    return [float(v) for v in w]


def log_loss(w, pairs):
    total = 0.0
    for p in pairs:
        q = min(max(probability(w, p), 1e-12), 1 - 1e-12)
        total -= math.log(q) if p["label"] else math.log(1 - q)
    return total / max(len(pairs), 1)


def main():
    argv = sys.argv[1:]
    holdout = []
    if "--holdout" in argv:
        at = argv.index("--holdout")
        holdout = [u for u in argv[at + 1].split(",") if u]
        del argv[at : at + 2]
    args = [a for a in argv if not a.startswith("--")]
    write = "--write" in argv
    if not args:
        raise SystemExit(__doc__)
    pairs = []
    for path in args:
        with open(path, encoding="utf-8") as f:
            pairs.extend(json.loads(line) for line in f if line.strip())
    # A pair whose values differ is never a duplicate, whatever the model says: it is not
    # the model's to learn.
    pairs = [
        p for p in pairs
        if p["decision"] in ("recall", "forget")
        or (p["decision"] == "duplicate" and not p["values_differ"])
    ]
    for pair in pairs:
        if pair["decision"] == "forget":
            pair["coverage"] = pair["share"]
    # LoCoMo's labels are its evidence turns: a turn of the same conversation that is not
    # evidence may still be about the question, so only the evidence (about it) and the
    # results for another conversation's questions (about nothing) are kept.
    pairs = [
        p for p in pairs
        if p["language"] != "locomo" or p["type"] == "foreign" or p["label"]
    ]
    if not pairs:
        raise SystemExit("no recall or forget pairs in the features")
    # Each (decision, model, dataset) weighs alike: LoCoMo's tens of thousands of turns must
    # not drown the hand-written sets (and the reverse).
    counts = defaultdict(int)
    dataset = lambda p: "locomo" if p["language"] == "locomo" else "sets"
    for p in pairs:
        counts[(p["decision"], p["model"], dataset(p))] += 1
    for p in pairs:
        p["weight"] = 1000.0 / counts[(p["decision"], p["model"], dataset(p))]
    held = lambda p: any(p["query"].startswith((user + "-", user + "/")) for user in holdout)
    test = [p for p in pairs if held(p)]
    train = [p for p in pairs if not held(p)]
    models = sorted({p["model"] for p in train})
    decisions = ("recall", "forget", "duplicate")
    fitted = {}
    for model in ["default"] + models:
        for decision in decisions:
            group = [
                p for p in train
                if p["decision"] == decision and model in ("default", p["model"])
            ]
            fitted[(model, decision)] = fit(group)
            w = fitted[(model, decision)]
            print(f"{model} {decision}:", json.dumps(dict(zip(NAMES, (round(v, 4) for v in w)))))
    def weights(pair):
        return fitted.get((pair["model"], pair["decision"]), fitted[("default", pair["decision"])])
    loss = lambda group: sum(
        -math.log(min(max(probability(weights(p), p), 1e-12), 1 - 1e-12))
        if p["label"]
        else -math.log(1 - min(max(probability(weights(p), p), 1e-12), 1 - 1e-12))
        for p in group
    ) / max(len(group), 1)
    print(f"log loss {loss(train):.4f} over {len(train)} pairs")
    if test:
        print(f"held-out log loss {loss(test):.4f} over {len(test)} pairs ({', '.join(holdout)})")
    groups = defaultdict(list)
    for p in train:
        groups[(p["model"], p["language"], p["decision"])].append(p)
    for p in test:
        groups[(p["model"], p["language"], p["decision"] + " (held out)")].append(p)
    print("\n| model | lang | decision | pairs | positives | mean p (pos) | mean p (neg) | neg ≥ 0.5 | pos ≥ 0.5 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for key in sorted(groups):
        group = groups[key]
        pos = [probability(weights(p), p) for p in group if p["label"]]
        neg = [probability(weights(p), p) for p in group if not p["label"]]
        mean = lambda v: sum(v) / len(v) if v else float("nan")
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {len(group)} | {len(pos)} | {mean(pos):.3f} | "
            f"{mean(neg):.3f} | {sum(q >= 0.5 for q in neg)} | {sum(q >= 0.5 for q in pos)} |"
        )
    if write:
        rounded = lambda w: dict(zip(NAMES, (round(v, 4) for v in w)))
        OUT.write_text(
            json.dumps(
                {
                    "note": "fitted by eval/relevance/fit.py on the sets of eval/relevance",
                    "pairs": len(train),
                    "default": {d: rounded(fitted[("default", d)]) for d in decisions},
                    "models": {
                        model: {d: rounded(fitted[(model, d)]) for d in decisions}
                        for model in models
                    },
                },
                indent=2,
                ensure_ascii=False,
            )
            + "\n",
            encoding="utf-8",
        )
        print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
