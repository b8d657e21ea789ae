package convert

import (
	"encoding/binary"
	"math"
)

func f32frombits(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
