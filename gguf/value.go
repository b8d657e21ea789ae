package gguf

import (
	"fmt"
	"math"
	"slices"
)

// ValueType is the type tag of a metadata value (enum gguf_type).
type ValueType uint32

// The metadata value types.
const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

// valueSizes is the encoded size of each fixed-size type (0 for string and
// array).
var valueSizes = [...]int{1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("value_type(%d)", uint32(t))
}

func (t ValueType) valid() bool { return int(t) < len(valueTypeNames) }

// minSize is the fewest bytes one encoded value of type t can take.
func (t ValueType) minSize() int {
	switch t {
	case ValueString:
		return 8 // length
	case ValueArray:
		return 4 + 8 // element type, count
	}
	return valueSizes[t]
}

// Value is one metadata value. Scalars are held as their Go type; arrays as
// a typed slice ([]uint8 ... []float64, []bool, []string), or []Value for
// arrays of arrays. The getters convert where no information is lost and
// report false otherwise.
type Value struct {
	typ  ValueType
	elem ValueType // for arrays
	v    any
}

// Type returns the value's type tag.
func (v Value) Type() ValueType { return v.typ }

// ElemType returns an array's element type tag.
func (v Value) ElemType() ValueType { return v.elem }

// Len returns an array's length (0 for scalars).
func (v Value) Len() int {
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	case []Value:
		return len(a)
	}
	return 0
}

// Any returns the value as a Go value: a scalar of the matching Go type, or
// a copy of the array as a typed slice ([]Value for arrays of arrays).
func (v Value) Any() any {
	switch a := v.v.(type) {
	case []uint8:
		return slices.Clone(a)
	case []int8:
		return slices.Clone(a)
	case []uint16:
		return slices.Clone(a)
	case []int16:
		return slices.Clone(a)
	case []uint32:
		return slices.Clone(a)
	case []int32:
		return slices.Clone(a)
	case []float32:
		return slices.Clone(a)
	case []bool:
		return slices.Clone(a)
	case []string:
		return slices.Clone(a)
	case []uint64:
		return slices.Clone(a)
	case []int64:
		return slices.Clone(a)
	case []float64:
		return slices.Clone(a)
	case []Value:
		return slices.Clone(a)
	}
	return v.v
}

// String returns a string value.
func (v Value) String() (string, bool) {
	s, ok := v.v.(string)
	return s, ok
}

// Bool returns a bool value.
func (v Value) Bool() (bool, bool) {
	b, ok := v.v.(bool)
	return b, ok
}

// scalarInt returns any integer scalar widened to int64 or uint64.
func scalarInt(x any) (i int64, u uint64, signed, ok bool) {
	switch n := x.(type) {
	case uint8:
		return 0, uint64(n), false, true
	case uint16:
		return 0, uint64(n), false, true
	case uint32:
		return 0, uint64(n), false, true
	case uint64:
		return 0, n, false, true
	case int8:
		return int64(n), 0, true, true
	case int16:
		return int64(n), 0, true, true
	case int32:
		return int64(n), 0, true, true
	case int64:
		return n, 0, true, true
	}
	return 0, 0, false, false
}

// Uint returns an integer value of any width that is not negative.
func (v Value) Uint() (uint64, bool) {
	i, u, signed, ok := scalarInt(v.v)
	switch {
	case !ok:
		return 0, false
	case signed:
		return uint64(i), i >= 0
	}
	return u, true
}

// Int returns an integer value of any width that fits an int64.
func (v Value) Int() (int64, bool) {
	i, u, signed, ok := scalarInt(v.v)
	switch {
	case !ok:
		return 0, false
	case signed:
		return i, true
	}
	return int64(u), u <= math.MaxInt64
}

// Float returns a float32 or float64 value, or an integer one converted.
func (v Value) Float() (float64, bool) {
	switch f := v.v.(type) {
	case float32:
		return float64(f), true
	case float64:
		return f, true
	}
	if i, ok := v.Int(); ok {
		return float64(i), true
	}
	if u, ok := v.Uint(); ok {
		return float64(u), true
	}
	return 0, false
}

