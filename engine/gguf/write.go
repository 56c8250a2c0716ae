package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// alignment is GGUF's default (general.alignment unset): tensor data
// starts, and each tensor's offset is, a multiple of it.
const alignment = 32

// Writer builds a GGUF v3 file of float32 tensors: metadata in the order
// it was added, then the tensors.
type Writer struct {
	kvs     []func(w *encoder)
	tensors []tensor
}

type tensor struct {
	name string
	ne   []uint64 // ne[0] varies fastest, as ggml numbers dimensions
	data []float32
}

// String adds a string key.
func (w *Writer) String(key, v string) {
	w.kv(key, typeString, func(e *encoder) { e.string(v) })
}

// Uint32 adds a uint32 key.
func (w *Writer) Uint32(key string, v uint32) {
	w.kv(key, typeUint32, func(e *encoder) { e.u32(v) })
}

// Float32 adds a float32 key.
func (w *Writer) Float32(key string, v float32) {
	w.kv(key, typeFloat32, func(e *encoder) { e.u32(math.Float32bits(v)) })
}

// Bool adds a bool key.
func (w *Writer) Bool(key string, v bool) {
	b := byte(0)
	if v {
		b = 1
	}
	w.kv(key, typeBool, func(e *encoder) { e.bytes([]byte{b}) })
}

// Strings adds an array of strings.
func (w *Writer) Strings(key string, vs []string) {
	w.kv(key, typeArray, func(e *encoder) {
		e.u32(typeString)
		e.u64(uint64(len(vs)))
		for _, v := range vs {
			e.string(v)
		}
	})
}

// Int32s adds an array of int32.
func (w *Writer) Int32s(key string, vs []int32) {
	w.kv(key, typeArray, func(e *encoder) {
		e.u32(typeInt32)
		e.u64(uint64(len(vs)))
		for _, v := range vs {
			e.u32(uint32(v))
		}
	})
}

func (w *Writer) kv(key string, typ uint32, value func(*encoder)) {
	w.kvs = append(w.kvs, func(e *encoder) {
		e.string(key)
		e.u32(typ)
		value(e)
	})
}

// Tensor adds a float32 tensor of shape ne (ggml's order: ne[0] is the
// contiguous dimension). It panics when data does not fill the shape: a
// converter's bug, not bad input.
func (w *Writer) Tensor(name string, data []float32, ne ...uint64) {
	n := uint64(1)
	for _, d := range ne {
		n *= d
	}
	if n != uint64(len(data)) || len(ne) == 0 || len(ne) > 4 {
		panic(fmt.Sprintf("gguf: tensor %s: %d values for shape %v", name, len(data), ne))
	}
	w.tensors = append(w.tensors, tensor{name: name, ne: ne, data: data})
}

// WriteTo writes the file.
func (w *Writer) WriteTo(dst io.Writer) (int64, error) {
	e := &encoder{w: bufio.NewWriterSize(dst, 1<<20)}
	e.bytes([]byte("GGUF"))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		kv(e)
	}
	var off uint64
	for _, t := range w.tensors {
		e.string(t.name)
		e.u32(uint32(len(t.ne)))
		for _, d := range t.ne {
			e.u64(d)
		}
		e.u32(0) // GGML_TYPE_F32
		e.u64(off)
		off = padded(off + 4*uint64(len(t.data)))
	}
	e.pad()
	for _, t := range w.tensors {
		var b [4]byte
		for _, v := range t.data {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			e.bytes(b[:])
		}
		e.pad()
	}
	if e.err == nil {
		e.err = e.w.Flush()
	}
	return e.n, e.err
}

func padded(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

// encoder writes little-endian values, remembering the first error.
type encoder struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (e *encoder) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += int64(n)
	e.err = err
}

func (e *encoder) u32(v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	e.bytes(b[:])
}

func (e *encoder) u64(v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	e.bytes(b[:])
}

func (e *encoder) string(s string) {
	e.u64(uint64(len(s)))
	e.bytes([]byte(s))
}

func (e *encoder) pad() {
	if r := uint64(e.n) % alignment; r != 0 {
		e.bytes(make([]byte, alignment-r))
	}
}
