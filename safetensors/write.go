package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/cortiq/cortiq/half"
)

// WriteTensor is one tensor for Write: raw little-endian bytes of the given
// dtype and row-major shape.
type WriteTensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// Write writes a safetensors file (for tests and fixtures). Tensors are
// stored in the order given, back to back; the header is padded with spaces
// to a multiple of 8 bytes so that data stays aligned. The file is written
// under a temporary name and renamed into place.
func Write(path string, tensors []WriteTensor, metadata map[string]string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := Encode(bw, tensors, metadata); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// Encode writes a safetensors image to w; see Write.
func Encode(w io.Writer, tensors []WriteTensor, metadata map[string]string) error {
	hdr, err := header(tensors, metadata)
	if err != nil {
		return err
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	if _, err := w.Write(n[:]); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
	}
	return nil
}

// header builds the padded JSON header after validating the tensors.
func header(tensors []WriteTensor, metadata map[string]string) ([]byte, error) {
	buf := []byte{'{'}
	first := true
	sep := func() {
		if !first {
			buf = append(buf, ',')
		}
		first = false
	}
	if len(metadata) > 0 {
		sep()
		buf = append(buf, `"__metadata__":{`...)
		for i, k := range slices.Sorted(maps.Keys(metadata)) {
			if !utf8.ValidString(k) || !utf8.ValidString(metadata[k]) {
				return nil, fmt.Errorf("safetensors: metadata %q is not valid UTF-8", k)
			}
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendJSONString(buf, k)
			buf = append(buf, ':')
			buf = appendJSONString(buf, metadata[k])
		}
		buf = append(buf, '}')
	}
	seen := map[string]bool{}
	var off uint64
	for _, t := range tensors {
		switch {
		case t.Name == "" || t.Name == "__metadata__" || !utf8.ValidString(t.Name):
			return nil, fmt.Errorf("safetensors: invalid tensor name %q", t.Name)
		case seen[t.Name]:
			return nil, fmt.Errorf("safetensors: tensor %q given twice", t.Name)
		case !t.DType.Known():
			return nil, fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		seen[t.Name] = true
		elems := uint64(1)
		for _, d := range t.Shape {
			if d < 0 || (d != 0 && elems > maxElements/uint64(d)) {
				return nil, fmt.Errorf("safetensors: tensor %q: bad shape %v", t.Name, t.Shape)
			}
			elems *= uint64(d)
		}
		size, err := t.DType.byteSize(elems)
		if err != nil {
			return nil, fmt.Errorf("safetensors: tensor %q: %w", t.Name, err)
		}
		if size != uint64(len(t.Data)) {
			return nil, fmt.Errorf("safetensors: tensor %q: %s shape %v needs %d bytes, got %d", t.Name, t.DType, t.Shape, size, len(t.Data))
		}
		sep()
		buf = appendJSONString(buf, t.Name)
		buf = append(buf, `:{"dtype":"`...)
		buf = append(buf, t.DType...)
		buf = append(buf, `","shape":[`...)
		for i, d := range t.Shape {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = strconv.AppendInt(buf, int64(d), 10)
		}
		buf = append(buf, `],"data_offsets":[`...)
		buf = strconv.AppendUint(buf, off, 10)
		buf = append(buf, ',')
		off += size
		buf = strconv.AppendUint(buf, off, 10)
		buf = append(buf, "]}"...)
	}
	buf = append(buf, '}')
	for len(buf)%8 != 0 {
		buf = append(buf, ' ')
	}
	return buf, nil
}

func appendJSONString(buf []byte, s string) []byte {
	b, _ := json.Marshal(s) // marshaling a string cannot fail
	return append(buf, b...)
}

// F32Bytes encodes values as little-endian float32 (for WriteTensor.Data).
func F32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// F16Bytes rounds values to binary16 (nearest even) and encodes them.
func F16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], half.F32ToF16(x))
	}
	return b
}

// BF16Bytes rounds values to bfloat16 (nearest even) and encodes them.
func BF16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], half.F32ToBF16(x))
	}
	return b
}
