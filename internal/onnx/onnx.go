// Package onnx reads the parts of an ONNX model file that a converter
// needs: the graph's nodes (operator, inputs, outputs, constant values) and
// its initializers (the weights). It decodes the protobuf wire format
// directly, so it needs no generated code; fields it does not know are
// skipped.
package onnx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"

	"google.golang.org/protobuf/encoding/protowire"
)

// ErrFormat marks a file that is not a well-formed ONNX model.
var ErrFormat = errors.New("onnx: bad format")

// Element types of TensorProto.data_type.
const (
	Float = 1
	Uint8 = 2
	Int8  = 3
	Int32 = 6
	Int64 = 7
)

// Tensor is a TensorProto: a constant or an initializer.
type Tensor struct {
	Name     string
	Dims     []int64
	DataType int32
	raw      []byte
	floats   []float32
	int32s   []int32
	int64s   []int64
}

// Len is the number of elements the dimensions promise (1 for a scalar).
func (t *Tensor) Len() int {
	n := 1
	for _, d := range t.Dims {
		n *= int(d)
	}
	return n
}

// Floats returns the values of a float tensor.
func (t *Tensor) Floats() ([]float32, error) {
	if t.DataType != Float {
		return nil, fmt.Errorf("%w: tensor %q has type %d, not float", ErrFormat, t.Name, t.DataType)
	}
	if t.raw != nil {
		if len(t.raw) != 4*t.Len() {
			return nil, fmt.Errorf("%w: tensor %q holds %d bytes for %d floats", ErrFormat, t.Name, len(t.raw), t.Len())
		}
		out := make([]float32, t.Len())
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.raw[4*i:]))
		}
		return out, nil
	}
	if len(t.floats) != t.Len() {
		return nil, fmt.Errorf("%w: tensor %q holds %d floats, its dims %d", ErrFormat, t.Name, len(t.floats), t.Len())
	}
	return t.floats, nil
}

// Ints returns the values of an integer tensor (int8, uint8, int32 or
// int64), widened.
func (t *Tensor) Ints() ([]int64, error) {
	n := t.Len()
	out := make([]int64, 0, n)
	switch {
	case t.raw != nil:
		size := map[int32]int{Int8: 1, Uint8: 1, Int32: 4, Int64: 8}[t.DataType]
		if size == 0 {
			return nil, fmt.Errorf("%w: tensor %q has type %d, not an integer", ErrFormat, t.Name, t.DataType)
		}
		if len(t.raw) != size*n {
			return nil, fmt.Errorf("%w: tensor %q holds %d bytes for %d values", ErrFormat, t.Name, len(t.raw), n)
		}
		for i := range n {
			switch t.DataType {
			case Int8:
				out = append(out, int64(int8(t.raw[i])))
			case Uint8:
				out = append(out, int64(t.raw[i]))
			case Int32:
				out = append(out, int64(int32(binary.LittleEndian.Uint32(t.raw[4*i:]))))
			case Int64:
				out = append(out, int64(binary.LittleEndian.Uint64(t.raw[8*i:])))
			}
		}
	case t.DataType == Int64:
		out = append(out, t.int64s...)
	case t.DataType == Int8, t.DataType == Uint8, t.DataType == Int32:
		// ONNX keeps small integer types widened in int32_data.
		for _, v := range t.int32s {
			if t.DataType == Int8 {
				v = int32(int8(v))
			}
			out = append(out, int64(v))
		}
	default:
		return nil, fmt.Errorf("%w: tensor %q has type %d, not an integer", ErrFormat, t.Name, t.DataType)
	}
	if len(out) != n {
		return nil, fmt.Errorf("%w: tensor %q holds %d values, its dims %d", ErrFormat, t.Name, len(out), n)
	}
	return out, nil
}

// Node is one operator of the graph.
type Node struct {
	Name    string
	OpType  string
	Inputs  []string
	Outputs []string
	// Value is a Constant node's tensor (its "value" attribute).
	Value *Tensor
}

// Graph is a model's main graph.
type Graph struct {
	Nodes        []*Node
	Initializers map[string]*Tensor
	Inputs       []string
	Outputs      []string
}

