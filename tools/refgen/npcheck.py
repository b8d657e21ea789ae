#!/usr/bin/env python3
"""npcheck: an independent float64 numpy forward pass for every fixture in testdata/models.

It re-implements each architecture from the formulas in the architecture notes (not from
transformers), reads the fixture files as they are on disk (config.json in whichever spelling,
model.safetensors in whichever layout) and compares with reference.safetensors:

  - `logits` and `hidden` of the prompt of the first case;
  - for every case, `greedy_logits` against an uncached forward over prompt + greedy_ids[:-1].

It needs only numpy (no torch, no transformers), so it also documents the fixtures in ~200 lines.

    python3 tools/refgen/npcheck.py testdata/models/*/
"""

import json
import math
import os
import struct
import sys

import numpy as np

TOL = 1e-4


def load_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    data = buf[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[start:end]
        if info["dtype"] == "F32":
            a = np.frombuffer(raw, "<f4").astype(np.float64)
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif info["dtype"] == "I32":
            a = np.frombuffer(raw, "<i4").astype(np.int64)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"])
    return out


def silu(x):
    return x / (1 + np.exp(-x))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def rmsnorm(x, w, eps, one_plus=False):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * (1 + w) if one_plus else y * w


def rope_params(cfg):
    """Returns (rope dict with rope_type/rope_theta/..., partial_rotary_factor) from either spelling."""
    rp = cfg.get("rope_parameters")
    if rp is None:
        rp = dict(cfg.get("rope_scaling") or {})
        rp["rope_theta"] = cfg["rope_theta"]
    rtype = rp.get("rope_type", rp.get("type", "default"))
    prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return dict(rp, rope_type=rtype), prf


def rope_tables(cfg, hd, T):
    rp, prf = rope_params(cfg)
    d = int(hd * prf)
    theta = rp["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    scale = 1.0
    if rp["rope_type"] == "linear":
        inv = inv / rp["factor"]
    elif rp["rope_type"] == "llama3":
        f, lo, hi, omp = (rp[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings"))
        new = []
        for i in inv:
            wavelen = 2 * math.pi / i
            if wavelen < omp / hi:
                new.append(i)
            elif wavelen > omp / lo:
                new.append(i / f)
            else:
                s = (omp / wavelen - lo) / (hi - lo)
                new.append((1 - s) * i / f + s * i)
        inv = np.array(new)
    elif rp["rope_type"] == "yarn":
        f, omp = rp["factor"], rp["original_max_position_embeddings"]
        fast, slow = rp.get("beta_fast", 32), rp.get("beta_slow", 1)

        def corr_dim(r):
            return d * math.log(omp / (r * 2 * math.pi)) / (2 * math.log(theta))

        low, high = max(math.floor(corr_dim(fast)), 0), min(math.ceil(corr_dim(slow)), d - 1)
        if low == high:
            high += 0.001
        extra = 1 - np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
        inv = (inv / f) * (1 - extra) + inv * extra
        scale = rp.get("attention_factor") or 0.1 * math.log(f) + 1
    elif rp["rope_type"] != "default":
        raise ValueError(f"rope type {rp['rope_type']} not handled")
    ang = np.arange(T)[:, None] * inv[None]
    emb = np.concatenate([ang, ang], -1)
    return np.cos(emb) * scale, np.sin(emb) * scale, d


def apply_rope(x, cos, sin, d):
    """NeoX-style rotation of the first d dims of x [T, heads, hd]; the rest passes through."""
    xr, xp = x[..., :d], x[..., d:]
    x1, x2 = xr[..., : d // 2], xr[..., d // 2:]
    rot = np.concatenate([-x2, x1], -1)
    return np.concatenate([xr * cos[:, None] + rot * sin[:, None], xp], -1)


def causal_attention(q, k, v, hd):
    T, nh = q.shape[0], q.shape[1]
    k = np.repeat(k, nh // k.shape[1], 1)  # GQA: kv head of q head j is j // (nh/nkv)
    v = np.repeat(v, nh // v.shape[1], 1)
    s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)[None]
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", s, v).reshape(T, -1)


def swiglu(h, gate, up, down):
    return (silu(h @ gate.T) * (h @ up.T)) @ down.T


def moe(W, p, cfg, h, renormalise, shared):
    logits = h @ W[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)  # softmax over all experts, then top-k
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        idx = np.argsort(-probs[t], kind="stable")[: cfg["num_experts_per_tok"]]
        w = probs[t, idx] / probs[t, idx].sum() if renormalise else probs[t, idx]
        for e, we in zip(idx, w):
            if p + "mlp.experts.gate_up_proj" in W:  # fused [E, 2I, H] (gate rows first), [E, H, I]
                gu = W[p + "mlp.experts.gate_up_proj"][e]
                i = gu.shape[0] // 2
                g, u, dn = gu[:i], gu[i:], W[p + "mlp.experts.down_proj"][e]
            else:
                g, u, dn = (W[f"{p}mlp.experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down"))
            out[t] += we * swiglu(h[t:t + 1], g, u, dn)[0]
    if shared:
        s = swiglu(h, W[p + "mlp.shared_expert.gate_proj.weight"], W[p + "mlp.shared_expert.up_proj.weight"],
                   W[p + "mlp.shared_expert.down_proj.weight"])
        out += sigmoid(h @ W[p + "mlp.shared_expert_gate.weight"].T) * s
    return out


def gated_deltanet(W, p, cfg, h, split_proj):
    T = h.shape[0]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    r = nv // nk
    a_ = p + "linear_attn."
    if split_proj:  # qwen3_5: in_proj_qkv (q_all | k_all | v_all), in_proj_z, in_proj_b, in_proj_a
        mixed = h @ W[a_ + "in_proj_qkv.weight"].T
        z = (h @ W[a_ + "in_proj_z.weight"].T).reshape(T, nv, dv)
        b, a = h @ W[a_ + "in_proj_b.weight"].T, h @ W[a_ + "in_proj_a.weight"].T
    else:  # qwen3_next: outputs grouped by key head
        qkvz = (h @ W[a_ + "in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * r * dv)
        ba = (h @ W[a_ + "in_proj_ba.weight"].T).reshape(T, nk, 2 * r)
        q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + r * dv], -1)
        mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
        z = z.reshape(T, nv, dv)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
    cw = W[a_ + "conv1d.weight"][:, 0, :]  # [C, K], causal depthwise, zero history
    padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], 0)
    conv = silu(np.stack([(padded[t:t + K] * cw.T).sum(0) for t in range(T)]))
    q = np.repeat(conv[:, : nk * dk].reshape(T, nk, dk), r, 1)
    k = np.repeat(conv[:, nk * dk: 2 * nk * dk].reshape(T, nk, dk), r, 1)
    v = conv[:, 2 * nk * dk:].reshape(T, nv, dv)
    beta = sigmoid(b)
    g = -np.exp(W[a_ + "A_log"]) * np.log1p(np.exp(a + W[a_ + "dt_bias"]))
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((nv, dk, dv))
    o = np.zeros((T, nv, dv))
    for t in range(T):  # recurrent delta rule
        S = S * np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hij,hi->hj", S, k[t]))
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hij,hi->hj", S, q[t])
    o = rmsnorm(o, W[a_ + "norm.weight"], cfg["rms_norm_eps"]) * silu(z)  # gated norm: norm, then gate
    return o.reshape(T, nv * dv) @ W[a_ + "out_proj.weight"].T


def forward(top, W, ids):
    cfg = top.get("text_config", top)
    mt = cfg["model_type"]
    hybrid = mt in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
    pre = "model.language_model." if "text_config" in top else "model."
    T, H = len(ids), cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    cos, sin, d = rope_tables(cfg, hd, T)
    n_layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [
        "full_attention" if not hybrid or (i + 1) % cfg.get("full_attention_interval", 4) == 0
        else "linear_attention" for i in range(n_layers)]
    x = W[pre + "embed_tokens.weight"][ids]
    hidden = [x]
    for li in range(n_layers):
        p = f"{pre}layers.{li}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps, hybrid)
        if types[li] == "linear_attention":
            x = x + gated_deltanet(W, p, cfg, h, mt != "qwen3_next")
        else:
            a = p + "self_attn."
            q = h @ W[a + "q_proj.weight"].T
            k = h @ W[a + "k_proj.weight"].T
            v = h @ W[a + "v_proj.weight"].T
            if a + "q_proj.bias" in W:
                q, k, v = q + W[a + "q_proj.bias"], k + W[a + "k_proj.bias"], v + W[a + "v_proj.bias"]
            gate = None
            if hybrid:  # per head [q_j ; gate_j]
                qg = q.reshape(T, nh, 2 * hd)
                q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
            if a + "q_norm.weight" in W:
                q = rmsnorm(q, W[a + "q_norm.weight"], eps, hybrid)
                k = rmsnorm(k, W[a + "k_norm.weight"], eps, hybrid)
            o = causal_attention(apply_rope(q, cos, sin, d), apply_rope(k, cos, sin, d), v, hd)
            if gate is not None:
                o = o * sigmoid(gate)
            x = x + o @ W[a + "o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps, hybrid)
        if p + "mlp.gate.weight" in W:
            renorm = cfg.get("norm_topk_prob", True) if mt != "qwen3_5_moe_text" else True
            x = x + moe(W, p, cfg, h, renorm, p + "mlp.shared_expert_gate.weight" in W)
        else:
            x = x + swiglu(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
        hidden.append(x)
    x = rmsnorm(x, W[pre + "norm.weight"], eps, hybrid)
    hidden.append(x)
    lm = W.get("lm_head.weight", W[pre + "embed_tokens.weight"])
    return x @ lm.T, np.stack(hidden)


def check(fixture_dir):
    top = json.load(open(os.path.join(fixture_dir, "config.json"), encoding="utf-8"))
    W = load_safetensors(os.path.join(fixture_dir, "model.safetensors"))
    R = load_safetensors(os.path.join(fixture_dir, "reference.safetensors"))
    ref = json.load(open(os.path.join(fixture_dir, "reference.json"), encoding="utf-8"))
    worst = 0.0
    parts = []
    for case in ref["cases"]:
        pre = case["tensor_prefix"]
        ids = list(R[pre + "prompt_ids"])
        greedy = list(R[pre + "greedy_ids"])
        logits, hidden = forward(top, W, ids + greedy[:-1])
        T = len(ids)
        d_logits = float(np.abs(logits[:T] - R[pre + "logits"]).max())
        d_greedy = float(np.abs(logits[T - 1:] - R[pre + "greedy_logits"]).max())
        parts.append(f"{case['name']}: logits {d_logits:.1e} greedy {d_greedy:.1e}")
        worst = max(worst, d_logits, d_greedy)
        if pre + "hidden" in R:
            d_hidden = float(np.abs(hidden[:, :T] - R[pre + "hidden"]).max())
            parts.append(f"hidden {d_hidden:.1e}")
            worst = max(worst, d_hidden)
    ok = worst <= TOL
    print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(os.path.normpath(fixture_dir))}: " + ", ".join(parts))
    return ok


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    results = [check(d) for d in argv if os.path.isfile(os.path.join(d, "reference.json"))]
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
