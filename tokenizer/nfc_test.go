package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"testing"
	"unicode/utf8"
)

// TestNFCCases checks nfc against Python's unicodedata.normalize("NFC", ...)
// on every code point that normalization touches plus random mark sequences
// (testdata/nfc_cases.json.gz, written by gen_nfc_tables.py --tests).
func TestNFCCases(t *testing.T) {
	f, err := os.Open("testdata/nfc_cases.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Unicode string      `json:"unicode"`
		Cases   [][2]string `json:"cases"`
	}
	if err := json.NewDecoder(zr).Decode(&data); err != nil {
		t.Fatal(err)
	}
	if data.Unicode != nfcUnicodeVersion {
		t.Fatalf("test cases are for Unicode %s, tables for %s", data.Unicode, nfcUnicodeVersion)
	}
	if len(data.Cases) < 5000 {
		t.Fatalf("only %d cases", len(data.Cases))
	}
	bad := 0
	for _, c := range data.Cases {
		if got := nfc(c[0]); got != c[1] {
			bad++
			if bad < 20 {
				t.Errorf("nfc(%+q) = %+q, want %+q", c[0], got, c[1])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d cases wrong", bad, len(data.Cases))
	}
}

func TestNFCKeepsInvalidBytes(t *testing.T) {
	in := "a\xffe\u0301\xc3"
	want := "a\xff\u00e9\xc3"
	if got := nfc(in); got != want {
		t.Fatalf("nfc(%+q) = %+q, want %+q", in, got, want)
	}
}

func FuzzNFC(f *testing.F) {
	for _, s := range []string{"e\u0301", "\u1100\u1161\u11a8", "a\u0323\u0302", "\u00e9\u0300"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		n := nfc(s)
		if nfc(n) != n {
			t.Fatalf("nfc not idempotent on %+q: %+q then %+q", s, n, nfc(n))
		}
	})
}
