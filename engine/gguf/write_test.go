package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriterLaysOutAlignedTensors(t *testing.T) {
	var w Writer
	w.String("general.architecture", "bert")
	w.Float32("bert.attention.layer_norm_epsilon", 1e-12)
	w.Bool("bert.attention.causal", false)
	w.Int32s("tokenizer.ggml.token_type", []int32{1, 3})
	w.Tensor("a", []float32{1, 2, 3}, 3)
	w.Tensor("b", []float32{-1, 0.5, 4, 8, 16, 32}, 3, 2)
	var b bytes.Buffer
	n, err := w.WriteTo(&b)
	require.NoError(t, err)
	require.Equal(t, int64(b.Len()), n)
	file := b.Bytes()

	r := &reader{r: bufio.NewReader(bytes.NewReader(file))}
	keys, err := r.header()
	require.NoError(t, err)
	assert.Equal(t, uint64(4), keys)
	for range keys {
		_, err := r.string(nil)
		require.NoError(t, err)
		require.NoError(t, r.value(nil))
	}
	type info struct {
		name string
		ne   []uint64
		off  uint64
	}
	var infos []info
	for range 2 {
		name, err := r.string(nil)
		require.NoError(t, err)
		dims, err := r.uint(4, nil)
		require.NoError(t, err)
		ne := make([]uint64, dims)
		for i := range ne {
			ne[i], err = r.uint(8, nil)
			require.NoError(t, err)
		}
		typ, err := r.uint(4, nil)
		require.NoError(t, err)
		assert.Zero(t, typ, "F32")
		off, err := r.uint(8, nil)
		require.NoError(t, err)
		infos = append(infos, info{string(name), ne, off})
	}
	assert.Equal(t, []info{{"a", []uint64{3}, 0}, {"b", []uint64{3, 2}, 32}}, infos)

	// The data starts at the first aligned offset after the tensor infos,
	// and the file ends padded after the last tensor.
	read := len(file) - r.r.Buffered()
	data := (read + alignment - 1) / alignment * alignment
	assert.Equal(t, data+32+32, len(file))
	at := func(off, i int) float32 {
		return math.Float32frombits(binary.LittleEndian.Uint32(file[data+off+4*i:]))
	}
	assert.Equal(t, float32(3), at(0, 2))
	assert.Equal(t, float32(-1), at(32, 0))
	assert.Equal(t, float32(32), at(32, 5))
}

func TestWriterPanicsOnAShapeItsDataDoesNotFill(t *testing.T) {
	var w Writer
	assert.Panics(t, func() { w.Tensor("x", []float32{1, 2}, 3) })
}

// TestTensorsFindTheirData: Tensors places each tensor's data where the
// writer put it, in a file read back from disk, and spans the data to the
// file's end.
func TestTensorsFindTheirData(t *testing.T) {
	var w Writer
	w.String("general.architecture", "bert")
	w.Tensor("a", []float32{1, 2, 3}, 3)
	w.Tensor("b", []float32{-1, 0.5, 4, 8, 16, 32}, 3, 2)
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	path := t.TempDir() + "/m.gguf"
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))

	ts, err := Tensors(path)
	require.NoError(t, err)
	require.Len(t, ts, 2)
	file := b.Bytes()
	at := func(tt Tensor, i int) float32 {
		return math.Float32frombits(binary.LittleEndian.Uint32(file[tt.Offset+int64(4*i):]))
	}
	assert.Equal(t, "a", ts[0].Name)
	assert.Equal(t, []float32{1, 2, 3}, []float32{at(ts[0], 0), at(ts[0], 1), at(ts[0], 2)})
	assert.Equal(t, "b", ts[1].Name)
	assert.Equal(t, float32(-1), at(ts[1], 0))
	assert.Equal(t, float32(32), at(ts[1], 5))
	assert.Zero(t, ts[0].Offset%alignment)
	assert.Equal(t, ts[1].Offset, ts[0].Offset+ts[0].Size, "a's span runs to b's data")
	assert.Equal(t, int64(len(file)), ts[1].Offset+ts[1].Size, "the last runs to the end")

	require.NoError(t, os.WriteFile(path, file[:ts[1].Offset-8], 0o644))
	_, err = Tensors(path)
	assert.ErrorIs(t, err, ErrFormat, "a file cut short")
}
