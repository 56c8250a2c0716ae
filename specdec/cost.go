package specdec

import (
	"math"
	"slices"
)

// VerifyTable holds the measured milliseconds of one forward pass by batch
// rows, interpolated linearly between measurements (Lever's verification
// profile). Fill it from the profiler; Observe refines it online.
type VerifyTable struct {
	pts []costPoint // ascending rows
	// LeafMs is the extra cost of each KV sequence a pass adds beyond the
	// plain decode's (tree branches: sequence copies and bookkeeping).
	LeafMs float64
}

type costPoint struct {
	rows   int
	ms     float64   // the size's cost (Observe says how)
	recent []float64 // the last costWindow measurements, oldest first
}

// costWindow is how many recent measurements of a size its cost is the
// median of: robust to the occasional pass a shared machine stalls (one
// such pass in a moving average would inflate the one-row cost for many
// steps and make drafts look cheap).
const costWindow = 9

// settledSamples is how many measurements of a size make its median
// trusted. Below that the size costs the least of them: a stall only ever
// lengthens a pass, and a size priced by one stalled pass would never be
// chosen, so never measured again, and speculation would stay off for good.
// Priced by its fastest pass it is tried, and measured, until it settles.
const settledSamples = 3

// leafRate is how far one tree pass moves LeafMs toward what it measured.
const leafRate = 0.2

// priorSlope: with fewer than two measurements, each extra row is assumed
// to cost this fraction of a one-row pass. A placeholder until measured.
const priorSlope = 0.2

// Clone is an independent copy, for another decoder to refine.
func (t *VerifyTable) Clone() *VerifyTable {
	c := &VerifyTable{pts: slices.Clone(t.pts), LeafMs: t.LeafMs}
	for i := range c.pts {
		c.pts[i].recent = slices.Clone(c.pts[i].recent)
	}
	return c
}

// Set records a measurement, replacing what the table held at that size.
func (t *VerifyTable) Set(rows int, ms float64) {
	i, found := slices.BinarySearchFunc(t.pts, rows, func(p costPoint, r int) int { return p.rows - r })
	if found {
		t.pts[i] = costPoint{rows: rows, ms: ms, recent: []float64{ms}}
		return
	}
	t.pts = slices.Insert(t.pts, i, costPoint{rows: rows, ms: ms, recent: []float64{ms}})
}

// Observe adds a measurement: the size's cost becomes the median of its
// last costWindow measurements, or their least while fewer than
// settledSamples.
func (t *VerifyTable) Observe(rows int, ms float64) {
	i, found := slices.BinarySearchFunc(t.pts, rows, func(p costPoint, r int) int { return p.rows - r })
	if !found {
		t.Set(rows, ms)
		return
	}
	p := &t.pts[i]
	if len(p.recent) == costWindow {
		p.recent = append(p.recent[:0], p.recent[1:]...)
	}
	p.recent = append(p.recent, ms)
	sorted := slices.Sorted(slices.Values(p.recent))
	n := len(sorted)
	if n < settledSamples {
		p.ms = sorted[0]
		return
	}
	p.ms = (sorted[(n-1)/2] + sorted[n/2]) / 2
}

// At estimates the milliseconds of a pass of rows rows. Beyond the measured
// range it extrapolates the nearest segment's slope (never decreasing).
// With no measurement it returns relative units, a one-row pass costing 1.
func (t *VerifyTable) At(rows int) float64 {
	switch len(t.pts) {
	case 0:
		return 1 + priorSlope*float64(rows-1)
	case 1:
		p := t.pts[0]
		base := p.ms / (1 + priorSlope*float64(p.rows-1))
		return base * (1 + priorSlope*float64(rows-1))
	}
	i, _ := slices.BinarySearchFunc(t.pts, rows, func(p costPoint, r int) int { return p.rows - r })
	i = min(max(i, 1), len(t.pts)-1)
	a, b := t.pts[i-1], t.pts[i]
	slope := max(0, (b.ms-a.ms)/float64(b.rows-a.rows))
	return max(a.ms+slope*float64(rows-a.rows), math.SmallestNonzeroFloat64)
}

// ExpectedTokens is the expected number of tokens one verification of a
// γ-token draft emits (accepted + correction) at per-token acceptance α:
// (1 − α^{γ+1})/(1 − α).
func ExpectedTokens(alpha float64, gamma int) float64 {
	if alpha >= 1 {
		return float64(gamma + 1)
	}
	return (1 - math.Pow(alpha, float64(gamma+1))) / (1 - alpha)
}

// CostModel decides whether and how far to speculate (003 Eq. 1 with a
// measured verification table): the speedup of a γ-token draft over plain
// decoding is S(α, γ) = E[tokens](α, γ)·t_decode / (t_draft(γ) + t_verify(γ+1)).
type CostModel struct {
	Verify *VerifyTable
	Acc    *Acceptance
	// Seqs is the number of KV sequences each pass decodes (one per
	// retrieved passage): a pass of n tokens has n·Seqs rows.
	Seqs int
	// MaxDraft bounds γ.
	MaxDraft int
	// Margin: speculate only when the predicted speedup exceeds 1+Margin,
	// so that estimation noise does not buy slower steps.
	Margin float64
	// DraftMs is the drafting cost per draft token (moving average; 0:
	// not measured yet, and the first measurement replaces it).
	DraftMs float64
	// Window is how many steps are pooled into one PredictionLog entry:
	// single steps emit a geometric number of tokens, too noisy to score.
	Window int
	Log    PredictionLog

	win window
}

// window pools the predictions and measurements of a few steps.
type window struct {
	steps           int
	predTok, predMs float64
	measTok, measMs float64
}

