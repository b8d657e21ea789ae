package bench

import (
	"slices"
	"strings"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/synth"
)

// Peer is one figure of another engine, quoted (not measured by cortiq).
type Peer struct {
	Engine    string  // llama.cpp
	Device    string  // cpu or cuda
	GPU       string  // cuda: the GPU's name as the device reports it (H200)
	Machine   string  // the machine kind, in words
	Threads   int     // CPU threads (0: not a CPU figure)
	Shape     string  // a synth shape name (synth.Shapes)
	Quant     string  // the peer's format
	Like      string  // the cortiq format it is compared with
	Test      string  // pp128, tg64, tg128@d8192, tg128x8 (the peer's own run)
	Kind      string  // pp, tg, depth or batch
	Depth     int     // Kind depth: the context depth
	Batch     int     // Kind batch: concurrent sequences
	TokPerSec float64 // the peer's figure (aggregate for batch)
	Source    string  // where it is quoted from
}

const (
	srcCPU  = "shared/reference/targets.md, \"CPU, same llama.cpp build, 2 threads on the 2-core machine (llama-bench -t 2 -p 128 -n 64)\""
	srcGPU  = "shared/reference/targets.md, \"llama.cpp on the same machines\" (upstream Aug 2026, CUDA 13, llama-bench -p 512 -n 128)"
	srcGPU2 = "shared/reference/targets.md, \"Same build, 2026-12-01\" (llama-bench depth rows, llama-batched-bench 128+128 tokens per sequence)"
	cpu2    = "2-core x86 (AVX-512 VNNI), 2 threads"
	h200    = "NVIDIA H200"
)

// Peers are the peer figures of targets.md, copied here with their source
// line so that builds and tests never read shared/.
var Peers = []Peer{
	{"llama.cpp", "cpu", "", cpu2, 2, "llama1b", "Q4_0", "q4tp", "tg64", "tg", 0, 1, 48.8, srcCPU},
	{"llama.cpp", "cpu", "", cpu2, 2, "llama1b", "Q8_0", "q8_row", "tg64", "tg", 0, 1, 32.5, srcCPU},
	{"llama.cpp", "cpu", "", cpu2, 2, "llama1b", "Q4_0", "q4tp", "pp128", "pp", 0, 1, 259, srcCPU},
	{"llama.cpp", "cpu", "", cpu2, 2, "llama1b", "Q8_0", "q8_row", "pp128", "pp", 0, 1, 139, srcCPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128", "tg", 0, 1, 330, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q8_0", "q8_row", "tg128", "tg", 0, 1, 253, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "pp512", "pp", 0, 1, 10650, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q8_0", "q8_row", "pp512", "pp", 0, 1, 10630, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama1b", "Q4_0", "q4tp", "tg128", "tg", 0, 1, 958, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama1b", "Q8_0", "q8_row", "tg128", "tg", 0, 1, 816, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama1b", "Q4_0", "q4tp", "pp512", "pp", 0, 1, 34430, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama1b", "Q8_0", "q8_row", "pp512", "pp", 0, 1, 43450, srcGPU},
	{"llama.cpp", "cuda", "H200", h200, 0, "qwen3_30b_a3b", "Q4_0", "q4tp", "tg128", "tg", 0, 1, 338.6, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128@d0", "depth", 0, 1, 347, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128@d8192", "depth", 8192, 1, 297, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128@d32768", "depth", 32768, 1, 216, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128x1", "batch", 0, 1, 341, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128x8", "batch", 0, 8, 1347, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128x32", "batch", 0, 32, 3538, srcGPU2},
	{"llama.cpp", "cuda", "H200", h200, 0, "llama8b", "Q4_0", "q4tp", "tg128x64", "batch", 0, 64, 5122, srcGPU2},
}

// ShapeName returns the synth shape a's dimensions match ("" if none):
// what makes a measured model comparable with a peer figure.
func ShapeName(a *cmf.Arch) string {
	var names []string
	for n := range synth.Shapes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		s := synth.Shapes[n]()
		if s.ArchName == a.ArchName && s.HiddenSize == a.HiddenSize && s.NumLayers == a.NumLayers &&
			s.IntermediateSize == a.IntermediateSize && s.NumAttentionHeads == a.NumAttentionHeads &&
			s.NumKVHeads == a.NumKVHeads && s.VocabSize == a.VocabSize && (s.MoE == nil) == (a.MoE == nil) {
			return n
		}
	}
	return ""
}

// kind returns what a result measures, in Peer.Kind terms.
func (r *Result) kind() string {
	switch {
	case r.Series != "":
		return r.Series
	case len(r.Test) > 2 && r.Test[:2] == "pp":
		return "pp"
	}
	return "tg"
}

// Matches reports whether p is comparable with r measured on device (the
// device's Name: "cpu (2 threads, …)", a GPU's name) with threads: same
// shape, machine kind, compared format and kind of test (prefill of the
// same length, decode at the same depth or batch).
func (p *Peer) Matches(r *Result, device string, threads int) bool {
	if r.Shape == "" || p.Shape != r.Shape || p.Like != r.Quant || p.Kind != r.kind() {
		return false
	}
	onCPU := strings.HasPrefix(device, "cpu")
	if (p.Device == "cpu") != onCPU || (p.GPU != "" && !strings.Contains(device, p.GPU)) {
		return false
	}
	if p.Threads != 0 && p.Threads != threads {
		return false
	}
	switch p.Kind {
	case "pp":
		return p.Test == r.Test
	case "depth":
		return p.Depth == r.Depth
	case "batch":
		return p.Batch == r.Batch
	}
	return true
}
