package retrievalbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dragon-rag/dragon/retrieval"
)

// QualityOptions configure Quality.
type QualityOptions struct {
	// Passages are the corpus's passages (a real corpus's, cut by the
	// index's chunker).
	Passages []string
	// Questions are the labelled questions; those whose answer no passage
	// holds are dropped before sampling.
	Questions []Question
	// Sample is how many answerable questions are asked (default 200).
	Sample int
	// Pool is how many passages the evaluation corpus holds (default
	// 2000): up to PositivesPer passages holding each sampled question's
	// answer, the rest drawn at random from Passages. 0 or more than
	// there are: every passage.
	Pool int
	// PositivesPer caps the passages taken for holding one question's
	// answer (default 3).
	PositivesPer int
	// Embedders to compare, by name; BM25 is always measured.
	Embedders map[string]retrieval.Embedder
	// Tokenizer cuts passages (the chat model's).
	Tokenizer retrieval.Tokenizer
	// Ks are the cut-offs of answer recall (default 1, 5, 10, 20).
	Ks   []int
	Seed uint64
	// Dir is a scratch directory (default a temporary one).
	Dir string
	// Log, if set, reports progress.
	Log func(format string, args ...any)
	// Reranker, if set, re-ranks the first RerankCandidates passages of the
	// RerankFirst ranker (a key of Recall, e.g. "minilm-hybrid"):
	// QualityResult.Rerank.
	Reranker         Scorer
	RerankCandidates int
	RerankFirst      string
}

// Scorer scores passages against a question (a cross-encoder).
type Scorer interface {
	Score(ctx context.Context, query string, passages []string) ([]float32, error)
}

// RerankResult is answer recall@k of the first stage's top k ("off") and
// of the cross-encoder's top k of its first Candidates ("on"), and the
// cross-encoder's median time per (question, passage) pair.
type RerankResult struct {
	FirstStage string                        `json:"first_stage"`
	Candidates int                           `json:"candidates"`
	RecallAt   map[string]map[string]float64 `json:"recall_at"`
	MsPerPair  float64                       `json:"ms_per_pair"`
}

// QualityResult is answer recall@k (the share of questions with an answer
// in the top k) per ranker: "bm25", "NAME-dense", "NAME-hybrid".
type QualityResult struct {
	Questions  int                           `json:"questions"`
	Answerable int                           `json:"answerable_in_corpus"`
	Passages   int                           `json:"passages"`
	Recall     map[string]map[string]float64 `json:"answer_recall"`
	// BuildSeconds is each embedder's index build (embedding included).
	BuildSeconds map[string]float64 `json:"build_s"`
	Rerank       *RerankResult      `json:"rerank,omitempty"`
}

