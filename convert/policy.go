package convert

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/cortiq/cortiq/cmf"
	"github.com/cortiq/cortiq/quant"
)

// Rule maps tensor names matching Pattern to a format.
type Rule struct {
	Pattern *regexp.Regexp
	DType   quant.DType
	Reason  string
}

// ParseKeep parses a --keep flag value "NAME_REGEX=dtype".
func ParseKeep(s string) (Rule, error) {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 {
		return Rule{}, fmt.Errorf("--keep %q: want NAME_REGEX=dtype", s)
	}
	re, err := regexp.Compile(s[:i])
	if err != nil {
		return Rule{}, fmt.Errorf("--keep %q: %w", s, err)
	}
	d, err := quant.ParseDType(s[i+1:])
	if err != nil {
		return Rule{}, fmt.Errorf("--keep %q: %w", s, err)
	}
	if d == quant.U8 || d == quant.I32 {
		return Rule{}, fmt.Errorf("--keep %q: %s cannot hold weights", s, d)
	}
	return Rule{re, d, "--keep"}, nil
}

// Policy chooses a storage format per tensor role. The order of checks is
// the policy: user rules first, then built-in roles, then the default.
type Policy struct {
	Default quant.DType
	Keep    []Rule
}

var (
	reVectorish = regexp.MustCompile(`(conv1d\.weight|\.A_log|\.dt_bias)$`)
	reRouter    = regexp.MustCompile(`(mlp\.gate\.weight|shared_expert_gate\.weight)$`)
	reHead      = regexp.MustCompile(`^lm_head\.weight$`)
)

// Choose returns the format for a tensor and why. tiedEmbed says the tensor
// is the token embedding that also serves as the output head.
func (p *Policy) Choose(name string, shape []int, tiedEmbed bool) (quant.DType, string) {
	d, why, _ := p.choose(name, shape, tiedEmbed)
	return d, why
}

// Fallback is a tensor stored in another format than the one asked for
// (--quant or a --keep rule) because that format cannot hold its shape.
type Fallback struct {
	Tensor        string
	Shape         []int
	Asked, Stored quant.DType
	Reason        string // why Asked cannot hold the shape
}

// choose is Choose, also returning the fallback when the format asked for
// could not be used.
func (p *Policy) choose(name string, shape []int, tiedEmbed bool) (quant.DType, string, *Fallback) {
	var fb *Fallback
	for _, r := range p.Keep {
		if r.Pattern.MatchString(name) {
			_, err := quant.ExpectedBytes(r.DType, shape)
			if err == nil {
				return r.DType, "--keep " + r.Pattern.String(), nil
			}
			fb = &Fallback{Tensor: name, Shape: shape, Asked: r.DType, Reason: shapeReason(err)}
			break
		}
	}
	d, why, dfb := p.builtin(name, shape, tiedEmbed)
	if fb == nil {
		fb = dfb
	}
	if fb != nil {
		fb.Stored = d
	}
	return d, why, fb
}

// builtin is the policy without --keep rules.
func (p *Policy) builtin(name string, shape []int, tiedEmbed bool) (quant.DType, string, *Fallback) {
	if len(shape) < 2 {
		return quant.F32, "vectors (norms, biases, decay and gate parameters) stay f32", nil
	}
	if reVectorish.MatchString(name) {
		return quant.F32, "conv and decay parameters stay f32", nil
	}
	if reRouter.MatchString(name) {
		return quant.F32, "router and shared-expert gate stay f32: they pick experts and are tiny", nil
	}
	d := p.Default
	if !d.Quantized() {
		return d, "default", nil
	}
	if d == quant.Q4TP && (reHead.MatchString(name) || tiedEmbed) {
		return quant.Q8Row, "the output head is the most error-sensitive matvec: q8_row under a 4-bit default", nil
	}
	if _, err := quant.ExpectedBytes(d, shape); err != nil {
		return quant.Q8Row, fmt.Sprintf("%s cannot hold %v: q8_row instead", d, shape),
			&Fallback{Tensor: name, Shape: shape, Asked: d, Reason: shapeReason(err)}
	}
	return d, "default", nil
}

// shapeReason turns quant's "shape not supported" error into the reason
// alone: "q4tp needs a matrix with a multiple of 32 columns".
func shapeReason(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	if i := strings.Index(s, ", got "); i >= 0 {
		s = s[:i]
	}
	return s
}

// Record describes the policy for the CMF header.
func (p *Policy) Record() *cmf.QuantPolicy {
	qp := &cmf.QuantPolicy{Default: p.Default.String()}
	for _, r := range p.Keep {
		qp.Rules = append(qp.Rules, cmf.PolicyRule{Pattern: r.Pattern.String(), DType: r.DType.String(), Reason: r.Reason})
	}
	qp.Rules = append(qp.Rules,
		cmf.PolicyRule{Pattern: `<1-D tensors>`, DType: "f32", Reason: "vectors (norms, biases, decay and gate parameters) stay f32"},
		cmf.PolicyRule{Pattern: reVectorish.String(), DType: "f32", Reason: "conv and decay parameters stay f32"},
		cmf.PolicyRule{Pattern: reRouter.String(), DType: "f32", Reason: "router and shared-expert gate stay f32"},
	)
	if p.Default == quant.Q4TP {
		qp.Rules = append(qp.Rules, cmf.PolicyRule{Pattern: `^lm_head\.weight$ | tied model.embed_tokens.weight`, DType: "q8_row", Reason: "output head is error-sensitive"})
	}
	if p.Default.Quantized() {
		qp.Rules = append(qp.Rules, cmf.PolicyRule{Pattern: `<shapes the default cannot hold>`, DType: "q8_row", Reason: "fallback"})
	}
	qp.Rules = append(qp.Rules, cmf.PolicyRule{Pattern: `.*`, DType: p.Default.String(), Reason: "default"})
	return qp
}
