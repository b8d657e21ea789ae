package safetensors

import "fmt"

// DType is a safetensors element type, spelled as in the JSON header
// ("F32", "BF16", ...).
type DType string

// The element types of the safetensors format. Every one of them parses;
// only F32, F16 and BF16 decode to float32.
const (
	BOOL        DType = "BOOL"
	U8          DType = "U8"
	I8          DType = "I8"
	U16         DType = "U16"
	I16         DType = "I16"
	U32         DType = "U32"
	I32         DType = "I32"
	U64         DType = "U64"
	I64         DType = "I64"
	F16         DType = "F16"
	BF16        DType = "BF16"
	F32         DType = "F32"
	F64         DType = "F64"
	C64         DType = "C64"
	F8E4M3      DType = "F8_E4M3"
	F8E5M2      DType = "F8_E5M2"
	F8E4M3FNUZ  DType = "F8_E4M3FNUZ"
	F8E5M2FNUZ  DType = "F8_E5M2FNUZ"
	F8E8M0      DType = "F8_E8M0"
	F6E2M3      DType = "F6_E2M3"
	F6E3M2      DType = "F6_E3M2"
	F4          DType = "F4"
	unknownBits       = 0
)

// dtypeBits is the storage size of one element in bits.
var dtypeBits = map[DType]int{
	BOOL: 8, U8: 8, I8: 8,
	U16: 16, I16: 16, F16: 16, BF16: 16,
	U32: 32, I32: 32, F32: 32,
	U64: 64, I64: 64, F64: 64, C64: 64,
	F8E4M3: 8, F8E5M2: 8, F8E4M3FNUZ: 8, F8E5M2FNUZ: 8, F8E8M0: 8,
	F6E2M3: 6, F6E3M2: 6,
	F4: 4,
}

// Bits returns the storage size of one element in bits (0 if unknown).
// Sub-byte types (F4, F6_*) are packed; a tensor's total size must still be
// a whole number of bytes.
func (d DType) Bits() int { return dtypeBits[d] }

// Known reports whether d is a dtype this package can lay out.
func (d DType) Known() bool { return dtypeBits[d] != unknownBits }

// Decodable reports whether tensors of this dtype decode to float32.
func (d DType) Decodable() bool { return d == F32 || d == F16 || d == BF16 }

// byteSize returns the byte size of n elements, or an error when the bits
// do not fill whole bytes. n must be small enough that n*64 fits in uint64.
func (d DType) byteSize(n uint64) (uint64, error) {
	bits := n * uint64(d.Bits())
	if bits%8 != 0 {
		return 0, fmt.Errorf("%d elements of %d-bit %s are not a whole number of bytes", n, d.Bits(), d)
	}
	return bits / 8, nil
}
