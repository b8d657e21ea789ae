#!/usr/bin/env python3
"""refgen: tiny random-weight Hugging Face fixtures + reference outputs for cortiq.

Builds, for every architecture cortiq supports, a tiny seeded random-weight model as a real
Hugging Face directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json), then computes reference outputs with transformers (float32, eager
attention, CPU by default) and writes them next to the model as reference.safetensors +
reference.json. The format is described in testdata/models/README.md; how to rerun this is in
tools/refgen/README.md.

Needs: python>=3.10, torch, transformers>=5, tokenizers, safetensors. No network is used.

    python3 tools/refgen/refgen.py --out /tmp/refgen/models --tarball /tmp/fixtures.tar.gz
"""

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import traceback
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FORMAT = "cortiq-refgen/1"
GREEDY_STEPS = 16
BASE_SEED = 20250101

# --------------------------------------------------------------------------------------------
# Tokenizer: a tiny byte-level BPE trained on the built-in corpus below.
# --------------------------------------------------------------------------------------------

# Qwen2/Qwen3 pre-tokenizer split pattern (tokenizer.json of the published Qwen3 models).
QWEN_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Llama 3 pre-tokenizer split pattern: the same except digits go in runs of up to three.
LLAMA3_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Base BPE vocabulary size (256 byte symbols + merges). Added tokens come on top.
BPE_VOCAB_TARGET = 491

# (content, special) in id order. Qwen3 marks the think/tool tags as non-special added tokens.
QWEN_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
LLAMA3_ADDED_TOKENS = [
    ("<|begin_of_text|>", True),
    ("<|end_of_text|>", True),
    ("<|start_header_id|>", True),
    ("<|end_header_id|>", True),
    ("<|eot_id|>", True),
]

# The published Qwen3 chat template (tokenizer_config.json of Qwen/Qwen3-0.6B, April 2025),
# verbatim. If tokenizer/testdata/qwen3/tokenizer_config.json exists in the checkout, the script
# compares it with this copy and uses the committed one (see qwen3_chat_template()).
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
QWEN3_CHAT_TEMPLATE_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"

# The published Meta-Llama-3-8B-Instruct chat template. The "\n\n" are real newlines (as in the
# JSON-decoded tokenizer_config.json).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Training corpus for the tiny BPE: plain English about computing plus some Go and Python, so
# that chat-template words, code punctuation, indentation and digits all get merges. Written for
# this file. Documents are separated by a line holding only "%%".
CORPUS = """\
You are a helpful assistant. You answer questions about programs, computers and the sea.
The user asks a question and the assistant writes an answer. A helpful assistant is short,
careful and kind. The system message tells the assistant what to do; the user message holds
the question. Write a short answer first, then explain it if the user wants more.
%%
system
You are a careful coding assistant.
user
What does the Go keyword defer do?
assistant
A deferred call runs when the surrounding function returns. Deferred calls run in last in,
first out order, so the call that was deferred last runs first. People use defer to close
files, unlock a mutex, or recover from a panic.
%%
system
You are a helpful assistant who writes poems.
user
Write a short poem about the Go gopher.
assistant
A small blue gopher writes Go all day; it checks each error and goes on its way.
%%
system
You are a careful assistant. Answer about Go code.
user
What does the keyword go do in Go?
assistant
The keyword go starts a goroutine: the call runs at the same time as the code after it.
%%
system
You are a helpful coding assistant.
user
What is a slice in Go? Write about it in short.
assistant
A slice is a view of an array: a pointer, a length and a capacity. Appending to a slice may
copy the data into a new, larger array.
%%
user
Write a short poem about the sea.
assistant
The sea is grey at the start of the day,
the waves come in and they go away.
The wind is cold, the water is deep,
and the boats at the harbour are still asleep.
%%
The model reads the prompt one token at a time. Each token is a small piece of text: a word,
part of a word, a space, a digit or a sign. The tokenizer splits the text into pieces and the
model turns every piece into a vector. Attention lets each position look at the positions
before it; the key and value vectors of old positions are kept in a cache so that the next
token costs less work. When the model has seen the whole prompt it picks the next token, adds
it to the text, and does it again until it writes the end token or reaches the limit.
%%
It's a test, isn't it? They're here, we've seen it, I'm sure you'll like it, he'd say.
Don't worry: we'll check the numbers 0 1 2 3 4 5 6 7 8 9, then 10, 42, 128, 2048 and 65536.
In 2025 the team wrote 3 tests a day for 14 days; that's 42 tests in all.
%%
package main

import (
	"fmt"
	"os"
)

// sum returns the sum of the values in xs.
func sum(xs []float32) float32 {
	var s float32
	for _, x := range xs {
		s += x
	}
	return s
}

func main() {
	xs := []float32{1, 2, 3, 4}
	if len(os.Args) > 1 {
		fmt.Println("args:", os.Args[1:])
	}
	fmt.Printf("sum = %v\\n", sum(xs))
}
%%
func (m *Model) Forward(tokens []int32, pos int) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("model: empty input")
	}
	x := m.embed(tokens)
	for i, layer := range m.layers {
		if err := layer.forward(x, pos); err != nil {
			return nil, fmt.Errorf("model: layer %d: %w", i, err)
		}
	}
	return m.head(x), nil
}
%%
def softmax(xs):
    m = max(xs)
    es = [math.exp(x - m) for x in xs]
    s = sum(es)
    return [e / s for e in es]


class Cache:
    def __init__(self, size):
        self.size = size
        self.keys = []
        self.values = []

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return len(self.keys)
%%
for i in range(10):
    if i % 2 == 0:
        print("even", i)
    else:
        print("odd", i)
%%
{"role": "user", "content": "What is the weather like today?"}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
<tool_call> and </tool_call> wrap a call; <tool_response> and </tool_response> wrap the answer.
%%
The café served crème brûlée and a naïve smörgåsbord — über good. Straße, déjà vu, piñata.
Ünïcödé text is stored as UTF-8 bytes; every byte has a symbol, so no text is ever unknown.
%%
Tests compare the logits of the engine with the logits of the reference. A small difference
is fine; a large one means a bug in the attention, the norm, the rotary embedding or the cache.
The greedy answer picks the token with the largest logit at every step.
%%
the and to of a in is it that for on with as was be at by this are or from
the the the and and and to to of of a a in in is is it it that that for for
"""