// ReadFile reads the graph of an ONNX model file.
func ReadFile(path string) (*Graph, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	g, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// Parse decodes a serialized ModelProto. The graph keeps slices of b.
func Parse(b []byte) (*Graph, error) {
	var g *Graph
	err := fields(b, func(num protowire.Number, v []byte, _ uint64) error {
		if num != 7 { // ModelProto.graph
			return nil
		}
		var err error
		g, err = parseGraph(v)
		return err
	})
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, fmt.Errorf("%w: no graph", ErrFormat)
	}
	return g, nil
}

func parseGraph(b []byte) (*Graph, error) {
	g := &Graph{Initializers: map[string]*Tensor{}}
	err := fields(b, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1: // node
			n, err := parseNode(v)
			if err != nil {
				return err
			}
			g.Nodes = append(g.Nodes, n)
		case 5: // initializer
			t, err := parseTensor(v)
			if err != nil {
				return err
			}
			g.Initializers[t.Name] = t
		case 11, 12: // input, output: ValueInfoProto, name = 1
			var name string
			if err := fields(v, func(n protowire.Number, s []byte, _ uint64) error {
				if n == 1 {
					name = string(s)
				}
				return nil
			}); err != nil {
				return err
			}
			if num == 11 {
				g.Inputs = append(g.Inputs, name)
			} else {
				g.Outputs = append(g.Outputs, name)
			}
		}
		return nil
	})
	return g, err
}

func parseNode(b []byte) (*Node, error) {
	n := &Node{}
	err := fields(b, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			n.Inputs = append(n.Inputs, string(v))
		case 2:
			n.Outputs = append(n.Outputs, string(v))
		case 3:
			n.Name = string(v)
		case 4:
			n.OpType = string(v)
		case 5: // AttributeProto: name = 1, t = 5
			var name string
			var t *Tensor
			if err := fields(v, func(an protowire.Number, av []byte, _ uint64) error {
				switch an {
				case 1:
					name = string(av)
				case 5:
					var err error
					t, err = parseTensor(av)
					return err
				}
				return nil
			}); err != nil {
				return err
			}
			if name == "value" && t != nil {
				n.Value = t
			}
		}
		return nil
	})
	return n, err
}

func parseTensor(b []byte) (*Tensor, error) {
	t := &Tensor{}
	err := fields(b, func(num protowire.Number, v []byte, x uint64) error {
		switch num {
		case 1: // dims
			return varints(v, x, func(u uint64) { t.Dims = append(t.Dims, int64(u)) })
		case 2:
			t.DataType = int32(x)
		case 4: // float_data (packed)
			if v == nil {
				t.floats = append(t.floats, math.Float32frombits(uint32(x)))
				return nil
			}
			if len(v)%4 != 0 {
				return fmt.Errorf("%w: float_data of %d bytes", ErrFormat, len(v))
			}
			for i := 0; i < len(v); i += 4 {
				t.floats = append(t.floats, math.Float32frombits(binary.LittleEndian.Uint32(v[i:])))
			}
		case 5: // int32_data
			return varints(v, x, func(u uint64) { t.int32s = append(t.int32s, int32(u)) })
		case 7: // int64_data
			return varints(v, x, func(u uint64) { t.int64s = append(t.int64s, int64(u)) })
		case 8:
			t.Name = string(v)
		case 9:
			t.raw = v
		case 14: // data_location: 1 is EXTERNAL, the weights in another file
			if x == 1 {
				return fmt.Errorf("%w: tensor with external data is not supported", ErrFormat)
			}
		}
		return nil
	})
	if t.raw != nil && len(t.raw) == 0 && t.Len() > 0 {
		t.raw = nil // an empty raw_data: the values are in the typed fields
	}
	return t, err
}

// fields calls fn for each field of a message: v is the payload of a
// length-delimited field (nil otherwise), x the value of a varint or
// fixed field.
func fields(b []byte, fn func(num protowire.Number, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", ErrFormat, protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var u uint32
			u, n = protowire.ConsumeFixed32(b)
			x = uint64(u)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
			if n >= 0 && v == nil {
				v = []byte{}
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %w", ErrFormat, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, v, x); err != nil {
			return err
		}
	}
	return nil
}

// varints reads a repeated varint field, packed (v) or one value (x).
func varints(v []byte, x uint64, add func(uint64)) error {
	if v == nil {
		add(x)
		return nil
	}
	for len(v) > 0 {
		u, n := protowire.ConsumeVarint(v)
		if n < 0 {
			return fmt.Errorf("%w: packed varints: %w", ErrFormat, protowire.ParseError(n))
		}
		add(u)
		v = v[n:]
	}
	return nil
}
