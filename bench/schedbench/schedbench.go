// Package schedbench compares the aggregator placement strategies in the
// simulator (DRAGON §7.4, Fig. 8): a recorded or synthetic trace of
// decoding times and acceptance replayed under a latency trace of base
// latency plus a sinusoidal jitter of amplitude latency/5, many runs per
// setting, medians reported.
package schedbench

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/aggregator/aggsim"
	"github.com/dragon-rag/dragon/internal/timing"
)

// Options of a comparison.
type Options struct {
	// Trace to replay; zero: Synthetic(Seed).
	Trace      aggsim.Trace
	LatencyMS  []float64 // one-way base latencies
	Runs       int       // per strategy and latency
	Steps      int       // target tokens per run
	PeriodMS   float64   // of the sinusoidal jitter (0: 2000)
	Seed       uint64
	Estimates  aggsim.Estimates
	Strategies []aggregator.Strategy // nil: all
}

// Result is what `dragon bench sched --json` prints: median per-token
// latency and aggregator moves by strategy, then by one-way latency.
type Result struct {
	PerTokenMS map[string]map[string]float64 `json:"per_token_ms"`
	Switches   map[string]map[string]float64 `json:"switches"`
	// TokenWiseMS is DRDG/TW on the same traces, for reference.
	TokenWiseMS map[string]float64 `json:"token_wise_ms"`
	Runs        int                `json:"runs"`
	Steps       int                `json:"steps"`
	Trace       string             `json:"trace"`
}

// Synthetic is the trace used without a recorded one: both sides decode in
// about 25 ms per token (±10%), the device's drafts are accepted 60% of the
// time and the cloud's 80%.
func Synthetic(seed uint64) aggsim.Trace {
	r := rand.New(rand.NewPCG(seed, 5))
	var t aggsim.Trace
	for range 1000 {
		t.DecodeMS.Device = append(t.DecodeMS.Device, 25*(0.9+0.2*r.Float64()))
		t.DecodeMS.Cloud = append(t.DecodeMS.Cloud, 25*(0.9+0.2*r.Float64()))
		t.Accept.Device = append(t.Accept.Device, r.Float64() < 0.6)
		t.Accept.Cloud = append(t.Accept.Cloud, r.Float64() < 0.8)
	}
	return t
}

// shift starts a replay at offset, so that runs differ.
func shift(t aggsim.Trace, offset int) aggsim.Trace {
	rot := func(xs []float64) []float64 {
		o := offset % len(xs)
		return append(append([]float64(nil), xs[o:]...), xs[:o]...)
	}
	rotB := func(xs []bool) []bool {
		o := offset % len(xs)
		return append(append([]bool(nil), xs[o:]...), xs[:o]...)
	}
	return aggsim.Trace{
		DecodeMS: aggsim.PerSide[[]float64]{Device: rot(t.DecodeMS.Device), Cloud: rot(t.DecodeMS.Cloud)},
		Accept:   aggsim.PerSide[[]bool]{Device: rotB(t.Accept.Device), Cloud: rotB(t.Accept.Cloud)},
	}
}

// Run compares the strategies.
func Run(o Options) (Result, error) {
	if o.Runs <= 0 || o.Steps < 2 || len(o.LatencyMS) == 0 {
		return Result{}, fmt.Errorf("schedbench: need runs > 0, steps ≥ 2 and at least one latency")
	}
	name := "recorded"
	if len(o.Trace.DecodeMS.Device) == 0 {
		o.Trace, name = Synthetic(o.Seed), "synthetic"
	}
	if o.PeriodMS == 0 {
		o.PeriodMS = 2000
	}
	strategies := o.Strategies
	if strategies == nil {
		strategies = aggregator.Strategies
	}
	res := Result{
		PerTokenMS: map[string]map[string]float64{}, Switches: map[string]map[string]float64{},
		TokenWiseMS: map[string]float64{}, Runs: o.Runs, Steps: o.Steps, Trace: name,
	}
	r := rand.New(rand.NewPCG(o.Seed, 17))
	for _, lat := range o.LatencyMS {
		key := strconv.FormatFloat(lat, 'f', -1, 64)
		per := map[aggregator.Strategy][]float64{}
		sw := map[aggregator.Strategy][]float64{}
		var tw []float64
		for run := range o.Runs {
			tr := shift(o.Trace, r.IntN(1<<20))
			phase := r.Float64() * o.PeriodMS
			base := aggsim.Sinusoid(lat, lat/5, o.PeriodMS)
			link := func(now float64) float64 { return base(now + phase) }
			for _, st := range strategies {
				out, err := aggsim.Run(aggsim.Config{
					Steps: o.Steps, Trace: tr, Link: link, Estimates: o.Estimates,
					Scheduler: aggregator.SchedulerConfig{Strategy: st, Seed: o.Seed + uint64(run)},
				})
				if err != nil {
					return Result{}, err
				}
				per[st] = append(per[st], out.PerTokenMS)
				sw[st] = append(sw[st], float64(out.Switches))
			}
			out, err := aggsim.Run(aggsim.Config{
				Steps: o.Steps, Trace: tr, Link: link, Lookahead: 1,
				Scheduler: aggregator.SchedulerConfig{Strategy: aggregator.StaticDevice},
			})
			if err != nil {
				return Result{}, err
			}
			tw = append(tw, out.PerTokenMS)
		}
		for _, st := range strategies {
			if res.PerTokenMS[st.String()] == nil {
				res.PerTokenMS[st.String()] = map[string]float64{}
				res.Switches[st.String()] = map[string]float64{}
			}
			res.PerTokenMS[st.String()][key] = timing.Median(per[st])
			res.Switches[st.String()][key] = timing.Median(sw[st])
		}
		res.TokenWiseMS[key] = timing.Median(tw)
	}
	return res, nil
}