def corpus_documents():
    return [d.strip("\n") + "\n" for d in CORPUS.split("%%\n") if d.strip()]


def qwen3_chat_template(repo_root):
    """The Qwen3 chat template: the committed real tokenizer_config.json if present, else ours."""
    path = os.path.join(repo_root, "tokenizer", "testdata", "qwen3", "tokenizer_config.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                tpl = json.load(f).get("chat_template")
            if isinstance(tpl, str) and tpl:
                same = tpl == QWEN3_CHAT_TEMPLATE
                log(f"qwen3 template: using {path} (identical to embedded copy: {same})")
                return tpl, "tokenizer/testdata/qwen3/tokenizer_config.json"
        except (OSError, ValueError) as e:
            log(f"qwen3 template: cannot read {path}: {e}; using embedded copy")
    return QWEN3_CHAT_TEMPLATE, "embedded (published Qwen/Qwen3-0.6B template)"


def train_bpe():
    """Trains the shared byte-level BPE; returns (vocab dict, merges list of pairs)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = byte_level_pretokenizer(QWEN_SPLIT_REGEX)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_TARGET,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_documents(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise RuntimeError("bpe: trained vocabulary ids are not contiguous")
    return vocab, merges


def byte_level_pretokenizer(pattern):
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_tokenizer(vocab, merges, flavor):
    """Builds a tokenizers.Tokenizer of the given flavor ("qwen3" or "llama3")."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    llama = flavor == "llama3"
    bpe = models.BPE(vocab=dict(vocab), merges=list(merges), ignore_merges=llama)
    tok = Tokenizer(bpe)
    if not llama:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = byte_level_pretokenizer(LLAMA3_SPLIT_REGEX if llama else QWEN_SPLIT_REGEX)
    tok.decoder = decoders.ByteLevel()
    added = LLAMA3_ADDED_TOKENS if llama else QWEN_ADDED_TOKENS
    for content, special in added:
        at = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
    for i, (content, _) in enumerate(added):
        if tok.token_to_id(content) != len(vocab) + i:
            raise RuntimeError(f"tokenizer: added token {content!r} got id {tok.token_to_id(content)}")
    if llama:
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A",
                    pair=f"{bos} $A {bos} $B:1",
                    special_tokens=[(bos, tok.token_to_id(bos))],
                ),
            ]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


TOKENIZER_FLAVORS = {
    "qwen3": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", gen_eos=["<|im_end|>", "<|endoftext|>"],
                  cfg_bos="<|endoftext|>", cfg_eos="<|im_end|>"),
    "llama3": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, gen_eos=["<|end_of_text|>", "<|eot_id|>"],
                   cfg_bos="<|begin_of_text|>", cfg_eos=["<|end_of_text|>", "<|eot_id|>"]),
}

TOKENIZER_PROBES = [
    "Hello world",
    " leading space and  two  spaces   ",
    "numbers 1234567 and 3.14159",
    "naïve café — déjà vu 🙂",
    "tabs\tand\nnewlines\n\n\nend",
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "don't WE'LL they've I'M",
    "func main() {\n\tfmt.Println(\"hi\")\n}\n",
]


