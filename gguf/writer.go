package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Writer builds a GGUF file in memory (for tests and fixtures): metadata of
// every value type and tensors, then writes it in one go. Tensors are laid
// out in the order added, each at an offset that is a multiple of the
// alignment (general.alignment if added, else 32), as llama.cpp does.
type Writer struct {
	// Version is the GGUF version written: 3 (the default when zero) or 2,
	// which has the same layout.
	Version uint32

	kvs     []KV
	keys    map[string]bool
	tensors []writerTensor
	names   map[string]bool
}

type writerTensor struct {
	name string
	typ  Type
	dims []int64 // ggml order
	data []byte
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{keys: map[string]bool{}, names: map[string]bool{}}
}

// AddKV appends a metadata entry; keys must be unique.
func (w *Writer) AddKV(key string, v Value) error {
	if w.keys[key] {
		return fmt.Errorf("gguf: metadata key %q added twice", key)
	}
	if err := checkValue(v, 0); err != nil {
		return fmt.Errorf("gguf: metadata %q: %w", key, err)
	}
	if key == KeyAlignment {
		if _, err := alignmentOf(v); err != nil {
			return err
		}
	}
	w.keys[key] = true
	w.kvs = append(w.kvs, KV{key, v})
	return nil
}

func checkValue(v Value, depth int) error {
	if v.v == nil || !v.typ.valid() {
		return errors.New("invalid Value (use the constructors)")
	}
	if a, ok := v.v.([]Value); ok {
		if depth+1 >= maxArrayDepth {
			return fmt.Errorf("arrays nest more than %d levels", maxArrayDepth)
		}
		for _, e := range a {
			if e.typ != ValueArray {
				return errors.New("array of arrays holds a non-array")
			}
			if err := checkValue(e, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

func alignmentOf(v Value) (int64, error) {
	a, ok := v.Uint()
	if !ok || a == 0 || a&(a-1) != 0 || a > maxAlignment {
		return 0, fmt.Errorf("gguf: %s must be a power-of-two integer up to 2^30", KeyAlignment)
	}
	return int64(a), nil
}

// AddTensor quantizes row-major values of the given shape (PyTorch order,
// see TensorInfo.Shape) to type t and appends the tensor.
func (w *Writer) AddTensor(name string, t Type, shape []int, values []float32) error {
	dims, n, err := w.checkTensor(name, t, shape)
	if err != nil {
		return err
	}
	if int64(len(values)) != n {
		return fmt.Errorf("gguf: tensor %q: shape %v has %d elements, got %d values", name, shape, n, len(values))
	}
	data, err := Quantize(t, values)
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, writerTensor{name, t, dims, data})
	return nil
}

// AddRaw appends a tensor whose data is already encoded as type t (for
// hand-built blocks and types without a quantizer).
func (w *Writer) AddRaw(name string, t Type, shape []int, data []byte) error {
	dims, n, err := w.checkTensor(name, t, shape)
	if err != nil {
		return err
	}
	size, _ := t.RowSize(n)
	if int64(len(data)) != size {
		return fmt.Errorf("gguf: tensor %q: %s shape %v needs %d bytes, got %d", name, t, shape, size, len(data))
	}
	w.names[name] = true
	w.tensors = append(w.tensors, writerTensor{name, t, dims, append([]byte(nil), data...)})
	return nil
}

func (w *Writer) checkTensor(name string, t Type, shape []int) ([]int64, int64, error) {
	switch {
	case w.names[name]:
		return nil, 0, fmt.Errorf("gguf: tensor %q added twice", name)
	case !t.Known():
		return nil, 0, fmt.Errorf("gguf: tensor %q: unknown type %d", name, uint32(t))
	case len(shape) > maxDims:
		return nil, 0, fmt.Errorf("gguf: tensor %q: %d dimensions, at most %d", name, len(shape), maxDims)
	}
	dims := make([]int64, len(shape))
	n := int64(1)
	for i, d := range shape {
		if d < 0 || (d != 0 && n > maxElements/int64(d)) {
			return nil, 0, fmt.Errorf("gguf: tensor %q: bad shape %v", name, shape)
		}
		n *= int64(d)
		dims[len(shape)-1-i] = int64(d)
	}
	row := int64(1)
	if len(dims) > 0 {
		row = dims[0]
	}
	if row%int64(t.BlockSize()) != 0 {
		return nil, 0, fmt.Errorf("gguf: tensor %q: row length %d is not a multiple of the %s block size %d", name, row, t, t.BlockSize())
	}
	return dims, n, nil
}

type countWriter struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (c *countWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *countWriter) u32(v uint32) { c.write(binary.LittleEndian.AppendUint32(nil, v)) }
func (c *countWriter) u64(v uint64) { c.write(binary.LittleEndian.AppendUint64(nil, v)) }
func (c *countWriter) str(s string) {
	c.u64(uint64(len(s)))
	c.write([]byte(s))
}

func (c *countWriter) pad(align int64) {
	if r := c.n % align; r != 0 {
		c.write(make([]byte, align-r))
	}
}

// WriteTo writes the file to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	version := w.Version
	if version == 0 {
		version = 3
	}
	if version != 2 && version != 3 {
		return 0, fmt.Errorf("gguf: cannot write version %d", version)
	}
	align := int64(DefaultAlignment)
	for _, kv := range w.kvs {
		if kv.Key == KeyAlignment {
			align, _ = alignmentOf(kv.Value)
		}
	}
	c := &countWriter{w: bufio.NewWriterSize(out, 1<<20)}
	c.write([]byte(Magic))
	c.u32(version)
	c.u64(uint64(len(w.tensors)))
	c.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		c.str(kv.Key)
		c.u32(uint32(kv.Value.typ))
		writeValue(c, kv.Value)
	}
	off := int64(0)
	for _, t := range w.tensors {
		c.str(t.name)
		c.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			c.u64(uint64(d))
		}
		c.u32(uint32(t.typ))
		c.u64(uint64(off))
		off += (int64(len(t.data)) + align - 1) / align * align
	}
	if len(w.tensors) > 0 {
		c.pad(align)
	}
	for _, t := range w.tensors { // the data section starts aligned
		c.write(t.data)
		c.pad(align)
	}
	if c.err == nil {
		c.err = c.w.Flush()
	}
	if c.err != nil {
		return c.n, fmt.Errorf("gguf: %w", c.err)
	}
	return c.n, nil
}

func writeValue(c *countWriter, v Value) {
	le := binary.LittleEndian
	switch x := v.v.(type) {
	case uint8:
		c.write([]byte{x})
	case int8:
		c.write([]byte{byte(x)})
	case uint16:
		c.write(le.AppendUint16(nil, x))
	case int16:
		c.write(le.AppendUint16(nil, uint16(x)))
	case uint32:
		c.u32(x)
	case int32:
		c.u32(uint32(x))
	case float32:
		c.u32(math.Float32bits(x))
	case bool:
		b := byte(0)
		if x {
			b = 1
		}
		c.write([]byte{b})
	case string:
		c.str(x)
	case uint64:
		c.u64(x)
	case int64:
		c.u64(uint64(x))
	case float64:
		c.u64(math.Float64bits(x))
	default: // arrays: element type, count, elements (nested arrays the same way)
		c.u32(uint32(v.elem))
		n := v.Len()
		c.u64(uint64(n))
		if u, ok := v.v.([]uint8); ok {
			c.write(u)
			return
		}
		for i := range n {
			writeValue(c, v.index(i))
		}
	}
}

// WriteFile writes the file to path, through a temporary file renamed into
// place.
func (w *Writer) WriteFile(path string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := w.WriteTo(tmp); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	return nil
}
