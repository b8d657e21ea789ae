#!/usr/bin/env python3
"""Trains a small Llama on the Brown corpus and writes it, with reference
outputs, as a fixture whose predictions are confident: random-weight
fixtures have near-flat logits, so they cannot show what quantization costs;
a trained model can (top-1 agreement, KL, perplexity).

    python3 tools/refgen/trained.py --out /tmp/trained [--steps 1500] [--device cuda]

Writes OUT/brown_llama/ (config.json, model.safetensors in bf16, tokenizer files,
reference.json, reference.safetensors). Reference outputs are computed in
float32 with eager attention from the saved bf16 weights, as transformers
loads them:
  - logits [T, V] of every position of the first T=256 tokens of
    testdata/text/brown_eval.txt (tokens in reference.json "eval_ids");
  - a 16-token greedy continuation with the KV cache and its margins;
  - the perplexity of the first N*256 eval tokens the way llama.cpp (and
    `cortiq perplexity --ctx 256`) computes it: chunks of 256 tokens, the
    second half of each scored.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import refgen  # noqa: E402  (tokenizer builders shared with the random fixtures)

VOCAB_TARGET = 1024
SEQ = 256
CTX = 256
PPL_CHUNKS = 24
SEED = 20261129


def train_tokenizer(texts):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = refgen.byte_level_pretokenizer(refgen.QWEN_SPLIT_REGEX)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TARGET, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return refgen.build_tokenizer(vocab, merges, "qwen3")


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    with gzip.open(os.path.join(REPO, "testdata/text/brown_train.txt.gz"), "rt", encoding="utf-8") as f:
        train_text = f.read().splitlines()
    with open(os.path.join(REPO, "testdata/text/brown_eval.txt"), encoding="utf-8") as f:
        eval_text = f.read()

    out = os.path.join(args.out, "brown_llama")
    os.makedirs(out, exist_ok=True)
    tok = train_tokenizer(train_text)
    template, _ = refgen.qwen3_chat_template(REPO)
    refgen.save_tokenizer(tok, "qwen3", template, out)
    hf_tok = PreTrainedTokenizerFast.from_pretrained(out)
    vocab = (len(hf_tok) + 7) // 8 * 8

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=hf_tok.convert_tokens_to_ids("<|im_end|>"))
    dev = args.device if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM(cfg).to(dev)
    ids = []
    for enc in tok.encode_batch([line + "\n" for line in train_text]):
        ids.extend(enc.ids)
    data = torch.tensor(ids, dtype=torch.long, device=dev)
    print(f"train tokens {len(ids)}, vocab {vocab}, params {sum(p.numel() for p in model.parameters())}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps, pct_start=0.05)
    g = torch.Generator(device="cpu").manual_seed(SEED)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(ids) - SEQ - 1, (64,), generator=g).to(dev)
        idx = starts[:, None] + torch.arange(SEQ + 1, device=dev)[None, :]
        batch = data[idx]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            # transformers shifts labels itself: labels are the input ids.
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)

    # Save in bf16 (what a published checkpoint stores), reload in float32.
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg_d = cfg.to_dict()
    cfg_d["torch_dtype"] = "bfloat16"
    cfg_d.pop("_attn_implementation", None)
    cfg_d.pop("dtype", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(refgen.jsonable(cfg_d), f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [cfg.eos_token_id, hf_tok.convert_tokens_to_ids("<|endoftext|>")]}, f, indent=2)
    ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").to(dev).eval()

    ev = tok.encode(eval_text).ids
    T = SEQ
    x = torch.tensor([ev[:T]], device=dev)
    with torch.no_grad():
        logits = ref(input_ids=x).logits[0].float()
        # Greedy continuation with the cache.
        out_ids, margins, glogits = [], [], []
        o = ref(input_ids=x, use_cache=True)
        past, last = o.past_key_values, o.logits[0, -1].float()
        for _ in range(16):
            top2 = torch.topk(last, 2)
            nxt = int(top2.indices[0])
            out_ids.append(nxt)
            margins.append(float(top2.values[0] - top2.values[1]))
            glogits.append(last.cpu())
            o = ref(input_ids=torch.tensor([[nxt]], device=dev), past_key_values=past, use_cache=True)
            past, last = o.past_key_values, o.logits[0, -1].float()
        # llama.cpp-style perplexity: chunks of CTX, second halves scored.
        nll, n = 0.0, 0
        chunks = min(PPL_CHUNKS, len(ev) // CTX)
        for c in range(chunks):
            ch = torch.tensor([ev[c * CTX:(c + 1) * CTX]], device=dev)
            lp = torch.log_softmax(ref(input_ids=ch).logits[0].double(), dim=-1)
            for j in range(CTX // 2, CTX - 1):
                nll -= float(lp[j, ch[0, j + 1]])
                n += 1
    ppl = math.exp(nll / n)
    top = torch.softmax(logits.double(), -1).max(-1).values
    save_file({"logits": logits.cpu().contiguous(), "greedy_logits": torch.stack(glogits).contiguous(),
               "eval_ids": torch.tensor(ev[:T], dtype=torch.int32)}, os.path.join(out, "reference.safetensors"))
    refgen.write_json(os.path.join(out, "reference.json"), {
        "format": "cortiq-trained/1", "fixture": "brown_llama", "steps": args.steps, "seed": SEED,
        "final_train_loss": float(loss.item()), "versions": refgen.versions(),
        "eval_ids": ev[:T], "greedy_ids": out_ids, "greedy_margins": margins,
        "perplexity": {"ctx": CTX, "chunks": chunks, "tokens_scored": n, "ppl": ppl, "eval_tokens": len(ev)},
        "mean_top1_prob": float(top.mean()),
    })
    print(f"eval perplexity {ppl:.3f} over {n} tokens, mean top-1 prob {float(top.mean()):.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
