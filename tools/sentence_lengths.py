"""Sentence lengths of a markdown page, in words: ``python tools/sentence_lengths.py docs/design.md [--top N]``.

Fenced blocks and headings are left out. A code span counts as one word, and a sentence end inside one is no end.
A paragraph, a list item and a table cell are each a unit; a unit splits into sentences at ``.``, ``!`` or ``?``
followed by a space or its end
(not after e.g., i.e., vs., Eq., Sec., Fig.). Prints lines, words, sentences, the median and the longest (with its start).
"""

import argparse
import re
import statistics
import sys
from pathlib import Path

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`[^`\n]*`")
END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?]\*\*)\s+")  # also after a bold lead-in's end


def units(text: str) -> list[str]:
    """Paragraphs, list items and table cells, each joined to one line, code spans replaced by a single word."""
    text = SPAN.sub("CODE", FENCE.sub("", text))
    out, cur = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|"):
            out.extend(c.strip() for c in s.strip("|").split("|") if c.strip() and set(c.strip()) - set("-: "))
            s = ""
        if not s or s.startswith("#") or re.match(r"^([-*]|\d+\.)\s", s):
            if cur:
                out.append(" ".join(cur))
            cur = []
            if s and not s.startswith("#"):
                cur = [re.sub(r"^([-*]|\d+\.)\s+", "", s)]
            continue
        cur.append(s)
    if cur:
        out.append(" ".join(cur))
    return out


ABBREV = re.compile(r"\b(e\.g|i\.e|vs|Eqs?|Sec|Fig)\.")  # a dot that ends no sentence


def sentences(text: str) -> list[str]:
    return [s for u in units(text) for s in END.split(ABBREV.sub(r"\1", u)) if s.split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--top", type=int, default=0, help="also print the N longest sentences")
    args = ap.parse_args()
    text = args.path.read_text()
    sents = sentences(text)
    lengths = sorted(len(s.split()) for s in sents)
    longest = max(sents, key=lambda s: len(s.split()))
    print(f"{args.path}: {len(text.splitlines())} lines, {len(text.split())} words, {len(sents)} sentences, "
          f"median {statistics.median(lengths):g} words, longest {lengths[-1]} ({longest[:60]!r}...), "
          f"over 45: {sum(n > 45 for n in lengths)}")
    for s in sorted(sents, key=lambda s: -len(s.split()))[: args.top]:
        print(f"{len(s.split()):4d}  {s[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
