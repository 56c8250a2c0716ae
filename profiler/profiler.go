// Package profiler turns measurements into the estimates the scheduler
// weighs (DRAGON §5.2): a fit of each side's decoding latency against its
// context length, refined at run time with the intercept frozen; the round
// trip from Ping/Pong on the peer stream; the link's bandwidth from message
// sizes and times; and moving averages of each side's acceptance rate,
// observed and as Eq. (5) predicts it. It is pure: measurements in,
// estimates out; the session owns the clock.
package profiler

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/dragon-rag/dragon/aggregator"
)

// DecodeFit is c_dec(t) = k_a·t/k_b + k_c: the milliseconds one draft token
// costs at context length t. k_a/k_b is the slope, kept as a ratio so that
// the run-time update of §5.2 can blend new observations into both.
type DecodeFit struct {
	Ka float64 `json:"k_a"`
	Kb float64 `json:"k_b"`
	Kc float64 `json:"k_c"`
}

// Valid reports whether the fit can be evaluated.
func (f DecodeFit) Valid() bool {
	return f.Kb > 0 && !math.IsNaN(f.Ka) && !math.IsInf(f.Ka, 0) && !math.IsNaN(f.Kc) && !math.IsInf(f.Kc, 0)
}

// At is the predicted cost at context length t, never below zero.
func (f DecodeFit) At(t float64) float64 {
	if !f.Valid() {
		return 0
	}
	return max(0, f.Ka*t/f.Kb+f.Kc)
}

// Slope is k_a/k_b, milliseconds per context token.
func (f DecodeFit) Slope() float64 {
	if f.Kb == 0 {
		return 0
	}
	return f.Ka / f.Kb
}

// ErrTooFewSamples: a fit needs two distinct context lengths.
var ErrTooFewSamples = errors.New("profiler: too few samples to fit")

// Fit is the least-squares line through (t, c) samples. k_b is the mean of
// t², so that Update blends new observations at the weight of one average
// sample.
func Fit(ts, cs []float64) (DecodeFit, error) {
	if len(ts) != len(cs) {
		return DecodeFit{}, fmt.Errorf("profiler: %d context lengths for %d costs", len(ts), len(cs))
	}
	n := float64(len(ts))
	var st, sc, stt, stc float64
	for i, t := range ts {
		c := cs[i]
		if math.IsNaN(t) || math.IsNaN(c) || math.IsInf(t, 0) || math.IsInf(c, 0) {
			return DecodeFit{}, fmt.Errorf("profiler: sample %d is (%v, %v)", i, t, c)
		}
		st += t
		sc += c
		stt += t * t
		stc += t * c
	}
	den := n*stt - st*st
	if len(ts) < 2 || den <= 1e-9*n*stt {
		return DecodeFit{}, ErrTooFewSamples
	}
	slope := (n*stc - st*sc) / den
	kc := (sc - slope*st) / n
	kb := stt / n
	return DecodeFit{Ka: slope * kb, Kb: kb, Kc: kc}, nil
}

// Update is §5.2's run-time refinement with the intercept frozen: an
// observed cost c at context t moves the slope toward (c − k_c)/t with
// weight ζ.
func (f *DecodeFit) Update(t, c, zeta float64) {
	if !f.Valid() || t <= 0 || math.IsNaN(c) || math.IsInf(c, 0) {
		return
	}
	f.Ka = (1-zeta)*f.Ka + zeta*(c-f.Kc)*t
	f.Kb = (1-zeta)*f.Kb + zeta*t*t
}

// Profile is what `dragon profile` saves: one side's decoding fit and how
// it was measured.
type Profile struct {
	Fit      DecodeFit `json:"fit"`
	Passages int       `json:"passages"`
	Threads  int       `json:"threads"`
	Model    string    `json:"model"`
	Samples  int       `json:"samples"`
	// RMSE of the fit over its samples, in milliseconds.
	RMSE float64 `json:"rmse_ms"`
}

// Save writes p as JSON.
func (p Profile) Save(path string) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Load reads a profile saved by Save.
func Load(path string) (Profile, error) {
	var p Profile
	b, err := os.ReadFile(path)
	if err != nil {
		return p, fmt.Errorf("profiler: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("profiler: %s: %w", path, err)
	}
	if !p.Fit.Valid() {
		return p, fmt.Errorf("profiler: %s holds no valid fit", path)
	}
	return p, nil
}

// EWMA is an exponentially weighted moving average; the first sample sets
// it.
type EWMA struct {
	Weight float64 // of a new sample, in (0, 1]
	value  float64
	n      int
}

// Add folds x in.
func (e *EWMA) Add(x float64) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	if e.n == 0 {
		e.value = x
	} else {
		e.value += e.Weight * (x - e.value)
	}
	e.n++
}

// Value is the average (0 before any sample).
func (e *EWMA) Value() float64 { return e.value }

// N is the number of samples folded in.
func (e *EWMA) N() int { return e.n }