// Strings returns a copy of a string array.
func (v Value) Strings() ([]string, bool) {
	a, ok := v.v.([]string)
	return slices.Clone(a), ok
}

// Bools returns a copy of a bool array.
func (v Value) Bools() ([]bool, bool) {
	a, ok := v.v.([]bool)
	return slices.Clone(a), ok
}

// Array returns the elements of any array as Values.
func (v Value) Array() ([]Value, bool) {
	if v.typ != ValueArray {
		return nil, false
	}
	if a, ok := v.v.([]Value); ok {
		return slices.Clone(a), true
	}
	out := make([]Value, v.Len())
	for i := range out {
		out[i] = v.index(i)
	}
	return out, true
}

// index returns element i of a scalar array as a Value.
func (v Value) index(i int) Value {
	var x any
	switch a := v.v.(type) {
	case []uint8:
		x = a[i]
	case []int8:
		x = a[i]
	case []uint16:
		x = a[i]
	case []int16:
		x = a[i]
	case []uint32:
		x = a[i]
	case []int32:
		x = a[i]
	case []float32:
		x = a[i]
	case []bool:
		x = a[i]
	case []string:
		x = a[i]
	case []uint64:
		x = a[i]
	case []int64:
		x = a[i]
	case []float64:
		x = a[i]
	case []Value:
		return a[i]
	}
	return Value{typ: v.elem, v: x}
}

// Float32s returns a float32 array (a float64 array is narrowed).
func (v Value) Float32s() ([]float32, bool) {
	switch a := v.v.(type) {
	case []float32:
		return slices.Clone(a), true
	case []float64:
		out := make([]float32, len(a))
		for i, x := range a {
			out[i] = float32(x)
		}
		return out, true
	}
	return nil, false
}

// Float64s returns a float32 or float64 array as float64.
func (v Value) Float64s() ([]float64, bool) {
	switch a := v.v.(type) {
	case []float32:
		out := make([]float64, len(a))
		for i, x := range a {
			out[i] = float64(x)
		}
		return out, true
	case []float64:
		return slices.Clone(a), true
	}
	return nil, false
}

