// Package ggufgen writes tiny random-weight GGUF models that llama.cpp loads
// and runs like a real one, so tests can go through the whole llama.cpp path
// (loader, tokenizer, chat template, decode, KV cache) in milliseconds and
// without the real model file.
//
// The model mirrors the shape of SmolLM2, the model dragon ships with:
// architecture "llama" with grouped-query attention, SwiGLU feed-forward and
// tied input/output embeddings, and a byte-level BPE ("gpt2") tokenizer with
// the "smollm" pre-tokenizer and the ChatML special tokens at the same ids
// (<|endoftext|> 0, <|im_start|> 1 = BOS, <|im_end|> 2 = EOS). Every tensor
// is F32, so the file stays well under a megabyte at the default size.
//
// The vocabulary is the 256 GPT-2 byte symbols plus a few dozen merges of
// common English pairs: any text tokenizes (bytes are the fallback) and
// round-trips through the detokenizer, and words like "hello" and " world"
// become single tokens so that tests see multi-byte pieces.
//
// Weights are drawn from a PCG generator seeded with Config.Seed: the same
// Config gives a byte-identical file, different seeds give different logits.
package ggufgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/ollama/ollama/fs/ggml"
)

// Special token ids, the same as SmolLM2's.
const (
	TokenEndOfText = 0 // <|endoftext|>, also the unknown token
	TokenIMStart   = 1 // <|im_start|>, BOS
	TokenIMEnd     = 2 // <|im_end|>, EOS and padding
)

// ChatTemplate is the tokenizer.chat_template written into every file: plain
// ChatML, which llama.cpp's built-in template detection recognises by its
// <|im_start|> marker. Unlike SmolLM2's it adds no default system prompt, so
// that rendered prompts contain only what the test put in.
const ChatTemplate = "{% for message in messages %}" +
	"{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}" +
	"{% endfor %}" +
	"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

// Config sizes the model. Zero fields take the defaults noted.
type Config struct {
	// Seed of the weights; any value, 0 included, is a valid seed.
	Seed uint64
	// Name is general.name (default "ggufgen-tiny").
	Name string
	// Layers is the number of transformer blocks (default 2).
	Layers int
	// Embd is the embedding width (default 64); a multiple of Heads with an
	// even head size, because RoPE rotates pairs of dimensions.
	Embd int
	// Heads is the number of query heads (default 4).
	Heads int
	// HeadsKV is the number of key/value heads (default Heads/2 when Heads
	// is even, else Heads): grouped-query attention as in SmolLM2. Heads
	// must be a multiple of it.
	HeadsKV int
	// FFN is the feed-forward width (default 128).
	FFN int
	// CtxLen is the training context length, llama.context_length (default
	// 2048): what llama.cpp uses when a context asks for n_ctx 0.
	CtxLen int
	// UntiedOutput writes a separate output.weight. By default the output
	// projection is tied to token_embd, as in SmolLM2, and llama.cpp reuses
	// the embedding matrix.
	UntiedOutput bool
}

// withDefaults fills zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		c.Name = "ggufgen-tiny"
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Layers, 2)
	def(&c.Embd, 64)
	def(&c.Heads, 4)
	if c.HeadsKV == 0 && c.Heads > 0 {
		c.HeadsKV = c.Heads
		if c.Heads%2 == 0 {
			c.HeadsKV = c.Heads / 2
		}
	}
	def(&c.FFN, 128)
	def(&c.CtxLen, 2048)

	for _, f := range []struct {
		name string
		v    int
	}{{"Layers", c.Layers}, {"Embd", c.Embd}, {"Heads", c.Heads}, {"HeadsKV", c.HeadsKV}, {"FFN", c.FFN}, {"CtxLen", c.CtxLen}} {
		if f.v < 0 {
			return c, fmt.Errorf("ggufgen: %s = %d, must be positive", f.name, f.v)
		}
	}
	// Checked here rather than left to llama.cpp, whose loader would only
	// report a tensor shape mismatch (or assert inside ggml).
	if c.Embd%c.Heads != 0 {
		return c, fmt.Errorf("ggufgen: Embd %d is not divisible by Heads %d", c.Embd, c.Heads)
	}
	if hd := c.Embd / c.Heads; hd%2 != 0 {
		return c, fmt.Errorf("ggufgen: head size Embd/Heads = %d must be even for RoPE", hd)
	}
	if c.Heads%c.HeadsKV != 0 {
		return c, fmt.Errorf("ggufgen: Heads %d is not a multiple of HeadsKV %d", c.Heads, c.HeadsKV)
	}
	// Caps that keep "tiny" true: F32 weights grow fast, and a test that
	// asks for more almost certainly has a typo.
	if c.Layers > 64 || c.Embd > 4096 || c.FFN > 16384 || c.CtxLen > 1<<20 {
		return c, errors.New("ggufgen: model too large (limits: Layers 64, Embd 4096, FFN 16384, CtxLen 1<<20)")
	}
	return c, nil
}

