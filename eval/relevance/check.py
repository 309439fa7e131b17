#!/usr/bin/env python3
"""Validate the relevance sets (en.json and zh.json, whichever are present) in this directory.

Standard library only. Usage: python3 eval/relevance/check.py [DIR]
Prints counts per type, per user and language; exits 1 and lists every broken rule.
"""
import json
import os
import re
import sys
from collections import Counter

LANGUAGES = ["en", "zh"]
KINDS = {"fact", "preference", "event"}
TYPES = ["paraphrase", "category", "lexical", "near_miss", "foreign"]
USERS = 4
MEMORIES_PER_USER = 30
MIN_QUERIES_PER_USER = 24
MIN_QUERIES = 96  # per language
MIN_PER_USER = {"paraphrase": 9, "category": 3, "lexical": 3, "near_miss": 4, "foreign": 5}
RELEVANT = {  # (min, max) relevant ids per query type
    "paraphrase": (1, 2),
    "category": (2, 6),
    "lexical": (1, 3),
    "near_miss": (0, 0),
    "foreign": (0, 0),
}
MIN_FORGET = 6
MAX_TARGETS = 3
MIN_FORGET_EMPTY = 1
MIN_DUPLICATES = 6
MIN_DUPLICATES_EACH = 3  # at least this many same_as = id and same_as = null per user

USER_KEYS = {"id", "persona", "memories", "queries", "forget", "duplicates"}
MEMORY_KEYS = {"id", "content", "kind"}
QUERY_KEYS = {"id", "type", "query", "relevant"}
FORGET_KEYS = {"id", "request", "targets"}
DUPLICATE_KEYS = {"id", "content", "same_as"}

# ---------------------------------------------------------------------------------------------
# English: content-word stems

STOPWORDS = set("""
my the is do what i a an of in on to for and at with where who how when which does did am are
was have has me you your about any it that this be can
i'm im i've ive i'd i'll we we're we've we'll our ours us he she him her his hers they
them their its mine myself yourself or but not no nor so if as by from into onto than then
there here these those were been being will would could should shall might must had having
doing done why whom whose also too very just some much many more most each every after before
during until through over under up out off down again don't dont doesn't doesnt didn't didnt
isn't isnt aren't arent wasn't wasnt won't wont can't cant cannot haven't havent hasn't hasnt
you're you've they're there's let's behind
""".split())


def undouble(w):
    if len(w) >= 3 and w[-1] == w[-2] and w[-1] not in "aeioulsz":
        return w[:-1]
    return w


def stem(w):
    """A tiny suffix stripper: -ies, -ing, -ed, -es, -s (words longer than 4 letters; -s also
    for 4-letter words), then a final -e, so live/lives/lived/living all become "liv"."""
    if len(w) > 4:
        if w.endswith("ies"):
            w = w[:-3] + "y"
        elif w.endswith("ing"):
            w = undouble(w[:-3])
        elif w.endswith("ed"):
            w = undouble(w[:-2])
        elif w.endswith("es"):
            w = w[:-2]
        elif w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
    elif len(w) == 4 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    return w


def en_stems(text):
    """Stems of the content words: lowercase, split on anything but letters, digits and inner
    apostrophes, drop stopwords, strip 's, drop single letters, stem."""
    out = set()
    text = text.lower().replace("\u2019", "'")
    for tok in re.findall(r"[^\W_]+(?:'[^\W_]+)*", text):
        if tok in STOPWORDS:
            continue
        if tok.endswith("'s"):
            tok = tok[:-2]
        tok = tok.replace("'", "")
        if not tok or tok in STOPWORDS or (len(tok) == 1 and not tok.isdigit()):
            continue
        out.add(stem(tok))
    return out


def stems_meet(a, b):
    """Equal stems, or one a prefix of the other of at least 4 letters (month/monthly,
    play/player, intern/internship): stricter than equality alone."""
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    return len(short) >= 4 and long_.startswith(short)


def en_shared(query, memory):
    qs, ms = en_stems(query), en_stems(memory)
    return sorted({q for q in qs for m in ms if stems_meet(q, m)})


# ---------------------------------------------------------------------------------------------
# Chinese: Han bigrams and Latin words

def han_bigrams(text):
    """Bigrams of adjacent Han characters (runs are split by anything else)."""
    out = set()
    for run in re.findall(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+", text):
        out.update(run[i:i + 2] for i in range(len(run) - 1))
    return out


def latin_words(text):
    return {w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)}


def zh_shared(query, memory):
    return sorted((han_bigrams(query) & han_bigrams(memory)) | (latin_words(query) & latin_words(memory)))


SHARED = {"en": en_shared, "zh": zh_shared}


# ---------------------------------------------------------------------------------------------

def norm(text):
    return re.sub(r"\s+", " ", text.strip().lower()).rstrip(".!?。！？ ")


def is_text(v):
    return isinstance(v, str) and v.strip() != ""


