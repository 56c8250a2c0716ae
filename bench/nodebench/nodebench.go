// Package nodebench measures one side's RAG node on the real model: the
// cost of retrieval against the time to first token, per-token decode cost
// by passage count for output and context aggregation, and perplexity with
// and without retrieval on held-out windows of the public corpus.
package nodebench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/internal/timing"
	"github.com/dragon-rag/dragon/retrieval"
)

// Result is the JSON printed by `dragon bench node`.
type Result struct {
	Prompts         int                `json:"prompts"`
	Threads         int                `json:"threads"`
	RetrievalMS     float64            `json:"retrieval_ms"`
	PrefillMS       float64            `json:"prefill_ms"`
	TTFTMS          float64            `json:"ttft_ms"`
	RetrievalShare  float64            `json:"retrieval_share_of_ttft"`
	DecodeMS        map[string]float64 `json:"decode_ms"`
	DecodeMSContext map[string]float64 `json:"decode_ms_context"`
	Decode8Over1    float64            `json:"decode8_over_decode1"`
	PPLWindows      int                `json:"ppl_windows"`
	PPLNoRetrieval  float64            `json:"ppl_no_retrieval"`
	PPLOutputAgg    float64            `json:"ppl_output_agg"`
}

// Options of a run.
type Options struct {
	Threads int
	// Queries are retrieval questions; each retrieves up to 8 passages.
	Queries []string
	Index   retrieval.Searcher
	// Windows are held-out texts of the public corpus, with their source
	// (excluded from retrieval) for perplexity.
	Windows []Window
	// DecodeTokens per measured generation.
	DecodeTokens int
}

// Window is a held-out span of text.
type Window struct {
	Source string
	Text   string
}

// PassageCounts are the keys of the decode maps.
var PassageCounts = []int{1, 2, 4, 8}

// TTFTPassages is the passage count of the time-to-first-token figures.
const TTFTPassages = 4

