#!/usr/bin/env python3
"""Writes kiln's embedded default corpus, data/corpus/*.jsonl (one {"text": ...} document a line).

Two parts, both the project's own, so the quick start trains on real text with no download:
  kiln_sources.jsonl  a snapshot of kiln's own docs, sources, configs and scripts (one file = one document)
  stories.jsonl       short English passages from a seeded generator: errands, counting, arithmetic in words
Rerun after large doc/source changes; the output is deterministic for a given tree and seed.
Usage: scripts/make_corpus.py [--seed 0] [--stories 3000]
"""
import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_DIRS = ["README.md", "docs", "lib", "apps", "configs", "scripts", "tests", "third_party", "CMakeLists.txt"]
SNAPSHOT_SUFFIXES = {".md", ".h", ".cpp", ".cu", ".cuh", ".yaml", ".sh", ".py", ".cmake", ".txt", ".in"}

NAMES = ["Mara", "Tomas", "Ines", "Kofi", "Lena", "Ravi", "Noor", "Jonas", "Aiko", "Pablo", "Greta", "Yusuf"]
PLACES = ["the market", "the library", "the harbour", "the bakery", "the station", "the garden", "the workshop",
          "the school", "the river bank", "the old mill"]
THINGS = ["apples", "letters", "books", "candles", "stones", "shells", "pencils", "jars of honey", "loaves of bread",
          "maps", "keys", "cups"]
TIMES = ["In the morning", "Before noon", "After lunch", "In the evening", "On Sunday", "Late at night",
         "At dawn", "On a rainy Tuesday"]
WEATHER = ["The sky was clear.", "It had rained all night.", "A cold wind came from the sea.",
           "The air smelled of cut grass.", "Snow covered the roofs.", "The sun was warm on the stones."]
FEELINGS = ["pleased", "tired", "curious", "surprised", "calm", "impatient", "cheerful"]
ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    rest = n % 100
    return ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + words(rest))


def story(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    place, other = rng.sample(PLACES, 2)
    thing = rng.choice(THINGS)
    x, y = rng.randint(2, 40), rng.randint(1, 30)
    pron = rng.choice(["She", "He", "They"])
    parts = [
        f"{rng.choice(TIMES)}, {a} walked to {place}. {rng.choice(WEATHER)}",
        f"{pron} carried {words(x)} {thing} in a basket. At {place}, {b} gave {a} {y} more.",
        f"Now {a} had {x + y} {thing}, which is {words(x + y)} in words.",
    ]
    if rng.random() < 0.5 and x > y:
        parts.append(f"On the way to {other}, {a} gave {y} of them away, so {x} were left, because {x + y} - {y} = {x}.")
    else:
        parts.append(f"{a} counted them twice: {x} and {y} make {x + y}, and {x} times {y} is {x * y}.")
    parts.append(f"{b} felt {rng.choice(FEELINGS)}, and {a} went home to {other} before dark.")
    return " ".join(parts)


def facts(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(4, 9)):
        x, y = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice(["plus", "minus", "times"])
        if op == "minus" and y > x:
            x, y = y, x
        r = x + y if op == "plus" else x - y if op == "minus" else x * y
        lines.append(f"{words(x).capitalize()} {op} {words(y)} is {words(r) if r < 1000 else r}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stories", type=int, default=3000)
    args = ap.parse_args()
    out = ROOT / "data" / "corpus"
    out.mkdir(parents=True, exist_ok=True)

    files = []
    for entry in SNAPSHOT_DIRS:
        p = ROOT / entry
        files += [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file() and q.suffix in SNAPSHOT_SUFFIXES)
    with open(out / "kiln_sources.jsonl", "w", encoding="utf-8") as f:
        for p in files:
            text = p.read_text(encoding="utf-8", errors="replace")
            f.write(json.dumps({"text": text, "source": str(p.relative_to(ROOT))}, ensure_ascii=False) + "\n")

    rng = random.Random(args.seed)
    with open(out / "stories.jsonl", "w", encoding="utf-8") as f:
        for _ in range(args.stories):
            text = story(rng) if rng.random() < 0.75 else facts(rng)
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