// Write writes a random-weight model to path, atomically: the file is built
// next to path and renamed into place, so a concurrent reader never sees a
// half-written model.
func Write(path string, cfg Config) (err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return err
	}
	tokens, types, merges := vocab()
	kv := ggml.KV{
		"general.architecture": "llama",
		"general.name":         cfg.Name,
		"general.file_type":    uint32(0), // LLAMA_FTYPE_ALL_F32

		"llama.block_count":                      uint32(cfg.Layers),
		"llama.context_length":                   uint32(cfg.CtxLen),
		"llama.embedding_length":                 uint32(cfg.Embd),
		"llama.feed_forward_length":              uint32(cfg.FFN),
		"llama.attention.head_count":             uint32(cfg.Heads),
		"llama.attention.head_count_kv":          uint32(cfg.HeadsKV),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.rope.dimension_count":             uint32(cfg.Embd / cfg.Heads),
		"llama.rope.freq_base":                   float32(100000),
		"llama.vocab_size":                       uint32(len(tokens)),

		"tokenizer.ggml.model":  "gpt2",
		"tokenizer.ggml.pre":    "smollm",
		"tokenizer.ggml.tokens": tokens,
		// llama.cpp reads token_type as a raw int32 array; []int32 makes
		// ollama's writer emit exactly that.
		"tokenizer.ggml.token_type":       types,
		"tokenizer.ggml.merges":           merges,
		"tokenizer.ggml.bos_token_id":     uint32(TokenIMStart),
		"tokenizer.ggml.eos_token_id":     uint32(TokenIMEnd),
		"tokenizer.ggml.unknown_token_id": uint32(TokenEndOfText),
		"tokenizer.ggml.padding_token_id": uint32(TokenIMEnd),
		"tokenizer.ggml.add_bos_token":    false,
		"tokenizer.ggml.add_space_prefix": false,
		"tokenizer.chat_template":         ChatTemplate,
	}

	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("ggufgen: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// CreateTemp makes the file 0600; a model is not a secret.
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("ggufgen: %w", err)
	}
	if err = ggml.WriteGGUF(f, kv, tensors(cfg, len(tokens))); err != nil {
		return fmt.Errorf("ggufgen: write %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("ggufgen: %w", err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("ggufgen: %w", err)
	}
	return nil
}

// tensors draws the weights. Shapes are in GGUF (ggml ne) order, fastest
// dimension first, exactly as llama.cpp's LLM_ARCH_LLAMA loader asks for
// them: a matrix mapping width a to width b is {a, b}.
//
// Scales are chosen so that the random network still behaves like a
// network: projections use std 1/sqrt(fan_in), which keeps activations
// around unit size through every layer, so attention really mixes positions
// and the logits depend on the context; embeddings use 2/sqrt(Embd), which,
// through the tied output and the unit-RMS final norm, gives logits with a
// std of about 2, a distribution neither flat nor one-hot, like a real LM's.
func tensors(c Config, nVocab int) []*ggml.Tensor {
	// Draw order is fixed (the slice order below), so the same seed gives
	// the same weights no matter how the writer orders or parallelises.
	r := rand.New(rand.NewPCG(c.Seed, 0x6767756667656e)) // "ggufgen"
	var ts []*ggml.Tensor
	add := func(name string, std float64, shape ...int) {
		n := 1
		ushape := make([]uint64, len(shape))
		for i, d := range shape {
			n *= d
			ushape[i] = uint64(d)
		}
		data := make(f32, n)
		for i := range data {
			if std == 0 {
				data[i] = 1 // norm weights: identity scale
			} else {
				data[i] = float32(r.NormFloat64() * std)
			}
		}
		ts = append(ts, &ggml.Tensor{Name: name, Kind: 0 /* F32 */, Shape: ushape, WriterTo: data})
	}
	inv := func(fanIn int) float64 { return 1 / math.Sqrt(float64(fanIn)) }

	headDim := c.Embd / c.Heads
	kvDim := headDim * c.HeadsKV
	add("token_embd.weight", 2*inv(c.Embd), c.Embd, nVocab)
	add("output_norm.weight", 0, c.Embd)
	if c.UntiedOutput {
		add("output.weight", 2*inv(c.Embd), c.Embd, nVocab)
	}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		add(p+"attn_norm.weight", 0, c.Embd)
		add(p+"attn_q.weight", inv(c.Embd), c.Embd, c.Embd)
		add(p+"attn_k.weight", inv(c.Embd), c.Embd, kvDim)
		add(p+"attn_v.weight", inv(c.Embd), c.Embd, kvDim)
		add(p+"attn_output.weight", inv(c.Embd), c.Embd, c.Embd)
		add(p+"ffn_norm.weight", 0, c.Embd)
		add(p+"ffn_gate.weight", inv(c.Embd), c.Embd, c.FFN)
		add(p+"ffn_up.weight", inv(c.Embd), c.Embd, c.FFN)
		add(p+"ffn_down.weight", inv(c.FFN), c.FFN, c.Embd)
	}
	return ts
}

// f32 is a tensor's data, written little-endian as GGUF requires.
type f32 []float32

func (d f32) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, 4*len(d))
	for i, v := range d {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
	}
	n, err := w.Write(buf)
	return int64(n), err
}
