package aggregator

// Streams of the per-step uniforms: drafting on each side, and the five
// draws of one aggregation.
const (
	streamDraftDevice uint64 = 1 + iota
	streamDraftCloud
	streamSigmaDevice // Sample(x^device, ...) rejection test
	streamSigmaCloud
	streamResampleDevice // draw from norm(max(0, p^cloud - p^device))
	streamResampleCloud
	streamPick // which of the two results becomes the target
)

// uniform is a number in [0, 1) that depends only on (seed, step, stream):
// randomness keyed by position rather than drawn from a stream, so it needs
// no state to hand over and an answer is reproducible.
func uniform(seed, step, stream uint64) float64 {
	x := mix64(seed ^ mix64(step+0x9e3779b97f4a7c15*stream))
	return float64(x>>11) / (1 << 53)
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// DraftUniform is the uniform a side draws its token at step from (inverse
// CDF of its distribution). Local speculative decoding accepts a draft token
// exactly when it equals the inverse-CDF choice at this uniform, so a side's
// drafts are the same whether or not it speculated locally.
func DraftUniform(seed uint64, side Side, step uint64) float64 {
	stream := streamDraftDevice
	if side == Cloud {
		stream = streamDraftCloud
	}
	return uniform(seed, step, stream)
}
