package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/testmodel"
)

// kv is one metadata pair for writeGGUF: value is a string, a uint32 or a
// []string.
type kv struct {
	key   string
	value any
}

// writeGGUF writes a v3 file of metadata alone (no tensors).
func writeGGUF(t *testing.T, kvs []kv) string {
	t.Helper()
	var w Writer
	for _, p := range kvs {
		switch v := p.value.(type) {
		case string:
			w.String(p.key, v)
		case uint32:
			w.Uint32(p.key, v)
		case []string:
			w.Strings(p.key, v)
		default:
			t.Fatalf("writeGGUF: %T", v)
		}
	}
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "m.gguf")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	return path
}

func tokenizer(merges []string, eos uint32) []kv {
	return []kv{
		{"general.architecture", "qwen2"},
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.tokens", []string{"a", "b", "ab", "<|im_end|>"}},
		{"tokenizer.ggml.merges", merges},
		{"tokenizer.ggml.eos_token_id", eos},
		{"tokenizer.chat_template", "{{ messages }}"},
	}
}

func hashOf(t *testing.T, kvs []kv) string {
	t.Helper()
	h, err := TokenizerHash(writeGGUF(t, kvs))
	require.NoError(t, err)
	return h
}

func TestTokenizerHash(t *testing.T) {
	base := hashOf(t, tokenizer([]string{"a b"}, 3))
	assert.Len(t, base, 64)

	// What is not the tokenizer does not count: other keys, their order,
	// the chat template.
	other := append(tokenizer([]string{"a b"}, 3), kv{"qwen2.block_count", uint32(28)})
	other[0].value = "qwen3"
	other[5].value = "another template"
	other[1], other[2] = other[2], other[1]
	assert.Equal(t, base, hashOf(t, other))

	// Merges and special ids do.
	assert.NotEqual(t, base, hashOf(t, tokenizer([]string{"b a"}, 3)), "merges")
	assert.NotEqual(t, base, hashOf(t, tokenizer([]string{"a b"}, 2)), "eos id")
	assert.NotEqual(t, base, hashOf(t, tokenizer(nil, 3)), "no merges")
}

func TestTokenizerHashBadFiles(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "x.bin")
	require.NoError(t, os.WriteFile(notGGUF, []byte("not a model at all"), 0o644))
	_, err := TokenizerHash(notGGUF)
	require.ErrorIs(t, err, ErrFormat)

	// Cut short in the middle of the tokens array.
	whole, err := os.ReadFile(writeGGUF(t, tokenizer([]string{"a b"}, 3)))
	require.NoError(t, err)
	cut := filepath.Join(dir, "cut.gguf")
	require.NoError(t, os.WriteFile(cut, whole[:60], 0o644))
	_, err = TokenizerHash(cut)
	require.ErrorIs(t, err, ErrFormat)

	_, err = TokenizerHash(filepath.Join(dir, "missing.gguf"))
	require.Error(t, err)
}

// The Qwen pair shares its tokenizer byte for byte; SmolLM2's differs.
func TestTokenizerHashRealModels(t *testing.T) {
	device, err := TokenizerHash(testmodel.QwenDevicePath(t))
	require.NoError(t, err)
	cloud, err := TokenizerHash(testmodel.QwenCloudPath(t))
	require.NoError(t, err)
	smol, err := TokenizerHash(testmodel.Path(t))
	require.NoError(t, err)
	assert.Equal(t, device, cloud)
	assert.NotEqual(t, device, smol)
}
