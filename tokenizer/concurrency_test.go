package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
)

// TestConcurrentEncode runs Encode from several goroutines (sharing the
// word cache) and checks every result against a sequential run.
func TestConcurrentEncode(t *testing.T) {
	tok := loadQwen3(t)
	var strs []string
	b, err := os.ReadFile("testdata/golden_strings.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &strs); err != nil {
		t.Fatal(err)
	}
	want := make([]string, len(strs))
	for i, s := range strs {
		want[i] = fmt.Sprint(tok.Encode(s, false, true))
	}
	m := tok.model.(*bpeModel)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 3; k++ {
				if g == 0 {
					m.cache.reset() // exercise refills under load
				}
				for i := range strs {
					j := (i + g*37) % len(strs)
					if got := fmt.Sprint(tok.Encode(strs[j], false, true)); got != want[j] {
						errs <- fmt.Sprintf("goroutine %d: Encode(%+q) = %s, want %s", g, strs[j], got, want[j])
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
