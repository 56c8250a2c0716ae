package specdec

import (
	"fmt"
	"math/rand/v2"
)

// Verdict is the outcome of verifying a linear draft d_0..d_{γ-1} fed after
// the pending token (the batch [pending, d_0, ..., d_{γ-1}], γ+1 rows).
type Verdict struct {
	// Accepted is how many draft tokens were accepted.
	Accepted int
	// Attempted is how many draft positions the target examined: the
	// accepted ones plus the rejected one, if any.
	Attempted int
	// Emit is the accepted draft tokens followed by the correction (or
	// bonus) token: what the answer grows by. The correction is not in the
	// KV cache yet; it is the next pending token.
	Emit []Token
	// Rollback is how many KV positions to remove from the end of the
	// sequence: the rejected draft tokens.
	Rollback int
}

// VerifyGreedy accepts the longest prefix of draft that equals the target's
// greedy choice at each position, then emits the target's choice after it.
// argmax[i] is the target's choice for draft position i (row i of the
// batch), so it has len(draft)+1 entries.
func VerifyGreedy(draft, argmax []Token) (Verdict, error) {
	if len(argmax) != len(draft)+1 {
		return Verdict{}, fmt.Errorf("%w: %d argmax rows for a draft of %d", ErrInvalid, len(argmax), len(draft))
	}
	a := 0
	for a < len(draft) && draft[a] == argmax[a] {
		a++
	}
	return verdict(draft, a, argmax[a]), nil
}

func verdict(draft []Token, a int, next Token) Verdict {
	emit := make([]Token, a+1)
	copy(emit, draft[:a])
	emit[a] = next
	return Verdict{Accepted: a, Attempted: min(a+1, len(draft)), Emit: emit, Rollback: len(draft) - a}
}

// VerifySample is lossless speculative sampling for a deterministic draft:
// the drafter proposes x with probability one, so the rule of Leviathan et
// al. (accept with min(1, p(x)/q(x)), else sample from norm(max(0, p − q)))
// becomes: accept x with probability p(x); on rejection sample from p with
// x removed and renormalized. The emitted token is then distributed as p:
// P(x) = p(x), and for y ≠ x, P(y) = (1 − p(x))·p(y)/(1 − p(x)) = p(y).
// A draft is a tree with one child per node, which Tree.VerifySample runs.
//
// probs[i] is the target distribution at draft position i, already
// temperature/top-k/top-p processed (it is renormalized, so it need not sum
// to one exactly), len(draft)+1 rows.
func VerifySample(draft []Token, probs [][]float32, rng *rand.Rand) (Verdict, error) {
	if len(probs) != len(draft)+1 {
		return Verdict{}, fmt.Errorf("%w: %d distributions for a draft of %d", ErrInvalid, len(probs), len(draft))
	}
	tv, err := ChainTree(0, draft).VerifySample(probs, rng)
	return tv.Verdict, err
}

// sample draws from p, whose total is mass.
func sample(p []float32, mass float64, rng *rand.Rand) (Token, error) {
	if mass <= 0 {
		return 0, fmt.Errorf("%w: distribution has no mass", ErrInvalid)
	}
	u := rng.Float64() * mass
	last := Token(-1)
	for i, v := range p {
		if v <= 0 {
			continue
		}
		last = Token(i)
		u -= float64(v)
		if u < 0 {
			return last, nil
		}
	}
	if last < 0 {
		return 0, fmt.Errorf("%w: distribution has no mass", ErrInvalid)
	}
	return last, nil // rounding: the walk ended a hair short of mass
}

func sum(p []float32) float64 {
	var s float64
	for _, v := range p {
		s += float64(v)
	}
	return s
}
