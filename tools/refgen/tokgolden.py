#!/usr/bin/env python3
"""Authoritative golden ids for the Go tokenizer, from Hugging Face `tokenizers`.

Usage:
    python3 tools/refgen/tokgolden.py OUTDIR [TESTDATA_DIR]

Reads TESTDATA_DIR/golden_strings.json and the committed Qwen3 tokenizer
(TESTDATA_DIR/qwen3/tokenizer.json.gz, tokenizer_config.json); TESTDATA_DIR
defaults to tokenizer/testdata next to this script's repository root. Writes
OUTDIR/golden_qwen3_hf.json; copy it to tokenizer/testdata/ so that
`go test ./tokenizer` compares against it instead of the JavaScript reference.

For every string it records:
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
    if len(argv) < 2 or len(argv) > 3:
        sys.stderr.write(__doc__)
        return 2
    outdir = argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    testdata = argv[2] if len(argv) == 3 else os.path.join(here, "..", "..", "tokenizer", "testdata")

    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError as e:
        sys.stderr.write("tokgolden.py: the `tokenizers` package is required: %s\n" % e)
        return 1

    with open(os.path.join(testdata, "golden_strings.json"), encoding="utf-8") as f:
        strings = json.load(f)
    with gzip.open(os.path.join(testdata, "qwen3", "tokenizer.json.gz"), "rt", encoding="utf-8") as f:
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
    path = os.path.join(outdir, "golden_qwen3_hf.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    sys.stderr.write("tokgolden.py: wrote %d cases to %s (%s)\n" % (len(cases), path, out["source"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
