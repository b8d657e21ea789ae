package safetensors

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/cortiq/cortiq/half"
)

// littleEndian reports whether this machine stores float32 in the file's
// byte order, which lets F32 decode with a single copy.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// decodeF32 copies little-endian float32s from src into dst
// (len(src) == 4*len(dst)). On little-endian machines this is one memmove.
func decodeF32(dst []float32, src []byte) {
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
		return
	}
	decodeF32Ref(dst, src)
}

// decodeF32Ref is the plain, portable reference for decodeF32.
func decodeF32Ref(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// decodeF16 widens little-endian binary16 values (exactly).
func decodeF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = half.F16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
	}
}

// decodeBF16 widens little-endian bfloat16 values (exactly).
func decodeBF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits((uint32(src[2*i]) | uint32(src[2*i+1])<<8) << 16)
	}
}