// Quality builds one index over the evaluation corpus per embedder and
// asks every sampled question of every ranker.
func Quality(ctx context.Context, o QualityOptions) (QualityResult, error) {
	if o.Sample <= 0 {
		o.Sample = 200
	}
	if o.PositivesPer <= 0 {
		o.PositivesPer = 3
	}
	if len(o.Ks) == 0 {
		o.Ks = []int{1, 5, 10, 20}
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "dragon-retrieval-quality-")
		if err != nil {
			return QualityResult{}, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	answers := NewAnswerIndex(o.Passages)
	var answerable []labelled
	for _, q := range o.Questions {
		if h := answers.Holding(q.Answers); len(h) > 0 {
			answerable = append(answerable, labelled{q, h})
		}
	}
	if len(answerable) == 0 {
		return QualityResult{}, fmt.Errorf("retrievalbench: no question's answer is in the %d passages", len(o.Passages))
	}
	rng.Shuffle(len(answerable), func(i, j int) { answerable[i], answerable[j] = answerable[j], answerable[i] })
	sample := answerable[:min(o.Sample, len(answerable))]

	pick := map[int]bool{}
	if o.Pool <= 0 || o.Pool >= len(o.Passages) {
		for i := range o.Passages {
			pick[i] = true
		}
	} else {
		for _, l := range sample {
			h := slices.Clone(l.holding)
			rng.Shuffle(len(h), func(i, j int) { h[i], h[j] = h[j], h[i] })
			for _, p := range h[:min(len(h), o.PositivesPer)] {
				pick[p] = true
			}
		}
		for len(pick) < o.Pool {
			pick[rng.IntN(len(o.Passages))] = true
		}
	}
	corpus := filepath.Join(o.Dir, "corpus")
	if err := os.MkdirAll(corpus, 0o755); err != nil {
		return QualityResult{}, err
	}
	for p := range pick {
		if err := os.WriteFile(filepath.Join(corpus, fmt.Sprintf("p%07d.txt", p)), []byte(o.Passages[p]), 0o644); err != nil {
			return QualityResult{}, err
		}
	}
	res := QualityResult{
		Questions: len(sample), Answerable: len(answerable), Passages: len(pick),
		Recall: map[string]map[string]float64{}, BuildSeconds: map[string]float64{},
	}
	o.Log("%d of %d questions answerable in the corpus; asking %d over %d passages", len(answerable), len(o.Questions), len(sample), len(pick))
	if o.Reranker != nil && o.RerankCandidates < 1 {
		return res, fmt.Errorf("retrievalbench: %d re-ranking candidates", o.RerankCandidates)
	}

	names := []string{""} // BM25 only
	for name := range o.Embedders {
		names = append(names, name)
	}
	slices.Sort(names[1:])
	for _, name := range names {
		opts := retrieval.Options{Tokenizer: o.Tokenizer, Chunk: retrieval.ChunkOptions{Tokens: 1 << 20}}
		modes := []retrieval.Mode{retrieval.ModeBM25}
		label := "bm25"
		if name != "" {
			opts.Embedder = o.Embedders[name]
			modes = []retrieval.Mode{retrieval.ModeDense, retrieval.ModeHybrid}
			label = name
		}
		start := time.Now()
		ix, _, err := retrieval.Build(ctx, filepath.Join(o.Dir, "index-"+label), opts, corpus)
		if err != nil {
			return res, fmt.Errorf("retrievalbench: index with %s: %w", label, err)
		}
		res.BuildSeconds[label] = time.Since(start).Seconds()
		o.Log("%s: built in %.1fs", label, res.BuildSeconds[label])
		for _, mode := range modes {
			key := label
			if name != "" {
				key = fmt.Sprintf("%s-%s", name, mode)
			}
			rec, err := recall(ctx, ix, sample, mode, o.Ks)
			if err != nil {
				ix.Close()
				return res, fmt.Errorf("retrievalbench: %s: %w", key, err)
			}
			res.Recall[key] = rec
			o.Log("%s: %v", key, rec)
			if o.Reranker != nil && key == o.RerankFirst {
				if res.Rerank, err = rerankRecall(ctx, ix, sample, mode, o); err != nil {
					ix.Close()
					return res, fmt.Errorf("retrievalbench: re-ranking %s: %w", key, err)
				}
				res.Rerank.FirstStage = key
				o.Log("re-ranking %d of %s: %v, %.1f ms a pair", res.Rerank.Candidates, key, res.Rerank.RecallAt, res.Rerank.MsPerPair)
			}
		}
		ix.Close()
	}
	return res, nil
}

// labelled is a question and the passages of the corpus holding its answer.
type labelled struct {
	q       Question
	holding []int
}

// recall asks every question and counts those with an answer in the top
// k, for each k.
func recall(ctx context.Context, ix *retrieval.Index, sample []labelled, mode retrieval.Mode, ks []int) (map[string]float64, error) {
	kmax := slices.Max(ks)
	hits := make([]int, len(ks))
	for _, l := range sample {
		q := l.q
		res, err := ix.Search(ctx, q.Text, kmax, mode)
		if err != nil {
			return nil, err
		}
		first := -1
		for r, h := range res {
			if HasAnswer(h.Passage.Text, q.Answers) {
				first = r
				break
			}
		}
		for i, k := range ks {
			if first >= 0 && first < k {
				hits[i]++
			}
		}
	}
	out := map[string]float64{}
	for i, k := range ks {
		out[fmt.Sprintf("@%d", k)] = float64(hits[i]) / float64(len(sample))
	}
	return out, nil
}

// rerankRecall asks each question of the first stage for the candidates,
// scores them one pair at a time (timing each) and compares recall@k of
// the two orders.
func rerankRecall(ctx context.Context, ix *retrieval.Index, sample []labelled, mode retrieval.Mode, o QualityOptions) (*RerankResult, error) {
	off, on := make([]int, len(o.Ks)), make([]int, len(o.Ks))
	var pairMS []float64
	for _, l := range sample {
		hits, err := ix.Search(ctx, l.q.Text, o.RerankCandidates, mode)
		if err != nil {
			return nil, err
		}
		scores := make([]float32, len(hits))
		for i, h := range hits {
			start := time.Now()
			s, err := o.Reranker.Score(ctx, l.q.Text, []string{h.Passage.Text})
			if err != nil {
				return nil, err
			}
			pairMS = append(pairMS, float64(time.Since(start).Microseconds())/1000)
			scores[i] = s[0]
		}
		order := make([]int, len(hits))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case scores[a] > scores[b]:
				return -1
			case scores[a] < scores[b]:
				return 1
			}
			return 0
		})
		firstOff, firstOn := -1, -1
		for r := range hits {
			if firstOff < 0 && HasAnswer(hits[r].Passage.Text, l.q.Answers) {
				firstOff = r
			}
			if firstOn < 0 && HasAnswer(hits[order[r]].Passage.Text, l.q.Answers) {
				firstOn = r
			}
		}
		for i, k := range o.Ks {
			if firstOff >= 0 && firstOff < k {
				off[i]++
			}
			if firstOn >= 0 && firstOn < k {
				on[i]++
			}
		}
	}
	res := &RerankResult{Candidates: o.RerankCandidates, RecallAt: map[string]map[string]float64{}}
	for i, k := range o.Ks {
		if k > o.RerankCandidates {
			continue // both orders hold the same candidates
		}
		n := float64(len(sample))
		res.RecallAt[fmt.Sprint(k)] = map[string]float64{"off": float64(off[i]) / n, "on": float64(on[i]) / n}
	}
	if len(pairMS) > 0 {
		slices.Sort(pairMS)
		res.MsPerPair = pairMS[len(pairMS)/2]
	}
	return res, nil
}
