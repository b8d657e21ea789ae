package quant

import (
	"fmt"
	"math"
)

// Activation statistics for calibrated (activation-aware) encoding.
//
// A linear layer y = W·x quantized to Ŵ makes the output error
// (W−Ŵ)·x. Over calibration inputs with per-column mean squares m[i] and
// errors that are independent across columns, its expected square per row
// is Σ_i m[i]·(W[o,i]−Ŵ[o,i])²: the weight error weighted by how strongly
// each input column is driven. The encoders that take
// EncodeOptions.ColStats (the per-column RMS √m) minimise that weighted
// error instead of the plain one.

// ColumnStats accumulates the per-column sum of squares of a linear layer's
// inputs. The zero value is not usable; use NewColumnStats.
type ColumnStats struct {
	sumSq []float64
	n     int
}

// NewColumnStats returns an empty accumulator for inputs of cols columns.
func NewColumnStats(cols int) *ColumnStats {
	return &ColumnStats{sumSq: make([]float64, cols)}
}

// Cols returns the number of input columns.
func (s *ColumnStats) Cols() int { return len(s.sumSq) }

// Rows returns the number of input rows (tokens) seen.
func (s *ColumnStats) Rows() int { return s.n }

// Add accumulates rows input rows, row-major in x (rows·Cols values).
// Non-finite values are an error and leave the statistics unchanged.
func (s *ColumnStats) Add(x []float32, rows int) error {
	cols := len(s.sumSq)
	if rows < 0 || len(x) != rows*cols {
		return fmt.Errorf("quant: column statistics: %d values for %d rows of %d columns", len(x), rows, cols)
	}
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: column statistics: non-finite activation %v at row %d, column %d", v, i/cols, i%cols)
		}
	}
	for r := range rows {
		for i, v := range x[r*cols : (r+1)*cols] {
			s.sumSq[i] += float64(v) * float64(v)
		}
	}
	s.n += rows
	return nil
}

// Merge adds the statistics of o (same number of columns) to s.
func (s *ColumnStats) Merge(o *ColumnStats) error {
	if len(o.sumSq) != len(s.sumSq) {
		return fmt.Errorf("quant: column statistics: merging %d columns into %d", len(o.sumSq), len(s.sumSq))
	}
	for i, v := range o.sumSq {
		s.sumSq[i] += v
	}
	s.n += o.n
	return nil
}

// RMS returns each column's root mean square over the rows seen (zeros
// before any row), the statistic EncodeOptions.ColStats takes.
func (s *ColumnStats) RMS() []float32 {
	out := make([]float32, len(s.sumSq))
	if s.n == 0 {
		return out
	}
	for i, v := range s.sumSq {
		out[i] = float32(math.Sqrt(v / float64(s.n)))
	}
	return out
}

// StatWeights turns per-column RMS statistics into the weights of the
// squared weight error: the mean squares, floored at 1e-4 of their mean (so
// a column that was silent during calibration still counts a little) and
// scaled to a mean of 1. nil (or all-zero) statistics give nil: the plain
// error.
func StatWeights(stats []float32) []float32 {
	if stats == nil {
		return nil
	}
	var mean float64
	for _, s := range stats {
		mean += float64(s) * float64(s)
	}
	mean /= float64(len(stats))
	if !(mean > 0) || math.IsInf(mean, 0) {
		return nil
	}
	floor := 1e-4 * mean
	var sum float64
	out := make([]float32, len(stats))
	for i, s := range stats {
		v := max(float64(s)*float64(s), floor)
		out[i] = float32(v / mean)
		sum += v / mean
	}
	k := float32(float64(len(stats)) / sum)
	for i := range out {
		out[i] *= k
	}
	return out
}

// checkStats validates EncodeOptions.ColStats for a cols-column tensor.
func checkStats(d DType, stats []float32, cols int) error {
	if stats == nil {
		return nil
	}
	if len(stats) != cols {
		return fmt.Errorf("quant: %s: %d column statistics for %d columns", d, len(stats), cols)
	}
	for i, s := range stats {
		if !(s >= 0) || math.IsInf(float64(s), 0) {
			return fmt.Errorf("quant: %s: column statistic %v at column %d is not finite and non-negative", d, s, i)
		}
	}
	return nil
}
