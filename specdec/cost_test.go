package specdec

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExpectedTokens(t *testing.T) {
	require.InDelta(t, 1, ExpectedTokens(0, 5), 1e-12)
	require.InDelta(t, 1+0.5+0.25+0.125, ExpectedTokens(0.5, 3), 1e-12)
	require.InDelta(t, 4, ExpectedTokens(1, 3), 1e-12)
	require.InDelta(t, 1, ExpectedTokens(0.9, 0), 1e-12)
}

func TestVerifyTable(t *testing.T) {
	var tb VerifyTable
	require.InDelta(t, 1, tb.At(1), 1e-12, "empty: relative units")
	require.InDelta(t, 1+priorSlope*3, tb.At(4), 1e-12)
	tb.Set(1, 10)
	require.InDelta(t, 10*(1+priorSlope), tb.At(2), 1e-9, "one point: prior slope")
	tb.Set(8, 17)
	tb.Set(4, 12)
	for _, tc := range []struct {
		rows int
		want float64
	}{{1, 10}, {2, 10 + 2.0/3}, {4, 12}, {6, 14.5}, {8, 17}, {16, 27}} {
		require.InDelta(t, tc.want, tb.At(tc.rows), 1e-9, "rows %d", tc.rows)
	}
	tb.Observe(4, 22)
	require.InDelta(t, 12, tb.At(4), 1e-9, "two measurements: the faster")
	tb.Observe(4, 100) // a stalled pass
	require.InDelta(t, 22, tb.At(4), 1e-9, "median of 12, 22, 100")
	tb.Observe(4, 13)
	tb.Observe(4, 12)
	require.InDelta(t, 13, tb.At(4), 1e-9, "the outlier no longer counts")
	for range costWindow {
		tb.Observe(4, 30)
	}
	require.InDelta(t, 30, tb.At(4), 1e-9, "only the last measurements count")
	tb.Observe(6, 31) // a new size
	require.InDelta(t, 31, tb.At(6), 1e-9)
	tb.Observe(6, 90) // stalled before the size settled: it stays cheap enough to be tried again
	require.InDelta(t, 31, tb.At(6), 1e-9)
	tb.Set(16, 5) // noisy measurement: extrapolation never decreases
	require.GreaterOrEqual(t, tb.At(32), 5.0)
}

// model with verification at base ms for one row and perRow ms per extra row.
func testModel(alpha float64, base, perRow float64) *CostModel {
	var tb VerifyTable
	for n := 1; n <= 64; n *= 2 {
		tb.Set(n, base+perRow*float64(n-1))
	}
	acc := NewAcceptance(alpha)
	m := NewCostModel(acc, &tb, 16)
	m.DraftMs = 0.001
	return m
}

func TestChoose(t *testing.T) {
	tests := []struct {
		name           string
		alpha          float64
		base, perRow   float64
		avail          int
		minGam, maxGam int
	}{
		{"tiny acceptance: don't speculate", 0.05, 10, 1, 16, 0, 0},
		{"high acceptance, cheap verification: long drafts", 0.9, 10, 0.2, 16, 10, 16},
		{"high acceptance, costly verification: short drafts", 0.9, 10, 5, 16, 1, 3},
		{"verification as costly as decoding: never", 0.9, 10, 10, 16, 0, 0},
		{"bounded by what the drafter has", 0.9, 10, 0.2, 3, 3, 3},
		{"nothing drafted", 0.9, 10, 0.2, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := testModel(tc.alpha, tc.base, tc.perRow)
			p := m.Choose(3, tc.avail)
			require.GreaterOrEqual(t, p.Gamma, tc.minGam)
			require.LessOrEqual(t, p.Gamma, tc.maxGam)
			// The choice is the argmax of predicted throughput.
			best := 1 / m.TreeCost(0, 1)
			for g := 1; g <= min(tc.avail, m.MaxDraft); g++ {
				best = math.Max(best, m.Speedup(m.Acc.Alpha(3), g)/m.TreeCost(0, 1))
			}
			if p.Gamma > 0 {
				require.InDelta(t, best, p.Tokens/p.Ms, 1e-9)
				require.Greater(t, m.Speedup(m.Acc.Alpha(3), p.Gamma), 1+m.Margin)
			}
		})
	}
}