def check_language(lang, data, errors):
    """Validate one file; return its per-user count rows."""
    err = lambda msg: errors.append(f"{lang}.json: {msg}")
    shared = SHARED[lang]
    rows = []
    if not isinstance(data, dict) or set(data) != {"language", "users"}:
        err("top level must be an object with exactly the fields language, users")
        return rows
    if data["language"] != lang:
        err(f"language is {data['language']!r}, expected {lang!r}")
    users = data["users"]
    if not isinstance(users, list):
        err("users must be a list")
        return rows
    if len(users) != USERS:
        err(f"{len(users)} users, expected {USERS}")

    all_ids = Counter()
    user_ids = set()
    for ui, u in enumerate(users, 1):
        if not isinstance(u, dict):
            err(f"user #{ui} is not an object")
            continue
        uid = u.get("id")
        if set(u) != USER_KEYS:
            err(f"user {uid!r}: fields must be {sorted(USER_KEYS)}")
        if not isinstance(uid, str) or not re.fullmatch(rf"{lang}-u\d+", uid):
            err(f"user #{ui}: id {uid!r} is not {lang}-u<N>")
            uid = f"{lang}-u?{ui}"
        if uid in user_ids:
            err(f"user {uid}: duplicate id")
        user_ids.add(uid)
        if not is_text(u.get("persona")):
            err(f"user {uid}: persona must be a non-empty string")

        def items(field, keys, letter):
            lst = u.get(field)
            if not isinstance(lst, list):
                err(f"user {uid}: {field} must be a list")
                return []
            good = []
            for n, it in enumerate(lst, 1):
                if not isinstance(it, dict):
                    err(f"user {uid}: {field} #{n} is not an object")
                    continue
                iid = it.get("id")
                if set(it) != keys:
                    err(f"{iid or uid + ' ' + field + ' #' + str(n)}: fields must be {sorted(keys)}")
                if not isinstance(iid, str) or not re.fullmatch(rf"{re.escape(uid)}-{letter}\d{{2,}}", iid):
                    err(f"user {uid}: {field} #{n} id {iid!r} is not {uid}-{letter}NN")
                    if not isinstance(iid, str):
                        iid = f"{uid}-{letter}?{n}"
                all_ids[iid] += 1
                it = dict(it, id=iid)
                good.append(it)
            return good

        memories = items("memories", MEMORY_KEYS, "m")
        queries = items("queries", QUERY_KEYS, "q")
        forgets = items("forget", FORGET_KEYS, "f")
        dups = items("duplicates", DUPLICATE_KEYS, "d")

        # memories
        mem = {}
        kinds = Counter()
        for m in memories:
            if not is_text(m.get("content")):
                err(f"{m['id']}: empty content")
            if m.get("kind") not in KINDS:
                err(f"{m['id']}: kind {m.get('kind')!r} not in {sorted(KINDS)}")
            kinds[m.get("kind")] += 1
            mem[m["id"]] = m.get("content") if isinstance(m.get("content"), str) else ""
        if len(memories) != MEMORIES_PER_USER:
            err(f"user {uid}: {len(memories)} memories, expected exactly {MEMORIES_PER_USER}")
        for c, n in Counter(norm(c) for c in mem.values()).items():
            if n > 1 and c:
                err(f"user {uid}: memory content repeated {n} times: {c!r}")
        normed = {norm(c): mid for mid, c in mem.items()}

        def ids_ok(where, lst, field, lo, hi):
            """A list of distinct memory ids of this user, lo..hi long."""
            if not isinstance(lst, list) or not all(isinstance(x, str) for x in lst):
                err(f"{where}: {field} must be a list of memory ids")
                return False
            ok = True
            if len(set(lst)) != len(lst):
                err(f"{where}: {field} repeats an id")
                ok = False
            if not lo <= len(lst) <= hi:
                err(f"{where}: {field} has {len(lst)} ids, must have {lo}-{hi}")
                ok = False
            unknown = [x for x in lst if x not in mem]
            if unknown:
                err(f"{where}: {field} {unknown} are not memories of {uid}")
                ok = False
            return ok

        # queries
        per_type = Counter()
        for c, n in Counter(norm(q.get("query") or "") for q in queries).items():
            if n > 1 and c:
                err(f"user {uid}: query text repeated {n} times: {c!r}")
        for q in queries:
            text, typ, rel = q.get("query"), q.get("type"), q.get("relevant")
            where = f"{q['id']} ({text!r})"
            if not is_text(text):
                err(f"{q['id']}: empty query")
                continue
            if typ not in TYPES:
                err(f"{where}: type {typ!r} not in {TYPES}")
                continue
            per_type[typ] += 1
            lo, hi = RELEVANT[typ]
            if not ids_ok(where, rel, "relevant", lo, hi):
                continue
            if typ == "paraphrase":
                for r in rel:
                    s = shared(text, mem[r])
                    if s:
                        err(f"{where}: paraphrase shares {s} with {r} ({mem[r]!r})")
            elif typ == "lexical":
                for r in rel:
                    if not shared(text, mem[r]):
                        err(f"{where}: lexical query shares no word with {r} ({mem[r]!r})")
        for t in TYPES:
            if per_type[t] < MIN_PER_USER[t]:
                err(f"user {uid}: {per_type[t]} {t} queries, need at least {MIN_PER_USER[t]}")
        if len(queries) < MIN_QUERIES_PER_USER:
            err(f"user {uid}: {len(queries)} queries, need at least {MIN_QUERIES_PER_USER}")

        # forget
        empty = 0
        for c, n in Counter(norm(f.get("request") or "") for f in forgets).items():
            if n > 1 and c:
                err(f"user {uid}: forget request repeated {n} times: {c!r}")
        for f in forgets:
            where = f"{f['id']} ({f.get('request')!r})"
            if not is_text(f.get("request")):
                err(f"{f['id']}: empty request")
            if ids_ok(where, f.get("targets"), "targets", 0, MAX_TARGETS) and not f["targets"]:
                empty += 1
        if len(forgets) < MIN_FORGET:
            err(f"user {uid}: {len(forgets)} forget requests, need at least {MIN_FORGET}")
        if empty < MIN_FORGET_EMPTY:
            err(f"user {uid}: {empty} forget requests with empty targets (a near miss), "
                f"need at least {MIN_FORGET_EMPTY}")

        # duplicates
        same = new = 0
        for d in dups:
            c, s = d.get("content"), d.get("same_as", "missing")
            where = f"{d['id']} ({c!r})"
            if not is_text(c):
                err(f"{d['id']}: empty content")
                continue
            if s is None:
                new += 1
                if norm(c) in normed:
                    err(f"{where}: same_as is null but the text is memory {normed[norm(c)]} verbatim")
            elif isinstance(s, str) and s in mem:
                same += 1
                if norm(c) == norm(mem[s]):
                    err(f"{where}: identical to {s}; a duplicate should restate it, not copy it")
            else:
                err(f"{where}: same_as {s!r} is neither null nor a memory of {uid}")
        if len(dups) < MIN_DUPLICATES:
            err(f"user {uid}: {len(dups)} duplicates, need at least {MIN_DUPLICATES}")
        if same < MIN_DUPLICATES_EACH or new < MIN_DUPLICATES_EACH or abs(same - new) > 1:
            err(f"user {uid}: duplicates {same} same_as an id and {new} null; about half each "
                f"(differ by at most 1, at least {MIN_DUPLICATES_EACH} each)")

        rows.append({
            "user": uid, "memories": len(memories),
            "kinds": "/".join(str(kinds[k]) for k in ("fact", "preference", "event")),
            **{t: per_type[t] for t in TYPES}, "queries": len(queries),
            "forget": f"{len(forgets)} ({empty} empty)", "duplicates": f"{len(dups)} ({same}/{new})",
        })

    for i, n in all_ids.items():
        if n > 1:
            err(f"id {i} used {n} times")
    total_q = sum(r["queries"] for r in rows)
    if total_q < MIN_QUERIES:
        err(f"{total_q} queries in all, need at least {MIN_QUERIES}")
    return rows


