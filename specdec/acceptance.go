package specdec

import "math/bits"

// MatchReuse is the match length reported for drafts that replay a reused
// segment: they get an acceptance bucket of their own.
const MatchReuse = -1

// numBuckets: reuse, no match, then match lengths 1, 2, 3-4, 5-8, 9-16, 17+.
const numBuckets = 8

// bucket maps a match length to its acceptance bucket.
func bucket(matchLen int) int {
	switch {
	case matchLen < 0:
		return 0
	case matchLen == 0:
		return 1
	}
	return 2 + min(bits.Len(uint(matchLen-1)), numBuckets-3)
}

// Acceptance estimates the per-token acceptance rate α online: the chance
// that the target agrees with the next draft token, given it agreed with
// the previous ones. It keeps exponentially decayed sums of accepted and
// attempted tokens (accepted/attempted is the maximum-likelihood α of a
// truncated geometric), globally and per bucket of the drafter's match
// length, since a long match predicts acceptance well. A bucket's estimate
// is shrunk toward the global one while it has few observations; the global
// one starts from a prior worth a few observations.
type Acceptance struct {
	decay    float64
	shrink   float64
	global   ratio
	byBucket [numBuckets]ratio
}

type ratio struct{ acc, att float64 }

func (r *ratio) add(acc, att int, decay float64) {
	r.acc = r.acc*decay + float64(acc)
	r.att = r.att*decay + float64(att)
}

// NewAcceptance starts from prior α, worth 8 attempted tokens; observations
// decay with a half-life of about 50 attempted draft batches.
func NewAcceptance(prior float64) *Acceptance {
	return &Acceptance{decay: 0.986, shrink: 4, global: ratio{acc: 8 * prior, att: 8}}
}

// Observe records a verified draft made from a match of matchLen.
func (a *Acceptance) Observe(matchLen, accepted, attempted int) {
	if attempted <= 0 {
		return
	}
	a.global.add(accepted, attempted, a.decay)
	a.byBucket[bucket(matchLen)].add(accepted, attempted, a.decay)
}

// Alpha is the estimated per-token acceptance for a draft from a match of
// matchLen (MatchReuse for a reused segment), in [0, 0.999].
func (a *Acceptance) Alpha(matchLen int) float64 {
	g := a.global.acc / a.global.att // the prior keeps att > 0
	b := a.byBucket[bucket(matchLen)]
	return min(0.999, max(0, (b.acc+a.shrink*g)/(b.att+a.shrink)))
}

// Attempts is the (decayed) number of draft tokens verified in matchLen's
// bucket: how much evidence its α rests on.
func (a *Acceptance) Attempts(matchLen int) float64 {
	return a.byBucket[bucket(matchLen)].att
}