// Run measures.
func Run(ctx context.Context, m engine.Model, opts Options) (*Result, error) {
	if len(opts.Queries) == 0 {
		return nil, fmt.Errorf("nodebench: no queries")
	}
	if opts.DecodeTokens <= 0 {
		opts.DecodeTokens = 16
	}
	res := &Result{Prompts: len(opts.Queries), Threads: opts.Threads, DecodeMS: map[string]float64{}, DecodeMSContext: map[string]float64{}}
	maxP := PassageCounts[len(PassageCounts)-1]
	hits := make([][]decoder.Passage, len(opts.Queries))
	var retr []float64
	for i, q := range opts.Queries {
		start := time.Now()
		h, err := opts.Index.Search(ctx, q, maxP, retrieval.ModeAuto)
		if err != nil {
			return nil, fmt.Errorf("nodebench: search %q: %w", q, err)
		}
		retr = append(retr, timing.MS(time.Since(start)))
		hits[i] = Passages(h)
	}
	res.RetrievalMS = timing.Median(retr)

	out, err := decoder.New(m, decoder.Options{MaxPassages: maxP, CtxPerSeq: 512, Threads: opts.Threads})
	if err != nil {
		return nil, err
	}
	defer out.Close()
	ctxAgg, err := decoder.New(m, decoder.Options{MaxPassages: maxP, CtxPerSeq: 2048, Threads: opts.Threads, Mode: decoder.ContextAggregation})
	if err != nil {
		return nil, err
	}
	defer ctxAgg.Close()

	var prefill, ttft []float64
	for i, q := range opts.Queries {
		ps := hits[i][:min(TTFTPassages, len(hits[i]))]
		start := time.Now()
		if err := out.Begin(ctx, q, ps, nil); err != nil {
			return nil, err
		}
		prefill = append(prefill, timing.MS(time.Since(start)))
		if _, err := out.Next(ctx); err != nil { // the first token's distribution
			return nil, err
		}
		ttft = append(ttft, retr[i]+timing.MS(time.Since(start)))
	}
	res.PrefillMS, res.TTFTMS = timing.Median(prefill), timing.Median(ttft)
	res.RetrievalShare = res.RetrievalMS / res.TTFTMS

	for _, n := range PassageCounts {
		for _, c := range []struct {
			d   *decoder.Decoder
			dst map[string]float64
		}{{out, res.DecodeMS}, {ctxAgg, res.DecodeMSContext}} {
			var per []float64
			for i, q := range opts.Queries {
				ps := hits[i][:min(n, len(hits[i]))]
				r, err := c.d.Generate(ctx, decoder.Request{Query: q, Passages: ps, MaxTokens: opts.DecodeTokens}, nil)
				if err != nil {
					return nil, err
				}
				if len(r.Tokens) > 1 {
					per = append(per, r.DecodeMS/float64(len(r.Tokens)-1))
				}
			}
			c.dst[strconv.Itoa(n)] = timing.Median(per)
		}
	}
	res.Decode8Over1 = res.DecodeMS["8"] / res.DecodeMS["1"]

	if len(opts.Windows) > 0 {
		if err := perplexity(ctx, out, opts, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// perplexity scores the second half of each window given its first half,
// with no retrieval and with TTFTPassages passages retrieved for the first
// half from other documents (held out: the window's own source is
// excluded), output-aggregated.
func perplexity(ctx context.Context, d *decoder.Decoder, opts Options, res *Result) error {
	var nllPlain, nllRAG float64
	var count int
	for _, w := range opts.Windows {
		words := SplitHalf(w.Text)
		if words[0] == "" || words[1] == "" {
			continue
		}
		hits, err := opts.Index.Search(ctx, words[0], 4*TTFTPassages, retrieval.ModeAuto)
		if err != nil {
			return err
		}
		hits = slices.DeleteFunc(hits, func(h retrieval.Hit) bool { return h.Passage.Source == w.Source })
		hits = hits[:min(TTFTPassages, len(hits))]
		plain, n, err := NLL(ctx, d, []string{words[0]}, []float64{0}, words[1])
		if err != nil {
			return err
		}
		prefixes, scores := WithPassages(hits, words[0])
		rag, _, err := NLL(ctx, d, prefixes, scores, words[1])
		if err != nil {
			return err
		}
		nllPlain += plain
		nllRAG += rag
		count += n
		res.PPLWindows++
	}
	if count == 0 {
		return fmt.Errorf("nodebench: no usable perplexity windows")
	}
	res.PPLNoRetrieval = math.Exp(nllPlain / float64(count))
	res.PPLOutputAgg = math.Exp(nllRAG / float64(count))
	return nil
}

// NLL is the negative log-likelihood of cont after each prefix, under the
// mixture weighted by softmax(scores), and the number of tokens scored.
func NLL(ctx context.Context, d *decoder.Decoder, prefixes []string, scores []float64, cont string) (float64, int, error) {
	if err := d.BeginRaw(ctx, prefixes, scores); err != nil {
		return 0, 0, err
	}
	toks, err := d.Model().Tokenize(" "+cont, false, false)
	if err != nil {
		return 0, 0, err
	}
	rows, err := d.Verify(ctx, toks)
	if err != nil {
		return 0, 0, err
	}
	var sum float64
	for i, t := range toks {
		sum -= math.Log(max(float64(rows[i][t]), 1e-30))
	}
	return sum, len(toks), nil
}

// NLLDynamic is NLL with dynamic weights: the prompts' scores for the
// continuation's tokens at positions [j·every, (j+1)·every) are
// rescore(its first j·every tokens, as text), the first chunk's the given
// scores: the weights DRAGON's §4.1 gives each position, the continuation
// standing in for the answer so far. Each chunk is verified in one pass.
func NLLDynamic(ctx context.Context, d *decoder.Decoder, prefixes []string, scores []float64, cont string, every int,
	rescore func(ctx context.Context, answer string) ([]float64, error)) (float64, int, error) {
	m := d.Model()
	return nllChunked(ctx, d, prefixes, scores, cont, every, func(ctx context.Context, toks []engine.Token) ([]float64, error) {
		detok := engine.NewDetokenizer(m)
		var answer strings.Builder
		for _, t := range toks {
			answer.WriteString(detok.Add(t))
		}
		return rescore(ctx, answer.String()+detok.Flush())
	})
}

// NLLPosterior is NLL with posterior weights (decoder.Options.
// PosteriorEvery): the prompts' scores for the continuation's tokens at
// positions [j·every, (j+1)·every) are the given scores plus each
// prompt's log-likelihood of the first j·every tokens. With every 1 the
// continuation's NLL is −log Σ_d softmax(scores)_d · Π_t p(x_t | d, x_<t),
// the mixture of whole sequences (REPLUG's, RAG-Sequence's) rather than of
// tokens.
func NLLPosterior(ctx context.Context, d *decoder.Decoder, prefixes []string, scores []float64, cont string, every int) (float64, int, error) {
	d.SetEvidence(true)
	defer d.SetEvidence(false)
	return nllChunked(ctx, d, prefixes, scores, cont, every, func(ctx context.Context, toks []engine.Token) ([]float64, error) {
		ll, err := d.Evidence(ctx, len(toks))
		if err != nil {
			return nil, err
		}
		out := make([]float64, len(scores))
		for i := range out {
			out[i] = scores[i] + ll[i]
		}
		return out, nil
	})
}

// nllChunked is NLL with the scores of each chunk of every tokens from
// scoresAt(the continuation's tokens before it), the first chunk's the
// given scores; each chunk is verified in one pass.
func nllChunked(ctx context.Context, d *decoder.Decoder, prefixes []string, scores []float64, cont string, every int,
	scoresAt func(ctx context.Context, before []engine.Token) ([]float64, error)) (float64, int, error) {
	if every < 1 {
		return 0, 0, fmt.Errorf("nodebench: weights every %d tokens", every)
	}
	if err := d.BeginRaw(ctx, prefixes, scores); err != nil {
		return 0, 0, err
	}
	toks, err := d.Model().Tokenize(" "+cont, false, false)
	if err != nil {
		return 0, 0, err
	}
	var sum float64
	for from := 0; from < len(toks); from += every {
		chunk := toks[from:min(from+every, len(toks))]
		if from > 0 {
			s, err := scoresAt(ctx, toks[:from])
			if err != nil {
				return 0, 0, err
			}
			if err := d.SetScores(s); err != nil {
				return 0, 0, err
			}
		}
		// rows[i] is the distribution at from+i: after the chunk's
		// previous tokens (the one before it pending from the last pass).
		draft := chunk[:len(chunk)-1]
		rows, err := d.Verify(ctx, draft)
		if err != nil {
			return 0, 0, err
		}
		for i, t := range chunk {
			sum -= math.Log(max(float64(rows[i][t]), 1e-30))
		}
		if err := d.Commit(draft, len(draft), chunk); err != nil {
			return 0, 0, err
		}
	}
	return sum, len(toks), nil
}

// WithPassages is one prompt per passage, the passage before the text,
// weighted by the passages' scores (the text alone when there are none).
func WithPassages(hits []retrieval.Hit, text string) ([]string, []float64) {
	if len(hits) == 0 {
		return []string{text}, []float64{0}
	}
	prefixes := make([]string, len(hits))
	scores := make([]float64, len(hits))
	for i, h := range hits {
		prefixes[i] = h.Passage.Text + "\n\n" + text
		scores[i] = h.Score
	}
	return prefixes, scores
}

// SplitHalf cuts text into the first and the second half of its words.
func SplitHalf(text string) [2]string {
	words := strings.Fields(text)
	h := len(words) / 2
	return [2]string{strings.Join(words[:h], " "), strings.Join(words[h:], " ")}
}

// Passages converts retrieval hits for the decoder.
func Passages(hits []retrieval.Hit) []decoder.Passage {
	out := make([]decoder.Passage, len(hits))
	for i, h := range hits {
		out[i] = decoder.Passage{Text: h.Passage.Text, Score: h.Score, Source: h.Passage.Source}
	}
	return out
}