def print_table(lang, rows):
    cols = ["user", "memories", "kinds", *TYPES, "queries", "forget", "duplicates"]
    total = {"user": f"{lang} total"}
    for c in ("memories", *TYPES, "queries"):
        total[c] = sum(r[c] for r in rows)
    total["kinds"] = "/".join(str(sum(int(r["kinds"].split("/")[i]) for r in rows)) for i in range(3))
    nf = sum(int(r["forget"].split()[0]) for r in rows)
    ne = sum(int(r["forget"].split("(")[1].split()[0]) for r in rows)
    total["forget"] = f"{nf} ({ne} empty)"
    nd = sum(int(r["duplicates"].split()[0]) for r in rows)
    ns = sum(int(r["duplicates"].split("(")[1].split("/")[0]) for r in rows)
    total["duplicates"] = f"{nd} ({ns}/{nd - ns})"
    table = rows + [total]
    width = {c: max(len(c), *(len(str(r[c])) for r in table)) for c in cols}
    line = lambda r: "  ".join(str(r[c]).rjust(width[c]) if c != "user" else str(r[c]).ljust(width[c])
                               for c in cols)
    print(line({c: c for c in cols}))
    for r in rows:
        print(line(r))
    print(line(total))


def main():
    here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    errors = []
    found = 0
    for lang in LANGUAGES:
        path = os.path.join(here, f"{lang}.json")
        if not os.path.exists(path):
            continue
        found += 1
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            errors.append(f"{lang}.json: cannot read: {e}")
            continue
        rows = check_language(lang, data, errors)
        if rows:
            print_table(lang, rows)
            print()
    if not found:
        errors.append(f"no {' or '.join(l + '.json' for l in LANGUAGES)} in {here}")
    print("kinds = fact/preference/event; forget (n empty) = requests whose targets are [];"
          " duplicates (same/new) = same_as an id / null")
    if errors:
        print(f"\n{len(errors)} problem(s):")
        for e in errors:
            print("  - " + e)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