func TestChooseMultipliesRowsBySequences(t *testing.T) {
	m := testModel(0.8, 10, 1)
	one := m.Choose(3, 16).Gamma
	m.Seqs = 8 // eight passages: every draft token costs eight rows
	require.Less(t, m.Choose(3, 16).Gamma, one)
}

func TestAcceptanceLearnsPerBucket(t *testing.T) {
	acc := NewAcceptance(0.5)
	require.InDelta(t, 0.5, acc.Alpha(7), 1e-12)
	for range 200 {
		acc.Observe(20, 9, 10) // long matches: 90%
		acc.Observe(1, 1, 10)  // single-token matches: 10%
	}
	require.InDelta(t, 0.9, acc.Alpha(17), 0.02)
	require.InDelta(t, 0.1, acc.Alpha(1), 0.02)
	require.InDelta(t, 0.5, acc.Alpha(MatchReuse), 0.05, "unseen bucket: the global rate")
	acc.Observe(20, 5, 0) // nothing attempted: ignored
	require.InDelta(t, 0.9, acc.Alpha(17), 0.02)
	for range 500 {
		acc.Observe(20, 1, 2) // the workload changed
	}
	require.InDelta(t, 0.5, acc.Alpha(17), 0.02, "old observations decay")
	require.Equal(t, []int{0, 1, 2, 3, 4, 4, 5, 5, 6, 7, 7}, []int{
		bucket(MatchReuse), bucket(0), bucket(1), bucket(2), bucket(3), bucket(4), bucket(5), bucket(8), bucket(9), bucket(17), bucket(1000)})
}

func TestObserveLearnsAndLogs(t *testing.T) {
	m := testModel(0.2, 10, 1)
	m.Window = 4
	for range 40 {
		p := m.Choose(5, 4)
		// The real workload: drafts of 4 accepted in full, verification at
		// 10 ms + 1 ms/row, drafting 0.01 ms/token.
		g := max(p.Gamma, 4)
		p.Gamma = g
		m.Observe(p, Outcome{Accepted: g, Attempted: g, Rows: g + 1, Seqs: 1, DraftMs: 0.01 * float64(g), VerifyMs: 10 + float64(g)})
	}
	require.Greater(t, m.Acc.Alpha(5), 0.9)
	require.Equal(t, 4, m.Choose(5, 4).Gamma)
	require.InDelta(t, 0.01, m.DraftMs, 0.001)
	require.Equal(t, 10, m.Log.Len())
	pairs := m.Log.Pairs()
	last := pairs[len(pairs)-1]
	require.InDelta(t, last[1], 1000*5/14.04, 1e-6, "measured: 5 tokens per 14.04 ms")
	require.Less(t, math.Abs(last[0]-last[1])/last[1], 0.25, "prediction converged")
}

// TestLeafCostIsFitted: tree passes whose extra sequences cost 3 ms each
// beyond their rows' plain price teach the model LeafMs = 3, and the rows'
// own price stays the plain passes' (a pass whose rows cost nearly nothing
// more, as under a memory budget, then prices its branches as measured).
func TestLeafCostIsFitted(t *testing.T) {
	m := testModel(0.5, 10, 1)
	cost := func(rows int) float64 { return 100 + 0.5*float64(rows) } // reads dominate: rows are nearly free
	for range 60 {
		for _, rows := range []int{1, 5, 9} {
			m.Observe(Plan{}, Outcome{Rows: rows, Seqs: 1, VerifyMs: cost(rows)})
			m.Observe(Plan{}, Outcome{Rows: rows, Seqs: 4, VerifyMs: cost(rows) + 3*3})
		}
	}
	require.InDelta(t, 3, m.Verify.LeafMs, 0.05)
	require.InDelta(t, cost(5), m.Verify.At(5), 0.2, "the rows' price is the plain passes'")
	require.InDelta(t, cost(9)+3*3, m.TreeCost(8, 4), 0.5)
}

func TestPredictionLog(t *testing.T) {
	var l PredictionLog
	require.True(t, math.IsNaN(l.MAPE()))
	l.Add(110, 100)
	l.Add(90, 100)
	l.Add(150, 100)
	l.Add(5, 0) // nothing measured: skipped
	require.InDelta(t, (10.0+10+50)/3, l.MAPE(), 1e-9)
	require.Equal(t, 4, l.Len())
}
