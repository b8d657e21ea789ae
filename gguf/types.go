package gguf

import "fmt"

// Type is a ggml tensor type (enum ggml_type). The numbers are stored in
// GGUF files and never change.
type Type uint32

// The ggml tensor types. Numbers 4, 5 and 31-33, 36-38 were used by formats
// that ggml has since removed from GGUF files.
const (
	TypeF32     Type = 0
	TypeF16     Type = 1
	TypeQ4_0    Type = 2
	TypeQ4_1    Type = 3
	TypeQ5_0    Type = 6
	TypeQ5_1    Type = 7
	TypeQ8_0    Type = 8
	TypeQ8_1    Type = 9
	TypeQ2_K    Type = 10
	TypeQ3_K    Type = 11
	TypeQ4_K    Type = 12
	TypeQ5_K    Type = 13
	TypeQ6_K    Type = 14
	TypeQ8_K    Type = 15
	TypeIQ2_XXS Type = 16
	TypeIQ2_XS  Type = 17
	TypeIQ3_XXS Type = 18
	TypeIQ1_S   Type = 19
	TypeIQ4_NL  Type = 20
	TypeIQ3_S   Type = 21
	TypeIQ2_S   Type = 22
	TypeIQ4_XS  Type = 23
	TypeI8      Type = 24
	TypeI16     Type = 25
	TypeI32     Type = 26
	TypeI64     Type = 27
	TypeF64     Type = 28
	TypeIQ1_M   Type = 29
	TypeBF16    Type = 30
	TypeTQ1_0   Type = 34
	TypeTQ2_0   Type = 35
	TypeMXFP4   Type = 39
	TypeNVFP4   Type = 40
	TypeQ1_0    Type = 41
)

// qkK is the super-block length of the k-quants.
const qkK = 256

type traits struct {
	name      string
	blockSize int64 // elements per block
	typeSize  int64 // bytes per block
}

// typeTraits holds the block layout of every type whose size is known, so
// that files using types we cannot dequantize still parse and bound-check.
var typeTraits = map[Type]traits{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 2 + 16},
	TypeQ4_1:    {"Q4_1", 32, 2 + 2 + 16},
	TypeQ5_0:    {"Q5_0", 32, 2 + 4 + 16},
	TypeQ5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16},
	TypeQ8_0:    {"Q8_0", 32, 2 + 32},
	TypeQ8_1:    {"Q8_1", 32, 2 + 2 + 32},
	TypeQ2_K:    {"Q2_K", qkK, 2 + 2 + qkK/16 + qkK/4},
	TypeQ3_K:    {"Q3_K", qkK, 2 + qkK/4 + qkK/8 + 12},
	TypeQ4_K:    {"Q4_K", qkK, 2 + 2 + 12 + qkK/2},
	TypeQ5_K:    {"Q5_K", qkK, 2 + 2 + 12 + qkK/8 + qkK/2},
	TypeQ6_K:    {"Q6_K", qkK, qkK/2 + qkK/4 + qkK/16 + 2},
	TypeQ8_K:    {"Q8_K", qkK, 4 + qkK + qkK/8},
	TypeIQ2_XXS: {"IQ2_XXS", qkK, 2 + qkK/4},
	TypeIQ2_XS:  {"IQ2_XS", qkK, 2 + qkK/4 + qkK/32},
	TypeIQ3_XXS: {"IQ3_XXS", qkK, 2 + qkK/4 + qkK/8},
	TypeIQ1_S:   {"IQ1_S", qkK, 2 + qkK/8 + qkK/16},
	TypeIQ4_NL:  {"IQ4_NL", 32, 2 + 16},
	TypeIQ3_S:   {"IQ3_S", qkK, 2 + qkK/4 + qkK/8 + qkK/32 + 4},
	TypeIQ2_S:   {"IQ2_S", qkK, 2 + qkK/4 + qkK/16},
	TypeIQ4_XS:  {"IQ4_XS", qkK, 2 + 2 + qkK/2 + qkK/64},
	TypeI8:      {"I8", 1, 1},
	TypeI16:     {"I16", 1, 2},
	TypeI32:     {"I32", 1, 4},
	TypeI64:     {"I64", 1, 8},
	TypeF64:     {"F64", 1, 8},
	TypeIQ1_M:   {"IQ1_M", qkK, qkK/8 + qkK/16 + qkK/32},
	TypeBF16:    {"BF16", 1, 2},
	TypeTQ1_0:   {"TQ1_0", qkK, 2 + 4*13},
	TypeTQ2_0:   {"TQ2_0", qkK, 2 + 64},
	TypeMXFP4:   {"MXFP4", 32, 1 + 16},
	TypeNVFP4:   {"NVFP4", 64, 4 + 32},
	TypeQ1_0:    {"Q1_0", 128, 2 + 16},
}

// String returns ggml's name for the type ("Q4_K"), or "type(N)".
func (t Type) String() string {
	if tr, ok := typeTraits[t]; ok {
		return tr.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Known reports whether the type's block layout is known.
func (t Type) Known() bool { _, ok := typeTraits[t]; return ok }

// BlockSize returns the number of elements per block (1 for plain types,
// 0 if unknown).
func (t Type) BlockSize() int { return int(typeTraits[t].blockSize) }

// TypeSize returns the bytes per block (0 if unknown).
func (t Type) TypeSize() int { return int(typeTraits[t].typeSize) }

// CanDequantize reports whether Dequantize supports the type.
func (t Type) CanDequantize() bool { _, ok := dequantizers[t]; return ok }

// CanQuantize reports whether Quantize (and so Writer.AddTensor) supports
// the type.
func (t Type) CanQuantize() bool { _, ok := quantizers[t]; return ok }

// ParseType returns the type with ggml's name s ("Q4_K", case-sensitive).
func ParseType(s string) (Type, error) {
	for t, tr := range typeTraits {
		if tr.name == s {
			return t, nil
		}
	}
	return 0, fmt.Errorf("gguf: unknown ggml type %q", s)
}

// RowSize returns the bytes of n consecutive elements of type t, or an
// error when n is not a whole number of blocks.
func (t Type) RowSize(n int64) (int64, error) {
	tr, ok := typeTraits[t]
	if !ok {
		return 0, fmt.Errorf("gguf: unknown ggml type %d", uint32(t))
	}
	if n < 0 || n%tr.blockSize != 0 {
		return 0, fmt.Errorf("gguf: %d elements are not a whole number of %d-element %s blocks", n, tr.blockSize, tr.name)
	}
	return n / tr.blockSize * tr.typeSize, nil
}

// fileTypeNames names the general.file_type values written by llama.cpp
// (enum llama_ftype).
var fileTypeNames = map[uint32]string{
	0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1",
	7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K",
	11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
	14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S",
	17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS",
	20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS",
	23: "MOSTLY_IQ3_XXS", 24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL",
	26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
	29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M",
	32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0", 37: "MOSTLY_TQ2_0",
}

// FileTypeName names a general.file_type value ("MOSTLY_Q4_K_M"), or
// returns "file_type(N)" for one it does not know.
func FileTypeName(ft uint32) string {
	if n, ok := fileTypeNames[ft]; ok {
		return n
	}
	return fmt.Sprintf("file_type(%d)", ft)
}