// Int64s returns an integer array of any width as int64, provided every
// element fits.
func (v Value) Int64s() ([]int64, bool) {
	if v.typ != ValueArray {
		return nil, false
	}
	n := v.Len()
	out := make([]int64, n)
	for i := range n {
		e := v.index(i)
		x, ok := e.Int()
		if !ok {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

// Int32s returns an integer array of any width as int32, provided every
// element fits.
func (v Value) Int32s() ([]int32, bool) {
	if a, ok := v.v.([]int32); ok {
		return slices.Clone(a), true
	}
	w, ok := v.Int64s()
	if !ok {
		return nil, false
	}
	out := make([]int32, len(w))
	for i, x := range w {
		if x < math.MinInt32 || x > math.MaxInt32 {
			return nil, false
		}
		out[i] = int32(x)
	}
	return out, true
}

// Uint32s returns an integer array of any width as uint32, provided every
// element fits.
func (v Value) Uint32s() ([]uint32, bool) {
	if a, ok := v.v.([]uint32); ok {
		return slices.Clone(a), true
	}
	w, ok := v.Int64s()
	if !ok {
		return nil, false
	}
	out := make([]uint32, len(w))
	for i, x := range w {
		if x < 0 || x > math.MaxUint32 {
			return nil, false
		}
		out[i] = uint32(x)
	}
	return out, true
}

// Constructors, for the Writer.

// Uint8 makes a uint8 value.
func Uint8(x uint8) Value { return Value{typ: ValueUint8, v: x} }

// Int8 makes an int8 value.
func Int8(x int8) Value { return Value{typ: ValueInt8, v: x} }

// Uint16 makes a uint16 value.
func Uint16(x uint16) Value { return Value{typ: ValueUint16, v: x} }

// Int16 makes an int16 value.
func Int16(x int16) Value { return Value{typ: ValueInt16, v: x} }

// Uint32 makes a uint32 value.
func Uint32(x uint32) Value { return Value{typ: ValueUint32, v: x} }

// Int32 makes an int32 value.
func Int32(x int32) Value { return Value{typ: ValueInt32, v: x} }

// Uint64 makes a uint64 value.
func Uint64(x uint64) Value { return Value{typ: ValueUint64, v: x} }

// Int64 makes an int64 value.
func Int64(x int64) Value { return Value{typ: ValueInt64, v: x} }

// Float32 makes a float32 value.
func Float32(x float32) Value { return Value{typ: ValueFloat32, v: x} }

// Float64 makes a float64 value.
func Float64(x float64) Value { return Value{typ: ValueFloat64, v: x} }

// Bool makes a bool value.
func Bool(x bool) Value { return Value{typ: ValueBool, v: x} }

// String makes a string value.
func String(s string) Value { return Value{typ: ValueString, v: s} }

func array[T any](elem ValueType, a []T) Value {
	return Value{typ: ValueArray, elem: elem, v: append(make([]T, 0, len(a)), a...)}
}

// Uint8s makes a uint8 array.
func Uint8s(a []uint8) Value { return array(ValueUint8, a) }

// Int8s makes an int8 array.
func Int8s(a []int8) Value { return array(ValueInt8, a) }

// Uint16s makes a uint16 array.
func Uint16s(a []uint16) Value { return array(ValueUint16, a) }

// Int16s makes an int16 array.
func Int16s(a []int16) Value { return array(ValueInt16, a) }

// Uint32s makes a uint32 array.
func Uint32s(a []uint32) Value { return array(ValueUint32, a) }

// Int32s makes an int32 array.
func Int32s(a []int32) Value { return array(ValueInt32, a) }

// Uint64s makes a uint64 array.
func Uint64s(a []uint64) Value { return array(ValueUint64, a) }

// Int64s makes an int64 array.
func Int64s(a []int64) Value { return array(ValueInt64, a) }

// Float32s makes a float32 array.
func Float32s(a []float32) Value { return array(ValueFloat32, a) }

// Float64s makes a float64 array.
func Float64s(a []float64) Value { return array(ValueFloat64, a) }

// Bools makes a bool array.
func Bools(a []bool) Value { return array(ValueBool, a) }

// Strings makes a string array.
func Strings(a []string) Value { return array(ValueString, a) }

// Array makes an array of elem-typed values (use it for arrays of arrays;
// the typed constructors are simpler for scalars). Every element must have
// type elem.
func Array(elem ValueType, elems ...Value) (Value, error) {
	if !elem.valid() {
		return Value{}, fmt.Errorf("gguf: invalid array element type %d", uint32(elem))
	}
	for i, e := range elems {
		if e.typ != elem {
			return Value{}, fmt.Errorf("gguf: array of %s: element %d is %s", elem, i, e.typ)
		}
	}
	if elem == ValueArray {
		return array(ValueArray, elems), nil
	}
	// Store scalar elements as a typed slice, as the reader does.
	out := Value{typ: ValueArray, elem: elem}
	switch elem {
	case ValueUint8:
		out.v = collect[uint8](elems)
	case ValueInt8:
		out.v = collect[int8](elems)
	case ValueUint16:
		out.v = collect[uint16](elems)
	case ValueInt16:
		out.v = collect[int16](elems)
	case ValueUint32:
		out.v = collect[uint32](elems)
	case ValueInt32:
		out.v = collect[int32](elems)
	case ValueFloat32:
		out.v = collect[float32](elems)
	case ValueBool:
		out.v = collect[bool](elems)
	case ValueString:
		out.v = collect[string](elems)
	case ValueUint64:
		out.v = collect[uint64](elems)
	case ValueInt64:
		out.v = collect[int64](elems)
	case ValueFloat64:
		out.v = collect[float64](elems)
	}
	return out, nil
}

func collect[T any](elems []Value) []T {
	out := make([]T, len(elems))
	for i, e := range elems {
		out[i] = e.v.(T)
	}
	return out
}