def save_tokenizer(tok, flavor, chat_template, out_dir):
    """Saves tokenizer.json + tokenizer_config.json through PreTrainedTokenizerFast."""
    from transformers import PreTrainedTokenizerFast

    fl = TOKENIZER_FLAVORS[flavor]
    pristine = tok.to_str(pretty=True)  # the wrapper below may touch the object; keep the original
    kwargs = dict(
        tokenizer_object=tok,
        eos_token=fl["eos"],
        clean_up_tokenization_spaces=False,
        model_max_length=32768 if flavor == "qwen3" else 131072,
    )
    if fl["bos"]:
        kwargs["bos_token"] = fl["bos"]
    if fl["pad"]:
        kwargs["pad_token"] = fl["pad"]
    hf = PreTrainedTokenizerFast(**kwargs)
    hf.chat_template = chat_template
    hf.save_pretrained(out_dir)
    # Keep the template inside tokenizer_config.json as the published checkpoints do, and name
    # the generic fast class so any transformers version reads tokenizer.json as it is.
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    jinja_path = os.path.join(out_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        os.remove(jinja_path)
    cfg["chat_template"] = chat_template
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["bos_token"] = fl["bos"]
    cfg["eos_token"] = fl["eos"]
    cfg["pad_token"] = fl["pad"]
    if flavor == "qwen3":
        cfg["add_bos_token"] = False
    cfg["added_tokens_decoder"] = {
        str(i): {"content": at.content, "lstrip": at.lstrip, "normalized": at.normalized, "rstrip": at.rstrip,
                 "single_word": at.single_word, "special": at.special}
        for i, at in sorted(tok.get_added_tokens_decoder().items())
    }
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    # tokenizer.json exactly as built with the tokenizers library.
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(pristine)
        f.write("\n")


def load_and_check_tokenizer(model_dir, raw, chat_template):
    """Loads the fixture's tokenizer with transformers and checks it against the raw one."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    checks = {}
    try:
        hf = AutoTokenizer.from_pretrained(model_dir)
        checks["hf_tokenizer_class"] = type(hf).__name__
    except Exception as e:  # noqa: BLE001 - record and fall back
        checks["auto_tokenizer_error"] = repr(e)
        hf = PreTrainedTokenizerFast.from_pretrained(model_dir)
        checks["hf_tokenizer_class"] = type(hf).__name__
    checks["chat_template_roundtrip"] = hf.chat_template == chat_template
    checks["len_hf"] = len(hf)
    checks["len_raw"] = raw.get_vocab_size(with_added_tokens=True)
    mism = []
    for s in TOKENIZER_PROBES + corpus_documents()[:4]:
        a = hf(s, add_special_tokens=False)["input_ids"]
        b = raw.encode(s, add_special_tokens=False).ids
        if list(a) != list(b):
            mism.append(s)
        if raw.decode(b, skip_special_tokens=False) != s:  # probes are NFC, so decode must round-trip
            mism.append("decode:" + s)
    checks["hf_vs_raw_mismatches"] = mism
    return hf, checks


# --------------------------------------------------------------------------------------------
# Fixture specifications.
# --------------------------------------------------------------------------------------------

CASES = [
    dict(
        name="chat",
        prefix="",
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a short poem about the sea."},
        ],
        kwargs={},
        hidden=True,
    ),
    dict(
        name="nothink",
        prefix="nothink.",
        messages=[
            {"role": "system", "content": "You are a careful coding assistant."},
            {"role": "user", "content": "What does the Go keyword defer do?"},
        ],
        kwargs={"enable_thinking": False},
        hidden=False,
    ),
]


def spec(name, hf_class, config_class, tok, storage, rope_spelling, cfg, layout="hf", experts=None,
         mtp=False, visual=False, drop_layer_types=False, note=""):
    return dict(name=name, hf_class=hf_class, config_class=config_class, tok=tok, storage=storage,
                rope_spelling=rope_spelling, cfg=cfg, layout=layout, experts=experts, mtp=mtp,
                visual=visual, drop_layer_types=drop_layer_types, note=note)


def fixture_specs():
    common = dict(initializer_range=0.02)
    return [
        spec("llama_f32", "LlamaForCausalLM", "LlamaConfig", "llama3", "float32", "legacy", dict(
            common, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=512,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=64)),
            note="GQA 4/2, untied, odd intermediate 88, llama3 rope scaling (legacy rope_theta/rope_scaling "
                 "spelling); omp 64 and theta 1e4 so all three llama3 frequency bands occur in head_dim 16"),
        spec("llama_bf16_tied", "LlamaForCausalLM", "LlamaConfig", "llama3", "bfloat16", "rope_parameters", dict(
            common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=128,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                 original_max_position_embeddings=32)),
            note="GQA 4/1, tied, bf16 storage, yarn rope (factor 4, omp 32 = max_pos/factor) in rope_parameters"),
        spec("qwen2_f32", "Qwen2ForCausalLM", "Qwen2Config", "qwen3", "float32", "legacy_type", dict(
            common, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True,
            use_sliding_window=False,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
            note="q/k/v bias, tied, GQA 4/2, head_dim 12 (=H/nh), linear rope scaling factor 2 written as "
                 "rope_scaling {type: linear}"),
        spec("qwen3_f32", "Qwen3ForCausalLM", "Qwen3Config", "qwen3", "float32", "rope_parameters", dict(
            common, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=False, use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
            note="q/k norm, head_dim 16 != H/nh 12, GQA 4/2, untied"),
        spec("qwen3_bf16", "Qwen3ForCausalLM", "Qwen3Config", "qwen3", "bfloat16", "legacy", dict(
            common, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=True, use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
            note="q/k norm, head_dim 32 != H/nh 16, GQA 4/1, tied, bf16 storage"),
        spec("qwen3_moe_f32", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", "qwen3", "float32", "legacy", dict(
            common, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=False, decoder_sparse_step=1, moe_intermediate_size=16, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
            experts="per_expert",
            note="8 experts top-2, norm_topk_prob, layer 0 dense (mlp_only_layers [0]), layer 1 MoE"),
        spec("qwen3_next_f32", "Qwen3NextForCausalLM", "Qwen3NextConfig", "qwen3", "float32", "legacy", dict(
            common, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, decoder_sparse_step=1,
            moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[],
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
            experts="per_expert", mtp=True, drop_layer_types=True,
            note="3 GDN + 1 gated-attention layer (config uses full_attention_interval 4, no layer_types), "
                 "partial rotary 0.25, MoE 4 experts top-2 + shared expert, random mtp.* tensors added"),
        spec("qwen3_5_f32", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", "qwen3", "float32", "legacy", dict(
            common, hidden_size=48, intermediate_size=56, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                 mrope_section=[2, 1, 1], mrope_interleaved=True),
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
            layout="vlm", mtp=True, visual=True,
            note="Qwen3.5 dense in the published VLM layout (model.language_model.*, text_config nested, legacy "
                 "rope_theta/rope_scaling inside text_config), tied, random mtp.* and a tiny model.visual.* tower"),
        spec("qwen3_5_moe_f32", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", "qwen3", "float32",
             "rope_parameters", dict(
                 common, hidden_size=48, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                      mrope_section=[2, 1, 1], mrope_interleaved=True),
                 linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=16,
                 shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                 layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
             layout="vlm", experts="fused", mtp=True, visual=True,
             note="Qwen3.5 MoE in the published VLM layout with FUSED experts (gate_up_proj [E,2I,H], "
                  "down_proj [E,H,I]), rope_parameters spelling, untied, random mtp.* and model.visual.*"),
    ]


ZERO_CENTRED_NORM_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

INIT_STD = {
    "default": 0.05,
    "embed_tokens (also the lm_head when tied)": 0.02,
    "lm_head (untied)": 0.05,
    "q_proj/k_proj": 0.1,
    "router (mlp.gate, shared_expert_gate)": 0.2,
    "conv1d": 0.3,
    "bias": 0.1,
    "norm weight noise (around 1, or around 0 for zero-centred norms)": 0.1,
    "dt_bias": 0.5,
    "A_log": "log(U(0.05, 0.5))",
}


def is_norm_weight(name):
    leaf = name.rsplit(".", 2)
    return name.endswith(".weight") and len(leaf) >= 2 and ("norm" in leaf[-2] or "layernorm" in leaf[-2])


def norm_default(name, zero_centred):
    """Default value of a norm weight: 0 for (1+w) norms, 1 for standard and gated ones."""
    if not zero_centred or name.endswith("linear_attn.norm.weight") or ".visual." in name:
        return 1.0
    return 0.0


def init_tensor(name, shape, zero_centred, gen):
    import torch

    def randn(std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    if name.endswith("A_log"):
        u = torch.rand(shape, generator=gen, dtype=torch.float32) * 0.45 + 0.05
        return torch.log(u)
    if name.endswith("dt_bias"):
        return randn(0.5)
    if name.endswith(".bias"):
        return randn(0.1)
    if "conv1d.weight" in name:
        return randn(0.3)
    if len(shape) == 1 and is_norm_weight(name):
        return norm_default(name, zero_centred) + randn(0.1)
    if name.endswith("embed_tokens.weight"):
        return randn(0.02)
    if name.endswith("lm_head.weight"):
        return randn(0.05)
    if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
        return randn(0.1)
    if name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
        return randn(0.2)
    return randn(0.05)


# --------------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------------

def log(msg):
    print(f"[refgen] {msg}", flush=True)


def seed_for(name):
    return BASE_SEED + zlib.crc32(name.encode()) % 100000


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False, allow_nan=False)
        f.write("\n")


def jsonable(x):
    """Converts config values (tuples, sets, dtypes, nested configs) into plain JSON."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [jsonable(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if hasattr(x, "to_dict"):
        return jsonable(x.to_dict())
    return str(x)


def to_legacy_rope(cfg, use_type_key=False):
    """Rewrites rope_parameters (transformers 5) into rope_theta / partial_rotary_factor /
    rope_scaling (the spelling published checkpoints use). Also renames dtype -> torch_dtype."""
    rp = cfg.pop("rope_parameters", None)
    if rp is not None:
        rp = dict(rp)
        cfg["rope_theta"] = rp.pop("rope_theta")
        prf = rp.pop("partial_rotary_factor", None)
        if prf is not None and prf != 1.0:
            cfg["partial_rotary_factor"] = prf
        rtype = rp.get("rope_type", "default")
        if rtype == "default" and set(rp) <= {"rope_type"}:
            cfg["rope_scaling"] = None
        else:
            if use_type_key:
                rp["type"] = rp.pop("rope_type")
            cfg["rope_scaling"] = rp
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    return cfg


def load_safetensors(path):
    from safetensors.torch import load_file

    return load_file(path)


def save_safetensors(tensors, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def expert_dims(cfg):
    # transformers 5 saves qwen3_moe's count as num_local_experts (attribute_map of num_experts).
    n = cfg.get("num_experts", cfg.get("num_local_experts"))
    return n, cfg["moe_intermediate_size"], cfg["hidden_size"]


def unfuse_experts(sd, cfg):
    """experts.gate_up_proj [E,2I,H] / experts.down_proj [E,H,I] -> experts.E.{gate,up,down}_proj.weight."""
    E, I, H = expert_dims(cfg)
    out = {}
    for k, v in sd.items():
        kk = k[: -len(".weight")] if k.endswith(".weight") else k
        if kk.endswith(".mlp.experts.gate_up_proj"):
            base = kk[: -len("gate_up_proj")]
            if tuple(v.shape) != (E, 2 * I, H):
                raise RuntimeError(f"experts: {k} has shape {tuple(v.shape)}, want {(E, 2 * I, H)}")
            for e in range(E):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :I, :]
                out[f"{base}{e}.up_proj.weight"] = v[e, I:, :]
        elif kk.endswith(".mlp.experts.down_proj"):
            base = kk[: -len("down_proj")]
            if tuple(v.shape) != (E, H, I):
                raise RuntimeError(f"experts: {k} has shape {tuple(v.shape)}, want {(E, H, I)}")
            for e in range(E):
                out[f"{base}{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return out


def fuse_experts(sd, cfg):
    """experts.E.{gate,up,down}_proj.weight -> experts.gate_up_proj [E,2I,H], experts.down_proj [E,H,I]."""
    import re

    import torch

    E, I, H = expert_dims(cfg)
    pat = re.compile(r"^(.*\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    groups, out = {}, {}
    for k, v in sd.items():
        m = pat.match(k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[k] = v
    for base, parts in groups.items():
        gate_up, down = [], []
        for e in range(E):
            g, u, d = parts[(e, "gate_proj")], parts[(e, "up_proj")], parts[(e, "down_proj")]
            if tuple(g.shape) != (I, H) or tuple(u.shape) != (I, H) or tuple(d.shape) != (H, I):
                raise RuntimeError(f"experts: {base}{e} has unexpected shapes")
            gate_up.append(torch.cat([g, u], dim=0))
            down.append(d)
        out[base + "gate_up_proj"] = torch.stack(gate_up, 0)
        out[base + "down_proj"] = torch.stack(down, 0)
    return out


def vlm_rename(sd):
    """HF text-only names -> published Qwen3.5 VLM names (lm_head stays at top level)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("model."):
            out["model.language_model." + k[len("model."):]] = v
        else:
            out[k] = v
    return out


def vlm_unrename(sd):
    out = {}
    for k, v in sd.items():
        if k.startswith("model.language_model."):
            out["model." + k[len("model.language_model."):]] = v
        else:
            out[k] = v
    return out


def make_mtp_tensors(sd_final, layer_prefix, full_layer, cfg, zero_centred, dtype, gen):
    """Random mtp.* tensors shaped like a full-attention decoder layer of this model + fc/norms."""
    H = cfg["hidden_size"]
    src = f"{layer_prefix}{full_layer}."
    out = {}
    names = {
        "mtp.fc.weight": (H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.norm.weight": (H,),
    }
    for k, v in sd_final.items():
        if k.startswith(src):
            names["mtp.layers.0." + k[len(src):]] = tuple(v.shape)
    if len(names) <= 4:
        raise RuntimeError(f"mtp: no tensors under {src}")
    for k in sorted(names):
        out[k] = init_tensor(k, names[k], zero_centred, gen).to(dtype)
    return out


# --------------------------------------------------------------------------------------------
# Reference computation.
# --------------------------------------------------------------------------------------------

def decoder_parts(model):
    inner = model.model
    if hasattr(inner, "language_model"):
        inner = inner.language_model
    return inner.embed_tokens, list(inner.layers), inner.norm


def forward_logits(model, ids, device):
    import torch

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        return model(input_ids=x, use_cache=False).logits[0].float().cpu()


def run_case(model, raw_tok, hf_tok, case, device, want_hidden):
    import torch

    text = hf_tok.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=False,
                                      **case["kwargs"])
    ids = raw_tok.encode(text, add_special_tokens=False).ids
    hf_ids = list(hf_tok(text, add_special_tokens=False)["input_ids"])
    checks = {"hf_ids_equal_raw_ids": hf_ids == ids}

    captured = []
    hooks = []
    if want_hidden:
        embed, layers, norm = decoder_parts(model)

        def grab(_m, _inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            captured.append(t[0].detach().float().cpu().clone())

        hooks.append(embed.register_forward_hook(grab))
        for layer in layers:
            hooks.append(layer.register_forward_hook(grab))
        hooks.append(norm.register_forward_hook(grab))

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=x, use_cache=True)
        for h in hooks:
            h.remove()
        logits = out.logits[0].float().cpu().clone()
        past = out.past_key_values
        nxt = logits[-1]
        greedy, greedy_logits, margins, top2 = [], [], [], []
        for step in range(GREEDY_STEPS):
            vals, idx = torch.topk(nxt, 2)
            tok = int(idx[0])
            greedy.append(tok)
            greedy_logits.append(nxt.clone())
            margins.append(float(vals[0] - vals[1]))
            top2.append([int(idx[0]), int(idx[1])])
            if step == GREEDY_STEPS - 1:
                break
            out = model(input_ids=torch.tensor([[tok]], dtype=torch.long, device=device),
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[0, -1].float().cpu()
    greedy_logits = torch.stack(greedy_logits, 0)

    # Cross-check 1: one uncached forward over prompt + greedy[:-1] must give the same logits.
    full = forward_logits(model, ids + greedy[:-1], device)
    T = len(ids)
    checks["prefill_cached_vs_uncached_max_abs"] = float((full[:T] - logits).abs().max())
    checks["decode_cached_vs_uncached_max_abs"] = float((full[T - 1:] - greedy_logits).abs().max())

    # Cross-check 2: transformers' own greedy generate() (it may stop early at an eos id).
    try:
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long, device=device)
            g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=GREEDY_STEPS, num_beams=1)
        gen = [int(t) for t in g[0, T:].tolist()]
        checks["generate_ids"] = gen
        checks["generate_matches_manual"] = gen == greedy[: len(gen)] and len(gen) > 0
    except Exception as e:  # noqa: BLE001 - a failing cross-check is reported, not fatal
        checks["generate_error"] = repr(e)[:500]

    try:
        greedy_text = hf_tok.decode(greedy, skip_special_tokens=False)
    except Exception:  # noqa: BLE001 - padded ids have no token
        greedy_text = None

    hidden = torch.stack(captured, 0) if want_hidden else None
    if want_hidden and hidden.shape[0] != len(decoder_parts(model)[1]) + 2:
        raise RuntimeError(f"hidden capture: got {hidden.shape[0]} tensors")
    result = dict(
        name=case["name"],
        tensor_prefix=case["prefix"],
        messages=case["messages"],
        chat_template_kwargs=case["kwargs"],
        add_generation_prompt=True,
        add_special_tokens=False,
        text=text,
        prompt_ids=ids,
        num_prompt_tokens=T,
        greedy_ids=greedy,
        greedy_text=greedy_text,
        greedy_margins=margins,
        greedy_top2_ids=top2,
        min_greedy_margin=min(margins),
        logits_abs_max=float(logits.abs().max()),
        checks=checks,
    )
    tensors = {
        case["prefix"] + "prompt_ids": torch.tensor(ids, dtype=torch.int32),
        case["prefix"] + "logits": logits.contiguous(),
        case["prefix"] + "greedy_ids": torch.tensor(greedy, dtype=torch.int32),
        case["prefix"] + "greedy_logits": greedy_logits.contiguous(),
    }
    if hidden is not None:
        tensors[case["prefix"] + "hidden"] = hidden.contiguous()
    return result, tensors


# --------------------------------------------------------------------------------------------
# One fixture.
# --------------------------------------------------------------------------------------------

def build_fixture(sp, out_root, tok_assets, device, repo_root):
    import torch
    import transformers

    name = sp["name"]
    final = os.path.join(out_root, name)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.makedirs(final)
    tmp = tempfile.mkdtemp(prefix=f"refgen-{name}-")
    seed = seed_for(name)
    checks = {}

    raw_tok, chat_template, template_source = tok_assets[sp["tok"]]
    fl = TOKENIZER_FLAVORS[sp["tok"]]
    tok_size = raw_tok.get_vocab_size(with_added_tokens=True)
    vocab_size = (tok_size // 8 + 1) * 8  # always at least one padded row
    cfg_eos = fl["cfg_eos"]
    eos_ids = [raw_tok.token_to_id(t) for t in cfg_eos] if isinstance(cfg_eos, list) else raw_tok.token_to_id(cfg_eos)

    # 1. Config and model, reinitialised deterministically.
    cfg_kwargs = dict(sp["cfg"], vocab_size=vocab_size, bos_token_id=raw_tok.token_to_id(fl["cfg_bos"]),
                      eos_token_id=eos_ids)
    config = getattr(transformers, sp["config_class"])(**cfg_kwargs)
    model_cls = getattr(transformers, sp["hf_class"])
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if type(model).__name__ != sp["hf_class"]:
        raise RuntimeError(f"{name}: AutoModelForCausalLM built {type(model).__name__}, want {sp['hf_class']}")
    model = model.to(torch.float32).eval()
    zero_centred = config.model_type in ZERO_CENTRED_NORM_TYPES
    gen = torch.Generator().manual_seed(seed)
    norm_mismatch = []
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1 and is_norm_weight(pname):
                want = norm_default(pname, zero_centred)
                if not bool(torch.all(p == want)):
                    norm_mismatch.append(pname)
            p.copy_(init_tensor(pname, tuple(p.shape), zero_centred, gen))
            if sp["storage"] == "bfloat16":
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    if norm_mismatch:
        log(f"{name}: WARNING norm weights whose transformers init differs from the assumed default: "
            f"{norm_mismatch[:6]}")
    checks["norm_default_assumption_mismatches"] = norm_mismatch
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        checks["tied_shares_storage"] = (
            model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr())

    # 2. Save with transformers (native layout), in the storage dtype.
    probe_ids = raw_tok.encode(CASES[0]["messages"][1]["content"], add_special_tokens=False).ids
    mem_logits = forward_logits(model, probe_ids, "cpu")
    if sp["storage"] == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(tmp)
    del model
    native_cfg = read_json(os.path.join(tmp, "config.json"))
    native_sd = load_safetensors(os.path.join(tmp, "model.safetensors"))
    if "head_dim" in sp["cfg"]:
        # Some config classes have no head_dim field; make sure the weights really use it.
        gated = config.model_type in ZERO_CENTRED_NORM_TYPES  # q_proj also holds the output gate
        want = sp["cfg"]["num_attention_heads"] * sp["cfg"]["head_dim"] * (2 if gated else 1)
        qs = [k for k in native_sd if k.endswith("self_attn.q_proj.weight")]
        checks["head_dim_in_weights"] = bool(qs) and all(native_sd[k].shape[0] == want for k in qs)
    log(f"{name}: transformers saved {len(native_sd)} tensors; e.g. {sorted(native_sd)[:3]} ... "
        f"{[k for k in sorted(native_sd) if 'expert' in k][:3]}")

    # 3. Final directory: weights in the published layout, config spelling, extra tensors.
    sd = dict(native_sd)
    if sp["experts"] == "per_expert":
        sd = unfuse_experts(sd, native_cfg)
    elif sp["experts"] == "fused":
        sd = fuse_experts(unfuse_experts(sd, native_cfg), native_cfg)
    layer_prefix = "model.layers."
    if sp["layout"] == "vlm":
        sd = vlm_rename(sd)
        layer_prefix = "model.language_model.layers."
    store_dtype = torch.bfloat16 if sp["storage"] == "bfloat16" else torch.float32
    extra = {}
    if sp["mtp"]:
        lt = native_cfg.get("layer_types") or sp["cfg"].get("layer_types")
        full_layer = lt.index("full_attention")
        extra.update(make_mtp_tensors(sd, layer_prefix, full_layer, native_cfg, zero_centred, store_dtype,
                                      torch.Generator().manual_seed(seed + 1)))

    if sp["layout"] == "vlm":
        text_cfg = {k: v for k, v in native_cfg.items() if k not in ("architectures", "transformers_version")}
        if sp["rope_spelling"] == "legacy":
            text_cfg = to_legacy_rope(text_cfg)
        top_type = "qwen3_5_moe" if config.model_type == "qwen3_5_moe_text" else "qwen3_5"
        vision_cfg = dict(model_type=top_type + "_vision", depth=1, hidden_size=16, intermediate_size=32,
                          num_heads=2, in_channels=3, patch_size=2, spatial_merge_size=2, temporal_patch_size=2,
                          out_hidden_size=native_cfg["hidden_size"], num_position_embeddings=16,
                          hidden_act="gelu_pytorch_tanh", initializer_range=0.02)
        top = {
            "architectures": ["Qwen3_5MoeForConditionalGeneration" if top_type == "qwen3_5_moe"
                              else "Qwen3_5ForConditionalGeneration"],
            "model_type": top_type,
            "text_config": text_cfg,
            "vision_config": vision_cfg,
            # The tokenizer has no vision tokens: these point at padded (unused) rows.
            "vision_start_token_id": vocab_size - 4,
            "vision_end_token_id": vocab_size - 3,
            "image_token_id": vocab_size - 2,
            "video_token_id": vocab_size - 1,
            "tie_word_embeddings": tied,
            "transformers_version": native_cfg.get("transformers_version"),
        }
        write_json(os.path.join(final, "config.json"), top)
        if sp["visual"]:
            extra.update(make_visual_tensors(final, store_dtype, torch.Generator().manual_seed(seed + 2)))
    else:
        cfg_out = dict(native_cfg)
        if sp["rope_spelling"] in ("legacy", "legacy_type"):
            cfg_out = to_legacy_rope(cfg_out, use_type_key=sp["rope_spelling"] == "legacy_type")
        if sp["drop_layer_types"]:
            cfg_out.pop("layer_types", None)
            cfg_out["full_attention_interval"] = 4
        if "num_local_experts" in cfg_out and config.model_type == "qwen3_moe":
            cfg_out["num_experts"] = cfg_out.pop("num_local_experts")  # the published spelling
        write_json(os.path.join(final, "config.json"), cfg_out)

    all_sd = dict(sd)
    for k, v in extra.items():
        if k in all_sd:
            raise RuntimeError(f"{name}: extra tensor {k} collides")
        all_sd[k] = v
    save_safetensors(all_sd, os.path.join(final, "model.safetensors"))

    # Layout round trip: the final file, mapped back, must equal what transformers saved.
    back = {k: v for k, v in load_safetensors(os.path.join(final, "model.safetensors")).items()
            if not (k.startswith("mtp.") or k.startswith("model.visual."))}
    if sp["layout"] == "vlm":
        back = vlm_unrename(back)
    back = unfuse_experts(back, native_cfg) if sp["experts"] else back
    ref_native = unfuse_experts(native_sd, native_cfg) if sp["experts"] else native_sd
    same_keys = set(back) == set(ref_native)
    checks["layout_roundtrip_exact"] = same_keys and all(torch.equal(back[k], ref_native[k]) for k in back)
    if not same_keys:
        checks["layout_roundtrip_key_diff"] = sorted(set(back) ^ set(ref_native))[:20]

    # Tokenizer + generation config.
    save_tokenizer(build_tokenizer_from_assets(tok_assets, sp["tok"]), sp["tok"], chat_template, final)
    gen_eos = [raw_tok.token_to_id(t) for t in fl["gen_eos"]]
    gcfg = dict(bos_token_id=raw_tok.token_to_id(fl["cfg_bos"]), eos_token_id=gen_eos)
    if sp["tok"] == "qwen3":
        gcfg.update(pad_token_id=raw_tok.token_to_id("<|endoftext|>"), do_sample=True, temperature=0.6,
                    top_k=20, top_p=0.95)
    else:
        gcfg.update(do_sample=True, temperature=0.6, top_p=0.9)
    gcfg["transformers_version"] = transformers.__version__
    write_json(os.path.join(final, "generation_config.json"), gcfg)

    # 4. Reference model: loaded back from disk in float32 with eager attention.
    ref_dir = tmp if sp["layout"] == "vlm" else final
    ref = model_cls.from_pretrained(ref_dir, dtype=torch.float32, attn_implementation="eager").to(device).eval()
    checks["reference_loaded_from"] = "final dir" if ref_dir == final else "transformers-native save of the same weights"
    checks["attn_implementation"] = getattr(ref.config, "_attn_implementation", None)
    checks["reload_vs_memory_max_abs"] = float((forward_logits(ref, probe_ids, device) - mem_logits).abs().max())

    hf_tok, tok_checks = load_and_check_tokenizer(final, raw_tok, chat_template)
    checks["tokenizer"] = tok_checks

    cases, tensors = [], {}
    for case in CASES:
        res, ts = run_case(ref, raw_tok, hf_tok, case, device, case["hidden"])
        cases.append(res)
        tensors.update(ts)

    # 5. VLM layout: check that transformers reads the final directory the same way.
    if sp["layout"] == "vlm":
        checks["vlm_config"] = check_vlm_config(final, native_cfg)
        checks["vlm_reload"] = check_vlm_reload(final, cases[0]["prompt_ids"], tensors["logits"], device)

    ref_cfg = jsonable(ref.config.to_dict())
    del ref
    save_safetensors(tensors, os.path.join(final, "reference.safetensors"))

    hard = hard_failures(checks, cases)
    doc = {
        "format": FORMAT,
        "fixture": name,
        "description": sp["note"],
        "architecture": read_json(os.path.join(final, "config.json"))["architectures"][0],
        "hf_class_used_for_reference": sp["hf_class"],
        "storage_dtype": sp["storage"],
        "compute": {"dtype": "float32", "attn_implementation": "eager", "device": device},
        "layout": {
            "weights": "vlm (model.language_model.*)" if sp["layout"] == "vlm" else "hf",
            "experts": sp["experts"],
            "rope_spelling": {"legacy": "rope_theta/rope_scaling", "legacy_type": "rope_theta/rope_scaling(type)",
                              "rope_parameters": "rope_parameters"}[sp["rope_spelling"]],
            "tied_word_embeddings": tied,
            "extra_tensors": sorted({k.split(".")[0] + ("." + k.split(".")[1] if k.startswith("model.") else "")
                                     + ".*" for k in extra}),
        },
        "seed": seed,
        "init_std": INIT_STD,
        "versions": versions(),
        "tokenizer": {
            "flavor": sp["tok"],
            "size": tok_size,
            "model_vocab_size": vocab_size,
            "padded_rows": vocab_size - tok_size,
            "chat_template_source": template_source,
            "bos_token": fl["bos"],
            "eos_token": fl["eos"],
            "generation_eos_ids": gen_eos,
        },
        "greedy_steps": GREEDY_STEPS,
        "greedy_stops_at_eos": False,
        "config": read_json(os.path.join(final, "config.json")),
        "hf_config": ref_cfg,
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                    for k, v in sorted(tensors.items())},
        "hard_failures": hard,
        "checks": checks,
        "cases": cases,
    }
    # The first case is mirrored at the top level (tensors without prefix).
    c0 = cases[0]
    for key in ("messages", "chat_template_kwargs", "text", "prompt_ids", "greedy_ids", "greedy_margins",
                "greedy_top2_ids", "min_greedy_margin"):
        doc[key] = c0[key]
    write_json(os.path.join(final, "reference.json"), doc)
    shutil.rmtree(tmp, ignore_errors=True)

    files = {}
    for fn in sorted(os.listdir(final)):
        p = os.path.join(final, fn)
        files[fn] = {"bytes": os.path.getsize(p), "sha256": sha256_file(p)}
    entry = {
        "name": name,
        "dir": name,
        "architecture": doc["architecture"],
        "model_type": doc["config"]["model_type"],
        "storage_dtype": sp["storage"],
        "layout": doc["layout"],
        "num_hidden_layers": native_cfg["num_hidden_layers"],
        "hidden_size": native_cfg["hidden_size"],
        "vocab_size": vocab_size,
        "tokenizer_size": tok_size,
        "description": sp["note"],
        "hard_failures": hard,
        "files": files,
    }
    log(f"{name}: T={[c['num_prompt_tokens'] for c in cases]} min margins="
        f"{[round(c['min_greedy_margin'], 4) for c in cases]} bytes={sum(f['bytes'] for f in files.values())} "
        f"hard_failures={hard}")
    return entry


def build_tokenizer_from_assets(tok_assets, flavor):
    vocab, merges = tok_assets["_bpe"]
    return build_tokenizer(vocab, merges, flavor)


def make_visual_tensors(final_dir, dtype, gen):
    """A tiny but complete model.visual.* tower matching the vision_config written to config.json."""
    import torch
    import transformers

    try:
        top = transformers.AutoConfig.from_pretrained(final_dir)
        vm = transformers.AutoModel.from_config(top.vision_config)
        shapes = {"model.visual." + k: tuple(v.shape) for k, v in vm.state_dict().items()}
    except Exception as e:  # noqa: BLE001 - fall back to a single dummy tensor
        log(f"visual: cannot build the vision model ({e!r}); writing one dummy tensor")
        shapes = {"model.visual.patch_embed.proj.weight": (16, 3, 2, 2, 2)}
    return {k: init_tensor(k, shapes[k], False, gen).to(dtype) for k in sorted(shapes)}


def check_vlm_config(final_dir, native_cfg):
    import transformers

    try:
        top = transformers.AutoConfig.from_pretrained(final_dir)
        tc = top.get_text_config() if hasattr(top, "get_text_config") else top.text_config
        got = jsonable(getattr(tc, "rope_parameters", None))
        want = jsonable(native_cfg.get("rope_parameters"))
        return {"model_type": top.model_type, "text_rope_parameters": got, "matches_native": got == want,
                "layer_types_match": list(tc.layer_types) == list(native_cfg.get("layer_types", []))}
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)[:500]}


def check_vlm_reload(final_dir, ids, want_logits, device):
    import torch
    import transformers

    out = {}
    try:
        top = transformers.AutoConfig.from_pretrained(final_dir)
        loaders = [("architectures[0]", getattr(transformers, top.architectures[0])),
                   ("AutoModelForCausalLM", transformers.AutoModelForCausalLM)]
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)[:800]}
    for label, cls in loaders:
        try:
            m = cls.from_pretrained(final_dir, dtype=torch.float32, attn_implementation="eager").to(device).eval()
            got = forward_logits(m, ids, device)
            out[label] = {"class": type(m).__name__,
                          "max_abs_vs_reference": float((got - want_logits).abs().max())}
            del m
        except Exception as e:  # noqa: BLE001
            out[label] = {"error": repr(e)[:800]}
    return out


def hard_failures(checks, cases):
    """Problems that make a fixture wrong (as opposed to informational cross-checks)."""
    bad = []
    if checks.get("reload_vs_memory_max_abs", 1.0) > 1e-4:
        bad.append("reload_vs_memory")
    if not checks.get("layout_roundtrip_exact", False):
        bad.append("layout_roundtrip")
    if checks.get("tied_shares_storage") is False:
        bad.append("tied_shares_storage")
    if checks.get("head_dim_in_weights") is False:
        bad.append("head_dim_in_weights")
    t = checks.get("tokenizer", {})
    if t.get("hf_vs_raw_mismatches") or not t.get("chat_template_roundtrip", False):
        bad.append("tokenizer")
    for c in cases:
        cc = c["checks"]
        if not cc["hf_ids_equal_raw_ids"]:
            bad.append(c["name"] + ":hf_ids")
        if cc["prefill_cached_vs_uncached_max_abs"] > 1e-4 or cc["decode_cached_vs_uncached_max_abs"] > 1e-4:
            bad.append(c["name"] + ":cache_consistency")
        if not (16 <= c["num_prompt_tokens"] <= 64):
            bad.append(c["name"] + ":prompt_length")
    vc = checks.get("vlm_config")
    if vc is not None and not vc.get("matches_native", False):
        bad.append("vlm_config")
    return bad


def versions():
    import safetensors
    import tokenizers
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__}


# --------------------------------------------------------------------------------------------
# Main.
# --------------------------------------------------------------------------------------------

def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (one subdirectory per fixture)")
    ap.add_argument("--tarball", help="also write a .tar.gz of the output directory here")
    ap.add_argument("--only", help="comma-separated fixture names to build")
    ap.add_argument("--device", default="cpu", help="torch device for the reference forward passes")
    args = ap.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"versions: {versions()}")

    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.makedirs(args.out, exist_ok=True)
    vocab, merges = train_bpe()
    log(f"bpe: {len(vocab)} base tokens, {len(merges)} merges")
    qwen_tpl, qwen_src = qwen3_chat_template(repo_root)
    tok_assets = {
        "_bpe": (vocab, merges),
        "qwen3": (build_tokenizer(vocab, merges, "qwen3"), qwen_tpl, qwen_src),
        "llama3": (build_tokenizer(vocab, merges, "llama3"), LLAMA3_CHAT_TEMPLATE,
                   "embedded (published Meta-Llama-3-8B-Instruct template)"),
    }

    specs = fixture_specs()
    if args.only:
        keep = set(args.only.split(","))
        specs = [s for s in specs if s["name"] in keep]
    entries, errors = [], {}
    for sp in specs:
        log(f"--- {sp['name']}")
        try:
            entries.append(build_fixture(sp, args.out, tok_assets, args.device, repo_root))
        except Exception:  # noqa: BLE001 - keep going so one run shows every problem
            errors[sp["name"]] = traceback.format_exc()
            log(f"{sp['name']}: FAILED\n{errors[sp['name']]}")

    manifest = {
        "format": FORMAT,
        "generator": "tools/refgen/refgen.py",
        "versions": versions(),
        "bpe": {"base_vocab": len(vocab), "merges": len(merges), "qwen3_chat_template_source": qwen_src},
        "fixtures": entries,
        "errors": errors,
    }
    write_json(os.path.join(args.out, "manifest.json"), manifest)
    total = sum(f["bytes"] for e in entries for f in e["files"].values())
    log(f"total fixture bytes: {total} ({total / 2**20:.2f} MiB) in {len(entries)} fixtures; "
        f"failed: {sorted(errors)}; with hard failures: {[e['name'] for e in entries if e['hard_failures']]}")
    if args.tarball:
        with tarfile.open(args.tarball, "w:gz") as tf:
            for fn in sorted(os.listdir(args.out)):
                tf.add(os.path.join(args.out, fn), arcname=fn)
        log(f"wrote {args.tarball} ({os.path.getsize(args.tarball)} bytes)")
    return 1 if errors or any(e["hard_failures"] for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
