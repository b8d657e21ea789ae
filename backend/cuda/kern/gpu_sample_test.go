package kern_test

import (
	"encoding/binary"
	"errors"
	"math"
	"sort"
	"testing"

	"github.com/cortiq/cortiq/backend/cuda/driver"
)

func errorsJoin(errs ...error) error { return errors.Join(errs...) }

func refArgmax(x []float32) int {
	best, bi := float32(math.Inf(-1)), -1
	for i, v := range x {
		if v > best || bi < 0 && !math.IsNaN(float64(v)) {
			best, bi = v, i
		}
	}
	return max(bi, 0)
}

func TestGPUArgmax(t *testing.T) {
	g := newGPU(t)
	r := rng(10)
	for _, n := range []int{1, 1000, 151936} {
		const R = 4
		x := r.vec(R*n, 1)
		// row 1: a tie at the maximum; row 2: NaNs around the maximum.
		if n > 10 {
			x[n+3], x[n+n-2] = 50, 50
			x[2*n+1] = float32(math.NaN())
			x[2*n+5] = 60
			x[2*n+6] = float32(math.NaN())
		}
		dn := g.zeros(R)
		var a driver.Args
		a.Ptr(g.f32(x)).Int(n).Int(n).Ptr(dn)
		g.launch("argmax", driver.D1(R), driver.D1(1024), 0, &a)
		got := g.readI32(dn, R)
		for ri := range R {
			if want := refArgmax(x[ri*n : (ri+1)*n]); int(got[ri]) != want {
				t.Fatalf("argmax n=%d row %d = %d, want %d", n, ri, got[ri], want)
			}
		}
	}
}

// sampleState packs the kernel's 32-byte per-row state.
func sampleState(temp float32, topK int, topP float32, seed, counter uint64) []byte {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint32(b[0:], math.Float32bits(temp))
	binary.LittleEndian.PutUint32(b[4:], uint32(int32(topK)))
	binary.LittleEndian.PutUint32(b[8:], math.Float32bits(topP))
	binary.LittleEndian.PutUint64(b[16:], seed)
	binary.LittleEndian.PutUint64(b[24:], counter)
	return b
}

// drawUniform is the Go twin of sample.cu's draw.
func drawUniform(seed, counter uint64) float32 {
	z := seed + (counter+1)*0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	z ^= z >> 31
	return float32(z>>40) * (1.0 / 16777216)
}

// runSampler samples R rows sharing one logit vector, row i with state
// states[i]; it returns the tokens and the states after the call.
func runSampler(g *gpu, logits []float32, states [][]byte) ([]int32, []byte) {
	n, R := len(logits), len(states)
	all := make([]float32, 0, R*n)
	for range R {
		all = append(all, logits...)
	}
	var st []byte
	for _, s := range states {
		st = append(st, s...)
	}
	dst := g.upload(st)
	dn := g.zeros(R)
	var a driver.Args
	a.Ptr(g.f32(all)).Int(n).Int(n).Ptr(dst).Ptr(dn)
	g.launch("sample", driver.D1(R), driver.D1(1024), 0, &a)
	return g.readI32(dn, R), g.readBytes(dst, 32*R)
}

// Equal logits make every weight exactly 1, so the draw picks
// floor(u·n): this pins the device RNG, the counter and the walk.
func TestGPUSamplerRNG(t *testing.T) {
	g := newGPU(t)
	for _, n := range []int{10, 1000, 5000} {
		logits := make([]float32, n)
		var states [][]byte
		for i := range 64 {
			states = append(states, sampleState(0.7, 0, 1, uint64(i)*977+1, uint64(i%5)))
		}
		got, after := runSampler(g, logits, states)
		for i := range states {
			seed, ctr := uint64(i)*977+1, uint64(i%5)
			want := int(float32(drawUniform(seed, ctr)) * float32(n))
			if int(got[i]) != want {
				t.Fatalf("n=%d row %d: token %d, want floor(u·n) = %d", n, i, got[i], want)
			}
			if c := binary.LittleEndian.Uint64(after[32*i+24:]); c != ctr+1 {
				t.Fatalf("counter %d after a draw, want %d", c, ctr+1)
			}
		}
	}
}

func TestGPUSamplerGreedyAndFilters(t *testing.T) {
	g := newGPU(t)
	r := rng(11)
	const n = 3000
	logits := r.vec(n, 2)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
	top := order[0]
	// Greedy: temperature 0 and top_k 1.
	got, _ := runSampler(g, logits, [][]byte{sampleState(0, 0, 1, 1, 0), sampleState(1, 1, 1, 2, 0)})
	for i, v := range got {
		if int(v) != top {
			t.Fatalf("greedy row %d: %d, want argmax %d", i, v, top)
		}
	}
	// top-k: every draw among the k largest.
	const k = 7
	inTopK := map[int]bool{}
	for _, i := range order[:k] {
		inTopK[i] = true
	}
	var states [][]byte
	for i := range 512 {
		states = append(states, sampleState(1.5, k, 1, uint64(i)+100, 0))
	}
	got, _ = runSampler(g, logits, states)
	seen := map[int32]bool{}
	for _, v := range got {
		if !inTopK[int(v)] {
			t.Fatalf("top-k %d drew token %d outside the top k", k, v)
		}
		seen[v] = true
	}
	if len(seen) < k-2 {
		t.Fatalf("top-k %d at temperature 1.5 drew only %d distinct tokens in 512", k, len(seen))
	}
	// top-p: every draw in the nucleus (computed in float64), and the
	// nucleus boundary chosen where the mass is not ambiguous.
	const temp = 0.8
	p := make([]float64, n)
	var z float64
	for i, v := range logits {
		p[i] = math.Exp(float64(v-logits[top]) / temp)
		z += p[i]
	}
	var cum float64
	nucleus := map[int]bool{}
	var topP float32
	for j, i := range order {
		cum += p[i] / z
		nucleus[i] = true
		if cum > 0.5 && j > 3 {
			topP = float32(cum - 0.25*p[i]/z) // strictly inside this token's share
			break
		}
	}
	states = states[:0]
	for i := range 512 {
		states = append(states, sampleState(temp, 0, topP, uint64(i)+7000, 3))
	}
	got, _ = runSampler(g, logits, states)
	for _, v := range got {
		if !nucleus[int(v)] {
			t.Fatalf("top-p %g drew token %d outside the nucleus of %d tokens", topP, v, len(nucleus))
		}
	}
}

// The empirical distribution over 8 tokens matches softmax(l/T) within 5
// standard deviations per token.
func TestGPUSamplerDistribution(t *testing.T) {
	g := newGPU(t)
	logits := []float32{1, 2, 0.5, -1, 3, 2.5, 0, -3}
	const temp, draws = 1.3, 8192
	var states [][]byte
	for i := range draws {
		states = append(states, sampleState(temp, 0, 1, 0xC0FFEE+uint64(i)*31, uint64(i)))
	}
	got, _ := runSampler(g, logits, states)
	count := make([]int, len(logits))
	for _, v := range got {
		count[v]++
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v) / temp)
	}
	for i, v := range logits {
		pi := math.Exp(float64(v)/temp) / z
		mean, sd := draws*pi, math.Sqrt(draws*pi*(1-pi))
		if math.Abs(float64(count[i])-mean) > 5*sd+1 {
			t.Fatalf("token %d drawn %d times in %d, expected %.0f ± %.0f", i, count[i], draws, mean, sd)
		}
	}
}
