package aggregator

import (
	"math"

	"github.com/dragon-rag/dragon/codec"
)

// Weights are η^device and η^cloud = softmax(h̃^device, h̃^cloud) (DRAGON
// Eq. 4 with Appendix A.1's log-sum-exp): each side's share of the target
// mixture. A side without passages (h̃ = -Inf) weighs nothing unless neither
// has any, when both weigh ½.
func Weights(logMassDevice, logMassCloud float64) (etaDevice, etaCloud float64) {
	switch {
	case math.IsInf(logMassDevice, -1) && math.IsInf(logMassCloud, -1):
		return 0.5, 0.5
	case math.IsInf(logMassDevice, -1):
		return 0, 1
	case math.IsInf(logMassCloud, -1):
		return 1, 0
	}
	m := max(logMassDevice, logMassCloud)
	ed, ec := math.Exp(logMassDevice-m), math.Exp(logMassCloud-m)
	return ed / (ed + ec), ec / (ed + ec)
}

// pair is the two drafts of one step and their weights, indexed by side.
type pair struct {
	draft [2]*Draft
	eta   [2]float64
}

// newPair weighs the two drafts of a step: by their h̃ (Weights), each
// lowered by its view's entropy over confidence when confidence > 0.
func newPair(device, cloud *Draft, confidence float64) pair {
	ld, lc := device.logMass, cloud.logMass
	if confidence > 0 {
		ld -= Entropy(&device.dist) / confidence
		lc -= Entropy(&cloud.dist) / confidence
	}
	ed, ec := Weights(ld, lc)
	return pair{draft: [2]*Draft{device, cloud}, eta: [2]float64{ed, ec}}
}

// Entropy is a view's entropy in nats. With confidence weights a side's
// share of a step falls by a factor e^{-H/τ}: the side less sure of its
// next token (a small model, or passages that do not hold the answer)
// yields to the surer one, step by step. Both sides compute it from the
// same bytes, so they weigh a step alike.
func Entropy(s *codec.Sparse) float64 {
	var h float64
	for _, p := range s.Probs {
		if p > 0 {
			h -= float64(p) * math.Log(float64(p))
		}
	}
	return h
}

// target decides the step's token: Algorithm 1 for sampling, the argmax of
// the mixture for greedy decoding.
func (p pair) target(greedy bool, seed, step uint64) int32 {
	if greedy {
		return p.mixtureArgmax()
	}
	d, c := p.draft[0], p.draft[1]
	xd := sample(d.token, &d.dist, &c.dist, p.eta[1],
		uniform(seed, step, streamSigmaDevice), uniform(seed, step, streamResampleDevice))
	xc := sample(c.token, &c.dist, &d.dist, p.eta[0],
		uniform(seed, step, streamSigmaCloud), uniform(seed, step, streamResampleCloud))
	if uniform(seed, step, streamPick) < 0.5 {
		return xd
	}
	return xc
}

// sample is Algorithm 1's Sample(x, p^a, p^b, η) with η the other side's
// weight: keep the draft x ~ p^a unless p^a(x) > p^b(x) and σ < η(1 -
// p^b(x)/p^a(x)); then draw from norm(max(0, p^b - p^a)) at u. The result
// is distributed as η^a·p^a + η^b·p^b (Appendix A.2).
func sample(x int32, pa, pb *codec.Sparse, eta, sigma, u float64) int32 {
	qa, qb := float64(pa.Prob(x)), float64(pb.Prob(x))
	if !(qa > qb) || sigma >= eta*(1-qb/qa) {
		return x
	}
	var total float64
	residual(pb, pa, func(_ int32, r float64) bool { total += r; return true })
	if !(total > 0) {
		return x // p^a = p^b up to rounding: the test above cannot have fired
	}
	target := u * total
	var cum float64
	out := x
	residual(pb, pa, func(tok int32, r float64) bool {
		cum += r
		out = tok
		return target >= cum
	})
	return out
}

// residual calls f with every token where pb exceeds pa and the excess, in
// token order, while f returns true. max(0, pb - pa) is positive only on
// pb's support.
func residual(pb, pa *codec.Sparse, f func(tok int32, r float64) bool) {
	j := 0
	for i, tok := range pb.Tokens {
		for j < len(pa.Tokens) && pa.Tokens[j] < tok {
			j++
		}
		q := 0.0
		if j < len(pa.Tokens) && pa.Tokens[j] == tok {
			q = float64(pa.Probs[j])
		}
		if r := float64(pb.Probs[i]) - q; r > 0 && !f(tok, r) {
			return
		}
	}
}

// merge calls f for every token in either support with both probabilities,
// in token order.
func merge(a, b *codec.Sparse, f func(tok int32, pa, pb float64)) {
	i, j := 0, 0
	for i < len(a.Tokens) || j < len(b.Tokens) {
		switch {
		case j >= len(b.Tokens) || (i < len(a.Tokens) && a.Tokens[i] < b.Tokens[j]):
			f(a.Tokens[i], float64(a.Probs[i]), 0)
			i++
		case i >= len(a.Tokens) || b.Tokens[j] < a.Tokens[i]:
			f(b.Tokens[j], 0, float64(b.Probs[j]))
			j++
		default:
			f(a.Tokens[i], float64(a.Probs[i]), float64(b.Probs[j]))
			i++
			j++
		}
	}
}

// mixtureArgmax is the most probable token of η^d·p^d + η^c·p^c, the
// lowest id on ties: greedy decoding of the target distribution.
func (p pair) mixtureArgmax() int32 {
	best, bestP := int32(-1), -1.0
	merge(&p.draft[0].dist, &p.draft[1].dist, func(tok int32, pd, pc float64) {
		if m := p.eta[0]*pd + p.eta[1]*pc; m > bestP {
			best, bestP = tok, m
		}
	})
	return best
}

// expectedAcceptance is Eq. (5) with γ^l = γ^r = ½ for both sides:
// α^a = ½(1 − η^b·δ) + ½·Σ_x p^a(x)·p(x), where δ = 1 − Σ min(p^d, p^c) and
// p the target mixture. For greedy decoding a draft is accepted exactly
// when it is the mixture's argmax, so the estimate is that indicator.
func (p pair) expectedAcceptance(greedy bool) [2]float64 {
	if greedy {
		t := p.mixtureArgmax()
		var a [2]float64
		for i, d := range p.draft {
			if d.token == t {
				a[i] = 1
			}
		}
		return a
	}
	var overlap, dotD, dotC float64
	merge(&p.draft[0].dist, &p.draft[1].dist, func(_ int32, pd, pc float64) {
		overlap += min(pd, pc)
		m := p.eta[0]*pd + p.eta[1]*pc
		dotD += pd * m
		dotC += pc * m
	})
	delta := 1 - overlap
	return [2]float64{
		0.5*(1-p.eta[1]*delta) + 0.5*dotD,
		0.5*(1-p.eta[0]*delta) + 0.5*dotC,
	}
}
