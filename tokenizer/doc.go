// Package tokenizer turns text into token ids and back exactly as Hugging
// Face `tokenizers` does for BPE models, and as llama.cpp does for GGUF
// vocabularies.
//
// Three constructors cover the formats models ship:
//
//   - FromHFJSON: a tokenizer.json (byte-level BPE as in GPT-2, Llama-3,
//     Qwen2/3/3.5, and SentencePiece-converted BPE with byte fallback as in
//     Llama-2/Mistral), with added tokens (single_word / lstrip / rstrip /
//     normalized flags, leftmost-longest matching), the normalizers NFC,
//     NFD, Lowercase, Prepend, Replace, Strip and Sequence, the
//     pre-tokenizers Split, ByteLevel, Metaspace, Digits, Whitespace,
//     WhitespaceSplit and Sequence, the post-processors TemplateProcessing,
//     ByteLevel, Roberta/BertProcessing and Sequence, and the decoders
//     ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence.
//     ParseHFConfig reads the companion tokenizer_config.json.
//   - FromSentencePiece: a GGUF "llama" vocabulary (tokens, scores, token
//     types): score-ordered merges, ▁ for spaces, <0xNN> byte fallback.
//   - FromGGUFBPE: a GGUF "gpt2" vocabulary (tokens, merges, token types)
//     whose tokenizer.ggml.pre name selects the pre-tokenizer regexes.
//
// Pre-tokenizer regexes run on github.com/dlclark/regexp2/v2 (they need
// look-ahead); the Qwen2/3, Qwen3.5, Llama-3 and GPT-2 patterns have
// hand-written matchers that fastsplit_test.go checks against regexp2.
//
// Invalid UTF-8 in Encode's input is tokenized byte by byte by byte-level
// models (each invalid byte decodes back as U+FFFD); decoding replaces
// ill-formed sequences the way Rust's String::from_utf8_lossy does.
package tokenizer
