package codec

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// BenchTopPs are the top-p values whose distortion Bench reports.
var BenchTopPs = []float64{0.8, 0.9, 0.95, 0.99}

// BenchResult is what `dragon bench codec --json` prints.
type BenchResult struct {
	Tokens int     `json:"tokens"`
	Vocab  int     `json:"vocab"`
	TopP   float64 `json:"top_p"` // mass kept for the size and time figures
	// BytesPerToken is the median payload size.
	BytesPerToken float64 `json:"bytes_per_token"`
	// RatioVsFP32 is the full-vocabulary fp32 size (4·V bytes a token)
	// over the payload size, both summed over all tokens: the bandwidth a
	// whole generation saves.
	RatioVsFP32 float64 `json:"ratio_vs_fp32"`
	// RatioVsJSON is the same against json.Marshal of the []float32
	// (what the public DRAGON code sent, pickled, roughly).
	RatioVsJSON float64 `json:"ratio_vs_json"`
	// EncDecUS is the median time to encode and decode one token, in
	// microseconds (best of a few repeats per token, to shed scheduler
	// noise).
	EncDecUS float64 `json:"encdec_us"`
	// TVD is the median total variation distance between each input
	// distribution and its decoded form, keyed by top-p ("0.8", ...).
	TVD map[string]float64 `json:"tvd"`
}

// benchRepeats is how many times each token is encoded and decoded for the
// timing; the fastest counts.
const benchRepeats = 5

// Bench measures the codec on real next-token distributions (one per
// generated token; all of the same vocabulary) and the tokens drafted from
// them (nil: none). It does no I/O; callers print the result.
func Bench(dists [][]float32, drafted []int32) (BenchResult, error) {
	if len(dists) == 0 {
		return BenchResult{}, fmt.Errorf("%w: no distributions to measure", ErrInvalid)
	}
	if drafted != nil && len(drafted) != len(dists) {
		return BenchResult{}, fmt.Errorf("%w: %d drafted tokens for %d distributions", ErrInvalid, len(drafted), len(dists))
	}
	vocab := len(dists[0])
	for i, d := range dists {
		if len(d) != vocab {
			return BenchResult{}, fmt.Errorf("%w: distribution %d has %d tokens, the first has %d", ErrInvalid, i, len(d), vocab)
		}
	}
	draftOf := func(i int) int32 {
		if drafted == nil {
			return NoToken
		}
		return drafted[i]
	}
	dec, err := NewDecoder(vocab)
	if err != nil {
		return BenchResult{}, err
	}
	res := BenchResult{Tokens: len(dists), Vocab: vocab, TopP: DefaultTopP, TVD: map[string]float64{}}

	enc, err := NewEncoder(DefaultTopP)
	if err != nil {
		return BenchResult{}, err
	}
	var (
		buf                         []byte
		out                         Sparse
		sizes, times                = make([]float64, len(dists)), make([]float64, len(dists))
		sumBytes, sumJSON, sumFloat float64
	)
	for i, d := range dists {
		best := time.Duration(math.MaxInt64)
		for range benchRepeats {
			start := time.Now()
			buf, err = enc.Encode(buf[:0], d, draftOf(i), nil)
			if err != nil {
				return BenchResult{}, fmt.Errorf("encode token %d: %w", i, err)
			}
			if err := dec.Decode(buf, &out); err != nil {
				return BenchResult{}, fmt.Errorf("decode token %d: %w", i, err)
			}
			best = min(best, time.Since(start))
		}
		times[i] = float64(best.Nanoseconds()) / 1e3
		sizes[i] = float64(len(buf))
		sumBytes += float64(len(buf))
		sumFloat += 4 * float64(vocab)
		js, err := json.Marshal(d)
		if err != nil {
			return BenchResult{}, fmt.Errorf("json size of token %d: %w", i, err)
		}
		sumJSON += float64(len(js))
	}
	res.BytesPerToken = median(sizes)
	res.EncDecUS = median(times)
	res.RatioVsFP32 = sumFloat / sumBytes
	res.RatioVsJSON = sumJSON / sumBytes

	tvds := make([]float64, len(dists))
	for _, p := range BenchTopPs {
		enc, err := NewEncoder(p)
		if err != nil {
			return BenchResult{}, err
		}
		for i, d := range dists {
			if buf, err = enc.Encode(buf[:0], d, draftOf(i), nil); err != nil {
				return BenchResult{}, fmt.Errorf("encode token %d at top-p %v: %w", i, p, err)
			}
			if err := dec.Decode(buf, &out); err != nil {
				return BenchResult{}, fmt.Errorf("decode token %d at top-p %v: %w", i, p, err)
			}
			tvds[i] = TVD(d, &out)
		}
		res.TVD[strconv.FormatFloat(p, 'g', -1, 64)] = median(tvds)
	}
	return res, nil
}

// TVD is the total variation distance between the distribution probs
// (normalised by its sum) and s: ½·Σ|p(x) − s(x)| over the vocabulary.
func TVD(probs []float32, s *Sparse) float64 {
	var total float64
	for _, v := range probs {
		total += float64(v)
	}
	if total <= 0 {
		return math.NaN()
	}
	// One walk over the vocabulary; s.Tokens is sorted.
	dist, j := 0.0, 0
	for i, v := range probs {
		p := float64(v) / total
		if j < len(s.Tokens) && int(s.Tokens[j]) == i {
			dist += math.Abs(p - float64(s.Probs[j]))
			j++
		} else {
			dist += p
		}
	}
	return dist / 2
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
