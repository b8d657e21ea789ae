package convert

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/engine"
)

// checkOutput refuses an output path that cannot be written, before any
// work is done: an existing directory, or a missing parent directory.
func checkOutput(out string) error {
	if out == "" {
		return fmt.Errorf("convert: no output file given")
	}
	if st, err := os.Stat(out); err == nil && st.IsDir() {
		return fmt.Errorf("convert: the output %s is a directory; give a file name, such as %s", out, filepath.Join(out, "model.cmf"))
	}
	dir := filepath.Dir(out)
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("convert: the output's folder %s: %w", dir, err)
	} else if !st.IsDir() {
		return fmt.Errorf("convert: the output's folder %s is not a directory", dir)
	}
	return nil
}

// checkTokenizer builds the tokenizer the converted file will carry the way
// the engine will build it, so that a file that could not run is refused
// at convert time: an unsupported or broken tokenizer, an empty
// vocabulary, or token ids beyond the model's embedding rows (vocab_size).
// src names the source (tokenizer.json, the GGUF file).
func checkTokenizer(tc *cmf.TokenizerConfig, blob []byte, arch *cmf.Arch, src string) error {
	tok, err := engine.TokenizerFrom(tc, blob)
	if err != nil {
		return fmt.Errorf("%s: the tokenizer cannot be used: %w", src, err)
	}
	n := tok.VocabSize()
	if n == 0 {
		return fmt.Errorf("%s: the tokenizer's vocabulary is empty", src)
	}
	for _, a := range tok.AddedTokens() {
		if a.ID >= arch.VocabSize {
			return fmt.Errorf("%s: added token %q has id %d, beyond the model's vocab_size %d", src, a.Content, a.ID, arch.VocabSize)
		}
	}
	if n > arch.VocabSize {
		return fmt.Errorf("%s: the tokenizer has token ids up to %d, beyond the model's vocab_size %d", src, n-1, arch.VocabSize)
	}
	for _, id := range tc.EOSTokenIDs {
		if id >= arch.VocabSize {
			return fmt.Errorf("%s: eos_token_id %d is beyond the model's vocab_size %d", src, id, arch.VocabSize)
		}
	}
	for _, p := range []struct {
		name string
		id   *int
	}{{"bos_token_id", tc.BOSTokenID}, {"pad_token_id", tc.PadTokenID}} {
		if p.id != nil && *p.id >= arch.VocabSize {
			return fmt.Errorf("%s: %s %d is beyond the model's vocab_size %d", src, p.name, *p.id, arch.VocabSize)
		}
	}
	return nil
}
