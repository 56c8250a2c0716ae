// Package sampling turns next-token scores into the distribution a token is
// drawn from, and draws it. Scores are logits or log-probabilities (the
// decoders pass the log of an aggregated mixture); every transform works on
// that log scale, so greedy decoding, temperature, top-k, top-p, min-p and a
// repetition penalty apply the same way to one sequence or to a mixture.
package sampling

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Params select the transforms. The zero value is greedy decoding.
type Params struct {
	Temperature   float64 // 0: greedy (argmax, ties to the lower id)
	TopK          int     // keep the k most likely tokens (0: off)
	TopP          float64 // keep the smallest set with this much mass (0 or 1: off)
	MinP          float64 // drop tokens below MinP × the top probability (0: off)
	RepeatPenalty float64 // CTRL-style penalty on recent tokens (0 or 1: off)
	RepeatLastN   int     // how many recent tokens the penalty sees (0: 64)
	Seed          uint64
}

// Greedy reports whether the parameters select the argmax.
func (p Params) Greedy() bool { return p.Temperature <= 0 }

// Validate rejects parameters that make no sense.
func (p Params) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(p.Temperature) || p.Temperature > 100:
		return fmt.Errorf("sampling: temperature %v outside [0, 100]", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("sampling: top-k %d is negative", p.TopK)
	case p.TopP < 0 || p.TopP > 1 || math.IsNaN(p.TopP):
		return fmt.Errorf("sampling: top-p %v outside [0, 1]", p.TopP)
	case p.MinP < 0 || p.MinP > 1 || math.IsNaN(p.MinP):
		return fmt.Errorf("sampling: min-p %v outside [0, 1]", p.MinP)
	case p.RepeatPenalty < 0 || math.IsNaN(p.RepeatPenalty):
		return fmt.Errorf("sampling: repetition penalty %v is negative", p.RepeatPenalty)
	case p.RepeatLastN < 0:
		return fmt.Errorf("sampling: repeat-last-n %d is negative", p.RepeatLastN)
	}
	return nil
}

// NewRand is the seeded generator a generation samples with.
func (p Params) NewRand() *rand.Rand {
	return rand.New(rand.NewPCG(p.Seed, p.Seed^0x6a09e667f3bcc909))
}

// Dist writes into dst the distribution the next token is drawn from, given
// scores and the tokens generated so far (for the penalty), and returns it.
// For greedy parameters it is one-hot on the (penalised) argmax.
func (p Params) Dist(scores []float32, history []int32, dst []float32) []float32 {
	dst = append(dst[:0], scores...)
	if p.RepeatPenalty > 0 && p.RepeatPenalty != 1 {
		n := p.RepeatLastN
		if n == 0 {
			n = 64
		}
		seen := map[int32]bool{}
		for _, t := range history[max(0, len(history)-n):] {
			if t < 0 || int(t) >= len(dst) || seen[t] {
				continue
			}
			seen[t] = true
			if dst[t] > 0 {
				dst[t] /= float32(p.RepeatPenalty)
			} else {
				dst[t] *= float32(p.RepeatPenalty)
			}
		}
	}
	if p.Greedy() {
		best := Argmax(dst)
		clear(dst)
		dst[best] = 1
		return dst
	}
	// Softmax at temperature, in float64 for the sum.
	maxv := dst[Argmax(dst)]
	var sum float64
	for i, v := range dst {
		e := math.Exp(float64(v-maxv) / p.Temperature)
		dst[i] = float32(e)
		sum += e
	}
	for i := range dst {
		dst[i] = float32(float64(dst[i]) / sum)
	}
	if p.TopK > 0 || (p.TopP > 0 && p.TopP < 1) || p.MinP > 0 {
		truncate(dst, p)
	}
	return dst
}

// truncate zeroes the tokens the filters drop and renormalises.
func truncate(probs []float32, p Params) {
	idx := make([]int32, 0, len(probs))
	for i, v := range probs {
		if v > 0 {
			idx = append(idx, int32(i))
		}
	}
	slices.SortFunc(idx, func(a, b int32) int {
		switch {
		case probs[a] > probs[b]:
			return -1
		case probs[a] < probs[b]:
			return 1
		}
		return int(a - b)
	})
	keep := len(idx)
	if p.TopK > 0 {
		keep = min(keep, p.TopK)
	}
	if p.MinP > 0 && len(idx) > 0 {
		floor := float32(p.MinP) * probs[idx[0]]
		for i := 1; i < keep; i++ {
			if probs[idx[i]] < floor {
				keep = i
				break
			}
		}
	}
	if p.TopP > 0 && p.TopP < 1 {
		var cum float64
		for i := 0; i < keep; i++ {
			cum += float64(probs[idx[i]])
			if cum >= p.TopP {
				keep = i + 1
				break
			}
		}
	}
	var sum float64
	for _, t := range idx[:keep] {
		sum += float64(probs[t])
	}
	for _, t := range idx[keep:] {
		probs[t] = 0
	}
	for _, t := range idx[:keep] {
		probs[t] = float32(float64(probs[t]) / sum)
	}
}

// Argmax is the index of the largest value, the lowest index on ties.
func Argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// Draw samples an index from a distribution (non-negative, summing to ~1).
func Draw(probs []float32, r *rand.Rand) int32 { return DrawU(probs, r.Float64()) }

// DrawU is the inverse-CDF sample of probs at u ∈ [0, 1): the first index
// whose cumulative mass exceeds u.
func DrawU(probs []float32, u float64) int32 {
	var cum float64
	last := -1
	for i, p := range probs {
		if p <= 0 {
			continue
		}
		cum += float64(p)
		last = i
		if u < cum {
			return int32(i)
		}
	}
	if last < 0 {
		return 0
	}
	return int32(last) // rounding left u above the total
}

// Uniform is the uniform number in [0, 1) that decides the token at
// position pos of an answer under p.Seed. Tying the randomness to the
// position, not to a stream, makes an answer reproducible however it was
// computed: speculative decoding that accepts a draft token exactly when it
// equals DrawU(p_t, Uniform(t)) emits the very tokens plain sampling does.
func (p Params) Uniform(pos int) float64 {
	x := p.Seed ^ (uint64(pos)+1)*0x9e3779b97f4a7c15
	// splitmix64 finalizer
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}
