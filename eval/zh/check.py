#!/usr/bin/env python3
"""Validate the Chinese memory set (memories.json, queries.json) in this directory.

Standard library only. Usage: python3 eval/zh/check.py [DIR]
Exits 1 and lists every problem when a rule is broken; prints counts per type.
"""
import json
import os
import re
import sys
from collections import Counter

KINDS = {"fact", "preference", "event"}
TYPES = ["single_char", "word", "subword", "paraphrase", "variant", "mixed", "question"]
MIN_MEMORIES = 220
MIN_QUERIES = 110
MIN_PER_TYPE = 15
MAX_RELEVANT = 3
MAX_SINGLE_CHAR_HITS = 5

# Traditional -> simplified pairs for the characters this set uses (written for this
# checker; it is not a general conversion table). Each pair is "TS".
PAIRS = """
貓猫 魚鱼 龍龙 烏乌 機机 體体 檢检 對对 過过 還还 幾几 號号 檔档 誰谁 碼码 護护
筆笔 電电 腦脑 雲云 裡里 裏里 麼么 時时 間间 問问 題题 買买 賣卖 圖图 書书 館馆
歡欢 灣湾 車车 輛辆 豐丰 會会 騎骑 腳脚 邊边 學学 習习 練练 兩两 們们 覺觉 颱台
風风 樓楼 開开 麵面 聽听 粵粤 語语 別别 張张 國国 榮荣 養养 隻只 團团 個个 換换
鏡镜 義义 區区 週周 兒儿 醫医 鍋锅 錢钱 雞鸡 飯饭 為为 這这 從从 愛爱 寫写 網网
線线 鐘钟 點点 課课 視视 頻频 說说 讀读 戲戏 藥药 齒齿 雙双 褲裤 襯衬 歲岁 媽妈
爺爷 親亲 門门 燈灯 鐵铁 銀银 險险 貸贷 紅红 錶表 輪轮 氣气 熱热 壞坏 業业 費费
寬宽 帶带 聯联 東东 聲声 樂乐 鋼钢 劇剧 場场 種种 麥麦 讓让 離离 難难 飛飞 鳥鸟
龜龟 嗎吗 歐欧 證证 遊游 後后 髮发 鬆松 盤盘 鍵键 螢萤 廳厅 鄰邻 闆板 蘋苹
""".split()
T2S = {p[0]: p[1] for p in PAIRS}
S2T = {}
for t, s in T2S.items():
    S2T.setdefault(s, set()).add(t)


def is_han(ch):
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF


def han_bigrams(text):
    """Bigrams of adjacent Han characters (runs are split by anything else)."""
    out = set()
    for run in re.findall(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+", text):
        out.update(run[i:i + 2] for i in range(len(run) - 1))
    return out


def latin_words(text):
    return {w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)}


def variants(ch):
    """The other-script forms of a character (both directions)."""
    out = set(S2T.get(ch, ()))
    if ch in T2S:
        out.add(T2S[ch])
    return out