// Config tunes an Estimator.
type Config struct {
	// Zeta is the weight of one observation in the decoding fit (0: 0.05).
	Zeta float64
	// Weight of a new sample in the moving averages (0: 0.1).
	Weight float64
	// PriorAccept is the acceptance rate assumed before any verdict (0:
	// 0.5).
	PriorAccept float64
	// Expected makes Costs use Eq. (5)'s acceptance estimate instead of
	// the observed rate.
	Expected bool
}

// Estimator collects one generation's measurements and estimates the
// scheduler's Costs.
type Estimator struct {
	cfg      Config
	fit      [2]DecodeFit
	decode   [2]EWMA // observed per-token decoding, for sides without a fit
	context  [2]float64
	rtt      EWMA // ms
	bw       EWMA // bytes per ms
	msgBytes EWMA // bytes of a draft message and of a verdict message
	accept   [2]EWMA
	expected [2]EWMA
}

// NewEstimator starts from the sides' offline fits (invalid fits are
// learned from observations alone).
func NewEstimator(cfg Config, device, cloud DecodeFit) *Estimator {
	if cfg.Zeta == 0 {
		cfg.Zeta = 0.05
	}
	if cfg.Weight == 0 {
		cfg.Weight = 0.1
	}
	if cfg.PriorAccept == 0 {
		cfg.PriorAccept = 0.5
	}
	e := &Estimator{cfg: cfg, fit: [2]DecodeFit{device, cloud}}
	for i := range e.accept {
		e.decode[i].Weight = cfg.Weight
		e.accept[i].Weight = cfg.Weight
		e.expected[i].Weight = cfg.Weight
	}
	e.rtt.Weight, e.bw.Weight, e.msgBytes.Weight = cfg.Weight, cfg.Weight, cfg.Weight
	return e
}

func idx(s aggregator.Side) int { return int(s) - 1 }

// Decode records that side spent ms per token decoding at context length
// t.
func (e *Estimator) Decode(side aggregator.Side, t, ms float64) {
	i := idx(side)
	e.context[i] = t
	e.decode[i].Add(ms)
	e.fit[i].Update(t, ms, e.cfg.Zeta)
}

// RTT records a Ping/Pong round trip.
func (e *Estimator) RTT(ms float64) {
	if ms >= 0 {
		e.rtt.Add(ms)
	}
}

// Bandwidth records that extra bytes took extra ms beyond a plain round
// trip (a padded Ping against an empty one).
func (e *Estimator) Bandwidth(bytes, ms float64) {
	if bytes > 0 && ms > 0 {
		e.bw.Add(bytes / ms)
	}
}

// Message records the size of a draft or verdict message sent.
func (e *Estimator) Message(bytes int) { e.msgBytes.Add(float64(bytes)) }

// Verdict records one decided step. A moved draft (Meta.Moved) counts as
// a rejection: the acceptance the scheduler weighs is that of each side's
// own argmax, which a side drafts wherever the peer's draft is not at hand
// (always, after the aggregator moves away from it).
func (e *Estimator) Verdict(v aggregator.Verdict) {
	for i := range e.accept {
		a := 0.0
		if v.Accept[i] && !v.Moved[i] {
			a = 1
		}
		e.accept[i].Add(a)
		e.expected[i].Add(v.Expected[i])
	}
}

// FitOf is side's current decoding fit.
func (e *Estimator) FitOf(side aggregator.Side) DecodeFit { return e.fit[idx(side)] }

// DecodeMS is side's estimated decoding cost per token now.
func (e *Estimator) DecodeMS(side aggregator.Side) float64 {
	i := idx(side)
	if e.fit[i].Valid() && e.context[i] > 0 {
		return e.fit[i].At(e.context[i])
	}
	return e.decode[i].Value()
}

// RTTMS is the round-trip estimate: the measured ping plus the time a
// draft and a verdict take to cross at the measured bandwidth.
func (e *Estimator) RTTMS() float64 {
	rtt := e.rtt.Value()
	if bw := e.bw.Value(); bw > 0 {
		rtt += 2 * e.msgBytes.Value() / bw
	}
	return rtt
}

// BandwidthBytesPerMS is the bandwidth estimate (0: unknown).
func (e *Estimator) BandwidthBytesPerMS() float64 { return e.bw.Value() }

// Acceptance is side's acceptance rate: observed, and as Eq. (5) predicts.
func (e *Estimator) Acceptance(side aggregator.Side) (observed, expected float64) {
	i := idx(side)
	if e.accept[i].N() == 0 {
		return e.cfg.PriorAccept, e.cfg.PriorAccept
	}
	return e.accept[i].Value(), e.expected[i].Value()
}

// Costs are the scheduler's inputs now.
func (e *Estimator) Costs() aggregator.Costs {
	var c aggregator.Costs
	for _, s := range aggregator.Sides {
		c.Decode[idx(s)] = e.DecodeMS(s)
		obs, exp := e.Acceptance(s)
		c.Accept[idx(s)] = obs
		if e.cfg.Expected {
			c.Accept[idx(s)] = exp
		}
	}
	c.RTT = e.RTTMS()
	return c
}
