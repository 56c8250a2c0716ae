package retrievalbench

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/dragon-rag/dragon/engine"
)

// TextModel generates synthetic text with a real corpus's vocabulary and
// word frequencies (a unigram model) and sentence lengths: enough for
// BM25's document frequencies and passage lengths to look like the real
// corpus's at any size. It is for latency and recall-against-exact
// measurements at scale only; no quality figure comes from it.
type TextModel struct {
	words     []string
	cum       []float64 // cumulative probabilities
	sentences []int     // sentence lengths in words, as observed
}

// LearnText counts words and sentence lengths in texts.
func LearnText(texts []string) (*TextModel, error) {
	counts := map[string]int{}
	var sentences []int
	for _, t := range texts {
		n := 0
		for _, w := range strings.Fields(t) {
			counts[w]++
			n++
			if strings.HasSuffix(w, ".") || strings.HasSuffix(w, "?") || strings.HasSuffix(w, "!") {
				sentences = append(sentences, n)
				n = 0
			}
		}
		if n > 0 {
			sentences = append(sentences, n)
		}
	}
	if len(counts) == 0 {
		return nil, fmt.Errorf("retrievalbench: no words to learn from")
	}
	m := &TextModel{sentences: sentences}
	for w := range counts {
		m.words = append(m.words, w)
	}
	// Most frequent first, ties by word: the model is the same for the
	// same texts.
	slices.SortFunc(m.words, func(a, b string) int {
		if counts[a] != counts[b] {
			return counts[b] - counts[a]
		}
		return strings.Compare(a, b)
	})
	total := 0.0
	for _, w := range m.words {
		total += float64(counts[w])
		m.cum = append(m.cum, total)
	}
	for i := range m.cum {
		m.cum[i] /= total
	}
	return m, nil
}

// Vocabulary is the number of distinct words.
func (m *TextModel) Vocabulary() int { return len(m.words) }

// Frequent returns the n most frequent words, most frequent first.
func (m *TextModel) Frequent(n int) []string { return m.words[:min(n, len(m.words))] }

// Word draws one word.
func (m *TextModel) Word(rng *rand.Rand) string {
	return m.words[min(sort.SearchFloat64s(m.cum, rng.Float64()), len(m.words)-1)]
}

// Write writes about words words of sentences to w.
func (m *TextModel) Write(w io.Writer, words int, rng *rand.Rand) error {
	bw := bufio.NewWriter(w)
	for written := 0; written < words; {
		n := m.sentences[rng.IntN(len(m.sentences))]
		for i := range n {
			if i > 0 {
				bw.WriteByte(' ')
			}
			bw.WriteString(m.Word(rng))
		}
		bw.WriteString("\n")
		written += n
	}
	return bw.Flush()
}

// SynthHeader opens every synthetic file, so nobody mistakes it for text.
const SynthHeader = "SYNTHETIC TEXT (dragon index synth): words drawn from a real corpus's frequencies, for latency and recall at scale only."

// SynthWords is how many words of synthetic text make about passages
// passages of chunkTokens tokens, at tokensPerWord (TokensPerWord).
func SynthWords(passages, chunkTokens int, tokensPerWord float64) int {
	return int(float64(passages) * float64(chunkTokens) / tokensPerWord)
}

// WriteSynthCorpus writes files of synthetic text into dir: about words
// words in all, perFile words a file (0: 50,000), named synth-NNNNNN.txt.
func WriteSynthCorpus(dir string, m *TextModel, words, perFile int, seed uint64) (files int, err error) {
	if perFile <= 0 {
		perFile = 50_000
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	for done := 0; done < words; files++ {
		n := min(perFile, words-done)
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("synth-%06d.txt", files)))
		if err != nil {
			return files, err
		}
		_, err = fmt.Fprintln(f, SynthHeader)
		if err == nil {
			err = m.Write(f, n, rng)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, err
		}
		done += n
	}
	return files, nil
}

// TokensPerWord is how many tokens tok makes of a word of the model's text,
// measured on 20,000 words of it: what sizes a synthetic corpus in
// passages.
func (m *TextModel) TokensPerWord(tok interface {
	Tokenize(text string, addSpecial, parseSpecial bool) ([]engine.Token, error)
}) (float64, error) {
	var b strings.Builder
	const words = 20_000
	if err := m.Write(&b, words, rand.New(rand.NewPCG(3, 4))); err != nil {
		return 0, err
	}
	toks, err := tok.Tokenize(b.String(), false, false)
	if err != nil {
		return 0, err
	}
	return float64(len(toks)) / float64(len(strings.Fields(b.String()))), nil
}