def main():
    here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "memories.json"), encoding="utf-8") as f:
        memories = json.load(f)
    with open(os.path.join(here, "queries.json"), encoding="utf-8") as f:
        queries = json.load(f)
    errors = []

    # memories
    by_id = {}
    kinds = Counter()
    for i, m in enumerate(memories, 1):
        mid = m.get("id")
        if set(m) != {"id", "content", "kind"}:
            errors.append(f"memory {mid}: fields must be id, content, kind")
        if mid != f"zh-{i:03d}":
            errors.append(f"memory #{i}: id {mid!r}, expected zh-{i:03d}")
        if mid in by_id:
            errors.append(f"memory {mid}: duplicate id")
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            errors.append(f"memory {mid}: empty content")
        if m.get("kind") not in KINDS:
            errors.append(f"memory {mid}: kind {m.get('kind')!r} not in {sorted(KINDS)}")
        by_id[mid] = m.get("content", "")
        kinds[m.get("kind")] += 1
    contents = Counter(by_id.values())
    for c, n in contents.items():
        if n > 1:
            errors.append(f"memory content repeated {n} times: {c}")
    if len(memories) < MIN_MEMORIES:
        errors.append(f"{len(memories)} memories, need at least {MIN_MEMORIES}")
    n_trad = sum(1 for c in by_id.values() if any(ch in T2S for ch in c))
    n_latin = sum(1 for c in by_id.values() if re.search(r"[A-Za-z]", c))

    # queries
    per_type = Counter()
    seen = set()
    for i, q in enumerate(queries, 1):
        qid, text, typ, rel = q.get("id"), q.get("query"), q.get("type"), q.get("relevant")
        where = f"query {qid} ({text!r})"
        if set(q) != {"id", "query", "type", "relevant"}:
            errors.append(f"{where}: fields must be id, query, type, relevant")
        if qid != f"q-{i:03d}":
            errors.append(f"query #{i}: id {qid!r}, expected q-{i:03d}")
        if qid in seen:
            errors.append(f"{where}: duplicate id")
        seen.add(qid)
        if not isinstance(text, str) or not text.strip():
            errors.append(f"{where}: empty query")
            continue
        if typ not in TYPES:
            errors.append(f"{where}: type {typ!r} not in {TYPES}")
            continue
        per_type[typ] += 1
        if not isinstance(rel, list) or not 1 <= len(rel) <= MAX_RELEVANT or len(set(rel)) != len(rel):
            errors.append(f"{where}: relevant must list 1-{MAX_RELEVANT} distinct ids")
            continue
        missing = [r for r in rel if r not in by_id]
        if missing:
            errors.append(f"{where}: unknown memory ids {missing}")
            continue
        docs = [by_id[r] for r in rel]

        if typ in ("single_char", "word", "subword"):
            if typ == "single_char" and not (len(text) == 1 and is_han(text)):
                errors.append(f"{where}: a single_char query is one Han character")
            if typ in ("word", "subword") and not (len(text) >= 2 and all(is_han(c) for c in text)):
                errors.append(f"{where}: a {typ} query is two or more Han characters")
            hits = sorted(mid for mid, c in by_id.items() if text in c)
            if sorted(rel) != hits:
                errors.append(f"{where}: relevant {sorted(rel)} but the memories containing it are {hits}")
            if typ == "single_char":
                if len(hits) > MAX_SINGLE_CHAR_HITS:
                    errors.append(f"{where}: occurs in {len(hits)} memories (max {MAX_SINGLE_CHAR_HITS})")
                other = variants(text)
                alt = sorted(mid for mid, c in by_id.items() if any(v in c for v in other))
                if alt:
                    errors.append(f"{where}: its variant form {sorted(other)} occurs in {alt}; "
                                  "pick a character without script ambiguity")
            if typ == "subword":
                for r, c in zip(rel, docs):
                    ok = any((s > 0 and is_han(c[s - 1])) or (s + len(text) < len(c) and is_han(c[s + len(text)]))
                             for s in [m.start() for m in re.finditer(re.escape(text), c)])
                    if not ok:
                        errors.append(f"{where}: in {r} it is not part of a longer compound")
        elif typ == "paraphrase":
            qb, ql = han_bigrams(text), latin_words(text)
            for r, c in zip(rel, docs):
                shared = qb & han_bigrams(c)
                if shared:
                    errors.append(f"{where}: shares bigrams {sorted(shared)} with {r}")
                if ql & latin_words(c):
                    errors.append(f"{where}: shares Latin words {sorted(ql & latin_words(c))} with {r}")
        elif typ == "variant":
            for r, c in zip(rel, docs):
                crossing = [ch for ch in text if ch not in c and any(v in c for v in variants(ch))]
                if not crossing:
                    errors.append(f"{where}: uses no other-script form of a character of {r}")
        elif typ == "mixed":
            if not (re.search(r"[A-Za-z]", text) and any(is_han(c) for c in text)):
                errors.append(f"{where}: a mixed query has both Latin letters and Han characters")
        elif typ == "question":
            if not text.rstrip().endswith(("？", "?")):
                errors.append(f"{where}: a question ends with a question mark")

    if len(queries) < MIN_QUERIES:
        errors.append(f"{len(queries)} queries, need at least {MIN_QUERIES}")
    for t in TYPES:
        if per_type[t] < MIN_PER_TYPE:
            errors.append(f"type {t}: {per_type[t]} queries, need at least {MIN_PER_TYPE}")

    print(f"memories: {len(memories)} ({', '.join(f'{k} {kinds[k]}' for k in sorted(KINDS))}; "
          f"{n_trad} with traditional characters, {n_latin} with Latin letters)")
    print(f"queries: {len(queries)}")
    for t in TYPES:
        print(f"  {t:<12} {per_type[t]}")
    if errors:
        print(f"\n{len(errors)} problem(s):")
        for e in errors:
            print("  - " + e)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
