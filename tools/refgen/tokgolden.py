#!/usr/bin/env python3
"""Authoritative golden ids for the Go tokenizer, from Hugging Face `tokenizers`.

Usage:
    python3 tools/refgen/tokgolden.py OUTDIR [TESTDATA_DIR] [--tokenizer FILE --name NAME]

Reads TESTDATA_DIR/golden_strings.json and the committed Qwen3 tokenizer
(TESTDATA_DIR/qwen3/tokenizer.json.gz, tokenizer_config.json); TESTDATA_DIR
defaults to tokenizer/testdata next to this script's repository root. Writes
OUTDIR/golden_qwen3_hf.json; copy it to tokenizer/testdata/ so that
`go test ./tokenizer` compares against it instead of the JavaScript reference.

With --tokenizer, another tokenizer.json (optionally .gz) is used instead
and the output is OUTDIR/golden_NAME_hf.json (for one-off checks of other
models whose files are not committed).

For every string it records:
  ids_addspecial encode(text, add_special_tokens=True), special tokens parsed
  ids            encode(text, add_special_tokens=False), special tokens parsed
  ids_nospecial  the same with encode_special_tokens=True (special tokens as text)
  decoded        decode(ids, skip_special_tokens=False)
  decoded_skip   decode(ids, skip_special_tokens=True)

Needs only the `tokenizers` package (and the standard library). If
`transformers` is importable too, its fast tokenizer is run on the same
strings as a cross-check and any disagreement is reported on stderr (and
counted in the output), but `tokenizers` stays the reference.
"""
import gzip
import json
import os
import sys


def main(argv):
    import argparse

    ap = argparse.ArgumentParser(description="golden token ids from HF tokenizers")
    ap.add_argument("outdir")
    ap.add_argument("testdata", nargs="?")
    ap.add_argument("--tokenizer", help="tokenizer.json or tokenizer.json.gz (default: the committed Qwen3 one)")
    ap.add_argument("--name", default="qwen3", help="name used in the output file name")
    args = ap.parse_args(argv[1:])
    outdir = args.outdir
    here = os.path.dirname(os.path.abspath(__file__))
    testdata = args.testdata or os.path.join(here, "..", "..", "tokenizer", "testdata")

    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError as e:
        sys.stderr.write("tokgolden.py: the `tokenizers` package is required: %s\n" % e)
        return 1

    with open(os.path.join(testdata, "golden_strings.json"), encoding="utf-8") as f:
        strings = json.load(f)
    tpath = args.tokenizer or os.path.join(testdata, "qwen3", "tokenizer.json.gz")
    opener = gzip.open if tpath.endswith(".gz") else open
    with opener(tpath, "rt", encoding="utf-8") as f:
        tokenizer_json = f.read()

    tok = Tokenizer.from_str(tokenizer_json)
    plain = Tokenizer.from_str(tokenizer_json)
    has_flag = hasattr(plain, "encode_special_tokens")
    if has_flag:
        plain.encode_special_tokens = True
    else:
        sys.stderr.write("tokgolden.py: tokenizers %s has no encode_special_tokens; ids_nospecial left null\n"
                         % tokenizers.__version__)

    cases = []
    for text in strings:
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {
            "text": text,
            "ids_addspecial": tok.encode(text, add_special_tokens=True).ids,
            "ids": ids,
            "ids_nospecial": plain.encode(text, add_special_tokens=False).ids if has_flag else None,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        }
        cases.append(case)

    out = {
        "source": "huggingface tokenizers %s" % tokenizers.__version__,
        "cases": cases,
    }

    # Optional cross-check with transformers (not the reference).
    try:
        import tempfile
        from transformers import PreTrainedTokenizerFast
    except Exception:  # not installed, or broken: skip quietly
        PreTrainedTokenizerFast = None
    if PreTrainedTokenizerFast is not None:
        try:
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "tokenizer.json")
                with open(p, "w", encoding="utf-8") as f:
                    f.write(tokenizer_json)
                tf = PreTrainedTokenizerFast(tokenizer_file=p)
                bad = 0
                for c in cases:
                    got = tf.encode(c["text"], add_special_tokens=False)
                    if got != c["ids"]:
                        bad += 1
                        sys.stderr.write("transformers disagrees on %r: %r vs %r\n" % (c["text"], got, c["ids"]))
                import transformers
                out["transformers_check"] = {"version": transformers.__version__, "mismatches": bad}
        except Exception as e:  # the cross-check must never break the reference
            sys.stderr.write("tokgolden.py: transformers cross-check failed: %s\n" % e)

    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "golden_%s_hf.json" % args.name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    sys.stderr.write("tokgolden.py: wrote %d cases to %s (%s)\n" % (len(cases), path, out["source"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
