#!/usr/bin/env python3
"""f64ref: float64 truth for the MoE / hybrid fixtures.

transformers' own float32 run of the hybrid fixtures drifts ~1e-4..1e-3 of the logits' RMS from
float64 (the delta rule and the conv accumulate in float32), so it cannot resolve the 1e-4 bound
the engine is held to. This script runs npcheck.py's independent float64 numpy forward pass on
each fixture and writes, per fixture, testdata/f64/<fixture>.safetensors (float32 of the float64
values) and testdata/f64/<fixture>.json:

  prompt_ids [T] I32, logits [T, V]     every prompt position, one uncached forward
  hidden [L+2, T, H]                    chat case only: embeddings, after each layer, after the final norm
  greedy_ids [N] I32, greedy_logits [N, V]
                                        its OWN float64 greedy continuation (N = 16, argmax, ties to the
                                        lowest id, no eos stop): row i chose greedy_ids[i], row 0 = logits[T-1]
  nothink.*                             the same for the nothink case (no hidden)

The JSON holds per case the greedy margins (top-1 minus top-2 of each step), the ids, and the
drift of transformers' float32 reference (reference.safetensors) from float64: max |Δ| of the
prompt logits over the RMS of the float64 logits, and whether its greedy ids agree.

    python3 tools/refgen/f64ref.py                  # the four MoE/hybrid fixtures
    python3 tools/refgen/f64ref.py qwen3_f32 ...    # any fixture names

Needs only numpy (Debian: apt-get install python3-numpy; run with /usr/bin/python3).
"""

import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npcheck  # noqa: E402

VERSION = "cortiq-f64ref/1"
N = 16
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT = ["qwen3_moe_f32", "qwen3_next_f32", "qwen3_5_f32", "qwen3_5_moe_f32"]


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if a.dtype.kind == "i":
            raw, dt = a.astype("<i4").tobytes(), "I32"
        else:
            raw, dt = a.astype("<f4").tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def margin(row):
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def rms(a):
    return float(np.sqrt(np.mean(np.asarray(a, np.float64) ** 2)))


def run(name):
    d = os.path.join(ROOT, "testdata", "models", name)
    top = json.load(open(os.path.join(d, "config.json"), encoding="utf-8"))
    W = npcheck.load_safetensors(os.path.join(d, "model.safetensors"))
    R = npcheck.load_safetensors(os.path.join(d, "reference.safetensors"))
    ref = json.load(open(os.path.join(d, "reference.json"), encoding="utf-8"))
    out, cases = {}, []
    for case in ref["cases"]:
        pre = case["tensor_prefix"]
        ids = [int(i) for i in R[pre + "prompt_ids"]]
        T = len(ids)
        logits, hidden = npcheck.forward(top, W, ids)
        greedy, margins, rows = [], [], [logits[T - 1]]
        for i in range(N):
            row = rows[-1]
            greedy.append(int(np.argmax(row)))  # first maximum: ties to the lowest id
            margins.append(margin(row))
            if i + 1 < N:
                rows.append(npcheck.forward(top, W, ids + greedy)[0][-1])
        glog = np.stack(rows)
        # One uncached forward over prompt + greedy[:-1] gives the same rows.
        check = npcheck.forward(top, W, ids + greedy[:-1])[0][T - 1:]
        assert np.abs(check - glog).max() < 1e-9, "stepwise and one-shot float64 greedy logits differ"
        out[pre + "prompt_ids"] = np.array(ids, np.int32)
        out[pre + "logits"] = logits
        out[pre + "greedy_ids"] = np.array(greedy, np.int32)
        out[pre + "greedy_logits"] = glog
        if pre == "":
            out["hidden"] = hidden
        r = rms(logits)
        ref_greedy = [int(i) for i in R[pre + "greedy_ids"]]
        c = {
            "name": case["name"], "tensor_prefix": pre, "num_prompt_tokens": T,
            "greedy_ids": greedy, "greedy_margins": margins, "min_greedy_margin": min(margins),
            "logits_rms": r,
            "transformers_f32_drift": {
                "prompt_logits_max_abs": float(np.abs(R[pre + "logits"] - logits).max()),
                "prompt_logits_max_abs_over_rms": float(np.abs(R[pre + "logits"] - logits).max()) / r,
                "greedy_ids_equal": ref_greedy == greedy,
                "first_greedy_difference": next((i for i, (a, b) in enumerate(zip(ref_greedy, greedy)) if a != b), None),
            },
        }
        if ref_greedy == greedy:
            d_g = float(np.abs(R[pre + "greedy_logits"] - glog).max())
            c["transformers_f32_drift"]["greedy_logits_max_abs_over_rms"] = d_g / r
        cases.append(c)
    os.makedirs(os.path.join(ROOT, "testdata", "f64"), exist_ok=True)
    st = os.path.join(ROOT, "testdata", "f64", name + ".safetensors")
    write_safetensors(st, out)
    model_sha = hashlib.sha256(open(os.path.join(d, "model.safetensors"), "rb").read()).hexdigest()
    meta = {
        "format": VERSION, "fixture": name, "script": "tools/refgen/f64ref.py (npcheck.forward in float64)",
        "numpy": np.__version__, "model_safetensors_sha256": model_sha,
        "tensors": {k: list(v.shape) for k, v in out.items()}, "cases": cases,
    }
    with open(os.path.join(ROOT, "testdata", "f64", name + ".json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    for c in cases:
        dr = c["transformers_f32_drift"]
        print(f"{name} {c['name']}: transformers f32 vs f64 prompt logits {dr['prompt_logits_max_abs_over_rms']:.2e} "
              f"of RMS; greedy ids equal {dr['greedy_ids_equal']}; min f64 margin {c['min_greedy_margin']:.2e}")


def main(argv):
    for name in argv or DEFAULT:
        run(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
