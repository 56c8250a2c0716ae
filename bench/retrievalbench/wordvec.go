package retrievalbench

import (
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"unicode"

	"github.com/dragon-rag/dragon/retrieval"
)

// WordMeanEmbedder gives a text the normalised mean of its words' vectors,
// each word embedded once, alone, by a real sentence model. It stands in
// for that model at corpus sizes no model can embed here: its vectors keep
// the model's geometry (its anisotropy, which words lie near which), where
// random unit vectors are the worst case for any graph index. Recall
// measured with it is against exact search over the same vectors; no
// quality figure comes from it.
type WordMeanEmbedder struct {
	vecs  map[string][]float32
	dims  int
	model string
	// whole embeds texts none of whose words are known, with the model.
	whole retrieval.Embedder
}

// NewWordMeanEmbedder embeds each of words (normalised: lower case, outer
// punctuation trimmed) with model. Words outside them are left out of a
// text's mean.
func NewWordMeanEmbedder(ctx context.Context, model retrieval.Embedder, words []string) (*WordMeanEmbedder, error) {
	e := &WordMeanEmbedder{vecs: make(map[string][]float32, len(words)), model: fingerprint(model), whole: model}
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		vs, err := model.Embed(ctx, batch)
		if err != nil {
			return fmt.Errorf("embed words: %w", err)
		}
		if len(vs) != len(batch) {
			return fmt.Errorf("embed words: %d vectors for %d words", len(vs), len(batch))
		}
		for i, w := range batch {
			e.vecs[w] = vs[i]
			e.dims = len(vs[i])
		}
		batch = batch[:0]
		return nil
	}
	for _, w := range words {
		w = normWord(w)
		if w == "" || e.vecs[w] != nil || slices.Contains(batch, w) {
			continue
		}
		if batch = append(batch, w); len(batch) == 64 {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(e.vecs) == 0 {
		return nil, fmt.Errorf("retrievalbench: no words to embed")
	}
	return e, nil
}

// wordTable is a WordMeanEmbedder on disk.
type wordTable struct {
	Model string
	Vecs  map[string][]float32
}

// Save writes the word vectors to path.
func (e *WordMeanEmbedder) Save(path string) error {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(wordTable{Model: e.model, Vecs: e.vecs}); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// LoadWordMeanEmbedder reads word vectors Save wrote for model, which
// still embeds the texts none of whose words are known.
func LoadWordMeanEmbedder(path string, model retrieval.Embedder) (*WordMeanEmbedder, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t wordTable
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	e := &WordMeanEmbedder{vecs: t.Vecs, model: fingerprint(model), whole: model}
	if t.Model != e.model || len(t.Vecs) == 0 {
		return nil, fmt.Errorf("%s: word vectors of %q, not of %q", path, t.Model, e.model)
	}
	for _, v := range t.Vecs {
		e.dims = len(v)
		break
	}
	return e, nil
}

func fingerprint(e retrieval.Embedder) string {
	if f, ok := e.(retrieval.Fingerprinter); ok {
		return f.Fingerprint()
	}
	return fmt.Sprintf("%T", e)
}

// Words is how many words have vectors.
func (e *WordMeanEmbedder) Words() int { return len(e.vecs) }

// Fingerprint implements retrieval.Fingerprinter.
func (e *WordMeanEmbedder) Fingerprint() string {
	return fmt.Sprintf("word-mean-synthetic/v1|words=%d|%s", len(e.vecs), e.model)
}

// Embed implements retrieval.Embedder.
func (e *WordMeanEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		sum := make([]float64, e.dims)
		known := 0
		for _, w := range strings.Fields(t) {
			v := e.vecs[normWord(w)]
			if v == nil {
				continue
			}
			known++
			for d, x := range v {
				sum[d] += float64(x)
			}
		}
		if known == 0 {
			vs, err := e.whole.Embed(ctx, []string{t})
			if err != nil {
				return nil, err
			}
			out[i] = vs[0]
			continue
		}
		var norm float64
		for _, x := range sum {
			norm += x * x
		}
		norm = math.Sqrt(norm)
		v := make([]float32, e.dims)
		for d, x := range sum {
			v[d] = float32(x / norm)
		}
		out[i] = v
	}
	return out, nil
}

func normWord(w string) string {
	return strings.ToLower(strings.TrimFunc(w, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsNumber(r) }))
}
