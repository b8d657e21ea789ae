package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/quant"
)

func init() { commands = append(commands, newInspect) }

func newInspect() *cobra.Command {
	var asJSON, noVerify bool
	var path string
	c := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Show a CMF file's header, architecture, tensors and sections (--json: snake_case keys throughout)",
		Args:  modelArgs(&path, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, _ := splitModel(path, args)
			m, err := openCMF(p, noVerify)
			if err != nil {
				return err
			}
			defer m.Close()
			r := inspectReport(m)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			printInspect(cmd.OutOrStdout(), r)
			return nil
		},
	}
	addModelFlag(c, &path)
	c.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	addNoVerify(c, &noVerify)
	return c
}

type tensorRow struct {
	Name          string  `json:"name"`
	DType         string  `json:"dtype"`
	Shape         []int   `json:"shape"`
	Bytes         int64   `json:"bytes"`
	BitsPerWeight float64 `json:"bits_per_weight"`
	Shard         int     `json:"shard"`
	Offset        int64   `json:"offset"`
}

// sectionRow is cmf.SectionInfo with the report's key style.
type sectionRow struct {
	Name   string `json:"name"`
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	Hash   string `json:"hash"`
}

type dtypeTotal struct {
	DType   string `json:"dtype"`
	Tensors int    `json:"tensors"`
	Params  int64  `json:"params"`
	Bytes   int64  `json:"bytes"`
}

type report struct {
	Path     string       `json:"path"`
	Header   cmf.Header   `json:"header"`
	Sections []sectionRow `json:"sections"`
	Tensors  []tensorRow  `json:"tensors"`
	Totals   []dtypeTotal `json:"totals"`
	Params   int64        `json:"params"`
	Bytes    int64        `json:"bytes"`
	BPW      float64      `json:"bits_per_weight"`
}

func inspectReport(m *cmf.Model) report {
	r := report{Path: m.Path, Header: m.Header}
	for _, s := range m.Sections() {
		r.Sections = append(r.Sections, sectionRow{s.Name, s.File, s.Offset, s.Size, s.Hash})
	}
	tot := map[string]*dtypeTotal{}
	var wParams, wBytes int64
	for _, t := range m.Tensors {
		rows, cols, _ := quant.Matrix(t.Shape)
		n := int64(rows) * int64(cols)
		bpw := 0.0
		if n > 0 {
			bpw = float64(t.Size) * 8 / float64(n)
		}
		r.Tensors = append(r.Tensors, tensorRow{t.Name, t.DType.String(), t.Shape, t.Size, bpw, t.Shard, t.Offset})
		d := t.DType.String()
		if tot[d] == nil {
			tot[d] = &dtypeTotal{DType: d}
		}
		tot[d].Tensors++
		tot[d].Params += n
		tot[d].Bytes += t.Size
		r.Bytes += t.Size
		if t.DType != quant.U8 && t.DType != quant.I32 {
			r.Params += n
			wParams += n
			wBytes += t.Size
		}
	}
	for _, v := range tot {
		r.Totals = append(r.Totals, *v)
	}
	sort.Slice(r.Totals, func(i, j int) bool { return r.Totals[i].Bytes > r.Totals[j].Bytes })
	if wParams > 0 {
		r.BPW = float64(wBytes) * 8 / float64(wParams)
	}
	return r
}

func printInspect(w io.Writer, r report) {
	h := r.Header
	a := h.Arch
	fmt.Fprintf(w, "file:        %s\n", r.Path)
	fmt.Fprintf(w, "format:      cmf v%d, default quant %s\n", h.Version, h.QuantType)
	fmt.Fprintf(w, "arch:        %s: hidden %d, layers %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d\n",
		a.ArchName, a.HiddenSize, a.NumLayers, a.NumAttentionHeads, a.NumKVHeads, a.HeadDim, a.IntermediateSize, a.VocabSize)
	fmt.Fprintf(w, "             rope θ %g", a.RopeTheta)
	if a.RopeScaling != nil {
		fmt.Fprintf(w, " (%s ×%g)", a.RopeScaling.Type, a.RopeScaling.Factor)
	}
	fmt.Fprintf(w, ", partial %g, norm %s eps %g, tied %v, max pos %d\n", a.PartialRotaryFactor, a.NormStyle, a.RMSNormEps, a.TieWordEmbeddings, a.MaxPositionEmbeddings)
	if m := a.MoE; m != nil {
		fmt.Fprintf(w, "moe:         %d experts, top-%d, width %d, shared %d, norm_topk %v\n", m.NumExperts, m.NumExpertsPerTok, m.MoEIntermediateSize, m.SharedExpertIntermediateSize, m.NormTopKProb)
	}
	if l := a.LinearCore; l != nil {
		fmt.Fprintf(w, "linear:      %s (%s), k heads %d × %d, v heads %d × %d, conv %d\n", l.Kind, l.Projection, a.LinearNumKeyHeads, a.LinearKeyHeadDim, a.LinearNumValueHeads, a.LinearValueHeadDim, a.LinearConvKernelDim)
	}
	if a.MTP != nil {
		fmt.Fprintf(w, "mtp:         %d layer(s)\n", a.MTP.NumLayers)
	}
	if p := h.Provenance; p != nil {
		fmt.Fprintf(w, "provenance:  %s from %s by %s %s at %s (%d inputs)\n", p.SourceFormat, p.Source, p.Converter, p.ConverterVersion, p.CreatedAt.Format("2006-01-02 15:04:05Z07:00"), len(p.Inputs))
	}
	if t := h.TokenizerConfig; t != nil {
		fmt.Fprintf(w, "tokenizer:   %s in %q, eos %v, chat template %d bytes\n", t.Kind, t.Blob, t.EOSTokenIDs, len(t.ChatTemplate))
	}
	if s := h.Shard; s != nil {
		fmt.Fprintf(w, "shard:       %d of %d (set %s)\n", s.Index+1, s.Count, s.SetID)
	}
	for _, s := range h.Skills {
		fmt.Fprintf(w, "skill:       %s (%s)\n", s.Name, s.Kind)
	}
	if c := h.Calibration; c != nil {
		fmt.Fprintf(w, "calibration: %s over %d tokens of %q, %d tensors\n", c.Method, c.Tokens, c.Dataset, len(c.Tensors))
	}
	fmt.Fprintln(w, "\nsections:")
	for _, s := range r.Sections {
		fmt.Fprintf(w, "  %-10s %12d bytes at %-12d xxh3 %s  %s\n", s.Name, s.Size, s.Offset, s.Hash, s.File)
	}
	fmt.Fprintln(w, "\ntensors:")
	nw := 4
	for _, t := range r.Tensors {
		nw = max(nw, len(t.Name))
	}
	for _, t := range r.Tensors {
		fmt.Fprintf(w, "  %-*s  %-7s %-18s %12d B  %6.3f bpw\n", nw, t.Name, t.DType, shapeString(t.Shape), t.Bytes, t.BitsPerWeight)
	}
	fmt.Fprintln(w, "\ntotals:")
	for _, d := range r.Totals {
		fmt.Fprintf(w, "  %-7s %6d tensors %14d params %14d bytes\n", d.DType, d.Tensors, d.Params, d.Bytes)
	}
	fmt.Fprintf(w, "  all     %6d tensors %14d params %14d bytes (%.2f GB), %.3f bits/weight\n", len(r.Tensors), r.Params, r.Bytes, float64(r.Bytes)/1e9, r.BPW)
}

func shapeString(s []int) string {
	p := make([]string, len(s))
	for i, d := range s {
		p[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(p, ", ") + "]"
}
