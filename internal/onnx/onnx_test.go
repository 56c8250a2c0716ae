package onnx

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
)

// msg builds a protobuf message from already-encoded fields.
func msg(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func bytesField(num protowire.Number, v []byte) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func varintField(num protowire.Number, v uint64) []byte {
	b := protowire.AppendTag(nil, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func packed(vals ...int64) []byte {
	var b []byte
	for _, v := range vals {
		b = protowire.AppendVarint(b, uint64(v))
	}
	return b
}

func TestParseReadsNodesInitializersAndConstants(t *testing.T) {
	raw := make([]byte, 8)
	binary.LittleEndian.PutUint32(raw, math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(raw[4:], math.Float32bits(-2))
	weight := msg(bytesField(1, packed(2)), varintField(2, Float), bytesField(8, []byte("w")), bytesField(9, raw))
	// A scalar whose value sits in float_data, as quantizers write scales.
	scale := msg(varintField(2, Float), bytesField(8, []byte("s")),
		protowire.AppendFixed32(protowire.AppendTag(nil, 4, protowire.Fixed32Type), math.Float32bits(0.25)))
	// int8 values kept widened in int32_data, dims not packed.
	zp := msg(varintField(1, 3), varintField(2, Int8), bytesField(8, []byte("z")), bytesField(5, packed(-3, 0, 0xfffffffe)))
	constant := msg(bytesField(2, []byte("c")), bytesField(4, []byte("Constant")),
		bytesField(5, msg(bytesField(1, []byte("value")), bytesField(5, msg(varintField(2, Int64), bytesField(7, packed(12, 32)), bytesField(1, packed(2)))))))
	add := msg(bytesField(1, []byte("x")), bytesField(1, []byte("w")), bytesField(2, []byte("y")), bytesField(3, []byte("add0")), bytesField(4, []byte("Add")))
	graph := msg(bytesField(1, constant), bytesField(1, add), bytesField(5, weight), bytesField(5, scale), bytesField(5, zp),
		bytesField(11, bytesField(1, []byte("x"))), bytesField(12, bytesField(1, []byte("y"))), varintField(99, 7))
	model := msg(varintField(1, 7), bytesField(7, graph))

	g, err := Parse(model)
	require.NoError(t, err)
	require.Len(t, g.Nodes, 2)
	assert.Equal(t, "Constant", g.Nodes[0].OpType)
	require.NotNil(t, g.Nodes[0].Value)
	ints, err := g.Nodes[0].Value.Ints()
	require.NoError(t, err)
	assert.Equal(t, []int64{12, 32}, ints)
	assert.Equal(t, &Node{Name: "add0", OpType: "Add", Inputs: []string{"x", "w"}, Outputs: []string{"y"}}, g.Nodes[1])
	assert.Equal(t, []string{"x"}, g.Inputs)
	assert.Equal(t, []string{"y"}, g.Outputs)

	w, err := g.Initializers["w"].Floats()
	require.NoError(t, err)
	assert.Equal(t, []float32{1.5, -2}, w)
	s, err := g.Initializers["s"].Floats()
	require.NoError(t, err)
	assert.Equal(t, []float32{0.25}, s)
	z, err := g.Initializers["z"].Ints()
	require.NoError(t, err)
	assert.Equal(t, []int64{-3, 0, -2}, z)
	_, err = g.Initializers["z"].Floats()
	assert.ErrorIs(t, err, ErrFormat)
}

func TestParseRefusesBadInput(t *testing.T) {
	for name, b := range map[string][]byte{
		"no graph":   varintField(1, 7),
		"cut short":  bytesField(7, msg(bytesField(5, []byte("abc"))))[:4],
		"bad varint": {0x08, 0xff},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(b)
			assert.ErrorIs(t, err, ErrFormat)
		})
	}
	short := msg(bytesField(1, packed(4)), varintField(2, Float), bytesField(8, []byte("w")), bytesField(9, make([]byte, 8)))
	g, err := Parse(bytesField(7, bytesField(5, short)))
	require.NoError(t, err)
	_, err = g.Initializers["w"].Floats()
	assert.ErrorIs(t, err, ErrFormat, "8 bytes cannot hold 4 floats")
}
