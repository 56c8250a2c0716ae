package retrieval

import (
	"fmt"
	"math"
)

// Mode selects the ranker.
type Mode int

// Modes. ModeAuto (the zero value) is hybrid when the index has dense
// vectors and an embedder was given, BM25 otherwise.
const (
	ModeAuto Mode = iota
	ModeBM25
	ModeDense
	ModeHybrid
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeBM25:
		return "bm25"
	case ModeDense:
		return "dense"
	case ModeHybrid:
		return "hybrid"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode is the inverse of Mode.String.
func ParseMode(s string) (Mode, error) {
	for m := ModeAuto; m <= ModeHybrid; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("retrieval: unknown mode %q (auto, bm25, dense, hybrid)", s)
}

// Calibration of R(d, q). See score calibration in docs/DESIGN-NOTES.md:
// each ranker's raw score is first mapped onto a query-independent scale,
// then divided by a temperature chosen so that softmax(R) over a typical
// top 8 spreads its weight over a few passages instead of one or all.
const (
	// TempBM25 divides the BM25 score normalized by the query's upper
	// bound (so in [0, 1]): R ∈ [0, 10].
	TempBM25 = 0.1
	// TempDense divides the cosine similarity: R ∈ [-20, 20].
	TempDense = 0.05
	// TempRRF divides the RRF score normalized by its maximum, a passage
	// ranked first by every ranker: R ∈ (0, 10].
	TempRRF = 0.1
	// RRFK is the k of reciprocal rank fusion, 1/(k + rank) (Cormack et
	// al. 2009): large enough that one ranker's top hit does not drown the
	// other ranker's opinion.
	RRFK = 60
)

// bm25R maps a raw bleve BM25 score to R given the query's upper bound.
func bm25R(score, upper float64) float64 {
	if upper <= 0 {
		return 0
	}
	return min(1, max(0, score/upper)) / TempBM25
}

func denseR(cos float64) float64 { return cos / TempDense }

// rrfR maps a fused RRF score to R; rankers is how many were fused.
func rrfR(score float64, rankers int) float64 {
	best := float64(rankers) / (RRFK + 1)
	return score / best / TempRRF
}

// Weights returns softmax(R) over hits: DRAGON's document weights ω(d).
func Weights(hits []Hit) []float64 {
	if len(hits) == 0 {
		return nil
	}
	lse := LogSumExp(hits)
	w := make([]float64, len(hits))
	for i, h := range hits {
		w[i] = math.Exp(h.Score - lse)
	}
	return w
}

// LogSumExp returns log Σ exp R over hits: the h̃ a side sends with its
// drafts (DRAGON Appendix A.1), -Inf for no hits.
func LogSumExp(hits []Hit) float64 {
	m := math.Inf(-1)
	for _, h := range hits {
		m = max(m, h.Score)
	}
	if math.IsInf(m, -1) {
		return m
	}
	var s float64
	for _, h := range hits {
		s += math.Exp(h.Score - m)
	}
	return m + math.Log(s)
}