// NewCostModel returns a model over one sequence with a 5% margin.
func NewCostModel(acc *Acceptance, table *VerifyTable, maxDraft int) *CostModel {
	return &CostModel{Verify: table, Acc: acc, Seqs: 1, MaxDraft: maxDraft, Margin: 0.05, DraftMs: 0.01, Window: 16}
}

// Plan is a decision for one step, to be handed back to Observe.
type Plan struct {
	// Gamma is the number of draft tokens (tree nodes) to verify; 0 means
	// decode the pending token alone.
	Gamma    int
	MatchLen int     // acceptance bucket of the draft
	Tokens   float64 // predicted tokens emitted
	Ms       float64 // predicted step time
}

// TreeCost predicts the milliseconds of drafting and verifying a tree of
// nodes draft nodes and leaves branches (a linear draft has one leaf).
func (m *CostModel) TreeCost(nodes, leaves int) float64 {
	return m.DraftMs*float64(nodes) + m.Verify.At((nodes+1)*m.Seqs) + m.Verify.LeafMs*float64((leaves-1)*m.Seqs)
}

// Speedup is S(α, γ) against plain decoding.
func (m *CostModel) Speedup(alpha float64, gamma int) float64 {
	return ExpectedTokens(alpha, gamma) * m.TreeCost(0, 1) / m.TreeCost(gamma, 1)
}

// Choose picks the draft length maximizing predicted tokens per second for
// a draft made from a match of matchLen with avail tokens on offer, or 0
// when no length beats plain decoding by the margin.
func (m *CostModel) Choose(matchLen, avail int) Plan {
	alpha := m.Acc.Alpha(matchLen)
	best := Plan{MatchLen: matchLen, Tokens: 1, Ms: m.TreeCost(0, 1)}
	bestS := 1 + m.Margin
	for g := 1; g <= min(avail, m.MaxDraft); g++ {
		if s := m.Speedup(alpha, g); s > bestS {
			bestS = s
			best = Plan{Gamma: g, MatchLen: matchLen, Tokens: ExpectedTokens(alpha, g), Ms: m.TreeCost(g, 1)}
		}
	}
	return best
}

// Plan is the plan of verifying a linear draft of gamma tokens from a match
// of matchLen, whatever Choose would say (exploration).
func (m *CostModel) Plan(matchLen, gamma int) Plan {
	alpha := m.Acc.Alpha(matchLen)
	return Plan{Gamma: gamma, MatchLen: matchLen, Tokens: ExpectedTokens(alpha, gamma), Ms: m.TreeCost(gamma, 1)}
}

// PlanTree is the plan of a tree built by BuildTree.
func (m *CostModel) PlanTree(t *Tree, matchLen int) Plan {
	return Plan{Gamma: t.Size(), MatchLen: matchLen, Tokens: t.Gain, Ms: t.Cost}
}

// Outcome is what one step measured.
type Outcome struct {
	Accepted, Attempted int // from the Verdict
	Rows                int // batch entries of the verification pass
	Seqs                int // KV sequences it decoded
	DraftMs, VerifyMs   float64
}

// Observe updates acceptance, costs and the prediction log with the outcome
// of a step planned as p.
func (m *CostModel) Observe(p Plan, o Outcome) {
	m.Acc.Observe(p.MatchLen, o.Accepted, o.Attempted)
	if o.VerifyMs > 0 && o.Rows > 0 {
		extra := float64(max(0, o.Seqs-m.Seqs))
		if extra > 0 {
			// What the pass cost beyond its rows' price in a plain pass is
			// its extra sequences': fitted as the decode cost is, so that a
			// pass whose rows are nearly free (weights read from storage
			// under a memory budget) prices its branches as measured.
			perLeaf := max(o.VerifyMs-m.Verify.At(o.Rows), 0) / extra
			m.Verify.LeafMs = (1-leafRate)*m.Verify.LeafMs + leafRate*perLeaf
		}
		m.Verify.Observe(o.Rows, max(o.VerifyMs-m.Verify.LeafMs*extra, 0))
	}
	if p.Gamma > 0 && o.DraftMs > 0 {
		per := o.DraftMs / float64(p.Gamma)
		if m.DraftMs > 0 {
			per = 0.8*m.DraftMs + 0.2*per
		}
		m.DraftMs = per // the first measurement as it is: 0 means unknown
	}
	w := &m.win
	w.steps++
	w.predTok += p.Tokens
	w.predMs += p.Ms
	w.measTok += float64(o.Accepted + 1)
	w.measMs += o.DraftMs + o.VerifyMs
	if w.steps >= max(m.Window, 1) {
		if w.predMs > 0 && w.measMs > 0 {
			m.Log.Add(1000*w.predTok/w.predMs, 1000*w.measTok/w.measMs)
		}
		*w = window{}
	}
}

// PredictionLog pairs predicted and measured throughputs (tokens/s).
type PredictionLog struct {
	pairs [][2]float64
}

// Add records one prediction and what was measured.
func (l *PredictionLog) Add(predicted, measured float64) {
	l.pairs = append(l.pairs, [2]float64{predicted, measured})
}

// Len is the number of pairs.
func (l *PredictionLog) Len() int { return len(l.pairs) }

// Pairs returns the (predicted, measured) pairs, oldest first.
func (l *PredictionLog) Pairs() [][2]float64 { return slices.Clone(l.pairs) }

// MAPE is the mean absolute percentage error of the predictions, in
// percent; pairs with no measured value are skipped, and NaN means none.
func (l *PredictionLog) MAPE() float64 {
	var s float64
	n := 0
	for _, p := range l.pairs {
		if p[1] == 0 {
			continue
		}
		s += math.Abs(p[0]-p[1]) / math.Abs(p[1])
		n++
	}
	if n == 0 {
		return math.NaN()
	}
	return 100 * s / float64(n)
}
