// Package codec encodes a next-token distribution for the peer stream: a
// full-vocabulary probability vector becomes a few hundred bytes, and those
// bytes decode to a sparse distribution.
//
// # Format
//
// A payload is one header byte (format version in the high nibble, flags in
// the low nibble) followed by the body, or, when the LZ4 flag is set, by the
// body's length as an unsigned varint and the body as one LZ4 block. LZ4 is
// used only when it makes the payload smaller. The body is
//
//	uvarint n                     number of kept tokens, 1..vocab
//	n × uvarint delta             token ids in increasing order: the first
//	                              id, then id[i]-id[i-1]-1
//	n × uint16 little-endian      fp16 probabilities of those tokens
//
// Ids are varints, not 16-bit fields, so vocabularies of any size (Qwen2.5
// has 151,936 tokens) round-trip.
//
// # What is kept, and where the dropped mass goes
//
// The encoder keeps the smallest set of most probable tokens whose mass
// reaches top-p (0.8 by default), plus the drafted token if it is not among
// them. The decoded distribution is that set renormalised to sum to 1; every
// other token has probability 0. This is nucleus sampling: spreading the
// dropped mass uniformly over the rest of the vocabulary instead would make
// up to 1-p of all sampled tokens vocabulary noise.
//
// Speculative Aggregation stays exact because the decoded distribution is
// the side's distribution by definition: the aggregator uses it as p^l or
// p^r, and the side drafts from the very same distribution (Encode returns
// it as a view, equal bit for bit to what Decode yields on the other end).
// The target is then exactly the η-mixture of the two distributions that
// were sent. Keeping the drafted token, at no less than the smallest
// positive fp16 value, guarantees p^a(x^a) > 0, which Algorithm 1 divides
// by, even for a caller that drafted from somewhere else.
//
// The codec does no I/O. It is the only code that reads or writes the bytes
// of dragon.v1.Draft.distribution.
package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pierrec/lz4/v4"
	"github.com/x448/float16"
)

// DefaultTopP is the mass kept when the caller does not choose (DRAGON §7.1).
const DefaultTopP = 0.8

// NoToken passed as the drafted token means there is no token to force into
// the kept set.
const NoToken int32 = -1

const (
	formatVersion = 1
	flagLZ4       = 1 << 0
	knownFlags    = flagLZ4

	// minFP16 is the bit pattern of the smallest positive fp16 value, the
	// floor for kept probabilities, so that no kept token decodes to zero.
	minFP16 = 0x0001
	// fp16Inf is the bit pattern of +Inf; patterns at or above it (with the
	// sign bit clear) are Inf or NaN.
	fp16Inf = 0x7C00

	// lz4MinBody: shorter bodies never shrink under LZ4, so skip the attempt.
	lz4MinBody = 32
	// lz4MaxRatio bounds how much one LZ4 block can expand (a match of up to
	// 255 bytes per length byte), to cap the decode buffer by input size.
	lz4MaxRatio = 255
)

// Errors. Encode and Decode wrap them with detail; test with errors.Is.
var (
	// ErrInvalid: the input of Encode is not a probability vector, or an
	// argument is out of range.
	ErrInvalid = errors.New("codec: invalid input")
	// ErrCorrupt: a payload that this codec did not produce.
	ErrCorrupt = errors.New("codec: corrupt payload")
)

// Sparse is a next-token distribution over a few tokens; all other tokens
// have probability 0.
type Sparse struct {
	// Tokens are strictly increasing.
	Tokens []int32
	// Probs are positive and sum to 1 up to float32 rounding.
	Probs []float32
}

// Len is the number of tokens with positive probability.
func (s *Sparse) Len() int { return len(s.Tokens) }

// Prob returns p(tok): 0 for a token outside the kept set.
func (s *Sparse) Prob(tok int32) float32 {
	if i, ok := slices.BinarySearch(s.Tokens, tok); ok {
		return s.Probs[i]
	}
	return 0
}

// Dense expands s over a vocabulary of vocab tokens into dst (grown as
// needed) and returns it. Tokens at or above vocab are ignored; Decode never
// yields them.
func (s *Sparse) Dense(dst []float32, vocab int) []float32 {
	dst = slices.Grow(dst[:0], vocab)[:vocab]
	clear(dst)
	for i, t := range s.Tokens {
		if int(t) < vocab {
			dst[t] = s.Probs[i]
		}
	}
	return dst
}

// Clone returns a deep copy, for callers that keep a view beyond the next
// Encode or Decode into the same Sparse.
func (s *Sparse) Clone() Sparse {
	return Sparse{Tokens: slices.Clone(s.Tokens), Probs: slices.Clone(s.Probs)}
}

// Encoder turns probability vectors into payloads. Its scratch buffers are
// reused across calls, so it is not safe for concurrent use: keep one per
// sender goroutine.
type Encoder struct {
	topP float64

	candIdx []int32   // tokens at or above the threshold, in id order
	candVal []float32 // their probabilities; permuted by the selection
	keepIdx []int32
	keepVal []float32
	fp16    []uint16
	body    []byte
	lz4buf  []byte
	lz4     lz4.Compressor
}

// NewEncoder returns an encoder keeping top-p mass, 0 < topP <= 1.
func NewEncoder(topP float64) (*Encoder, error) {
	if !(topP > 0 && topP <= 1) {
		return nil, fmt.Errorf("%w: top-p %v not in (0, 1]", ErrInvalid, topP)
	}
	return &Encoder{topP: topP}, nil
}

// TopP is the mass this encoder keeps.
func (e *Encoder) TopP() float64 { return e.topP }

// Encode appends the payload for probs to dst and returns it. probs is a
// full-vocabulary vector of non-negative finite weights with a positive sum
// (normally softmax output; it need not sum exactly to 1). drafted, unless
// NoToken, is kept even outside the top-p set.
//
// If view is not nil it receives the distribution the payload decodes to,
// bit for bit: the side drafts from and verifies against this view. Its
// slices are reused by later calls. For an exact Speculative Aggregation
// a side encodes with NoToken, samples its draft from the view and sends
// the payload unchanged: the draft lies in the view's support, so encoding
// with it would give the same bytes.
func (e *Encoder) Encode(dst []byte, probs []float32, drafted int32, view *Sparse) ([]byte, error) {
	vocab := len(probs)
	if vocab == 0 {
		return dst, fmt.Errorf("%w: empty distribution", ErrInvalid)
	}
	if drafted != NoToken && (drafted < 0 || int(drafted) >= vocab) {
		return dst, fmt.Errorf("%w: drafted token %d outside vocabulary of %d", ErrInvalid, drafted, vocab)
	}
	if err := e.selectTopP(probs); err != nil {
		return dst, err
	}
	if drafted != NoToken {
		e.insert(drafted, probs[drafted])
	}
	e.quantize()
	e.writeBody()

	dst = append(dst, formatVersion<<4)
	hdr := len(dst) - 1
	if len(e.body) >= lz4MinBody {
		bound := lz4.CompressBlockBound(len(e.body))
		e.lz4buf = slices.Grow(e.lz4buf[:0], bound)[:bound]
		n, err := e.lz4.CompressBlock(e.body, e.lz4buf)
		if err == nil && n > 0 && n+uvarintLen(uint64(len(e.body))) < len(e.body) {
			dst[hdr] |= flagLZ4
			dst = binary.AppendUvarint(dst, uint64(len(e.body)))
			dst = append(dst, e.lz4buf[:n]...)
			e.fillView(view)
			return dst, nil
		}
	}
	dst = append(dst, e.body...)
	e.fillView(view)
	return dst, nil
}

func (e *Encoder) fillView(view *Sparse) {
	if view == nil {
		return
	}
	view.Tokens = append(view.Tokens[:0], e.keepIdx...)
	view.Probs = slices.Grow(view.Probs[:0], len(e.fp16))[:len(e.fp16)]
	normalize(e.fp16, view.Probs)
}

// assumedMass is the least total mass the single-pass threshold assumes;
// softmax output sums to 1 within float rounding. Inputs that sum to less
// cost a second pass.
const assumedMass = 0.999

// selectTopP validates probs and fills keepIdx/keepVal with the smallest set
// of most probable tokens whose mass reaches topP·total, in id order,
// without sorting the vocabulary.
//
// Tokens below t = (1-p)·total/V together weigh less than V·t = (1-p)·total,
// so the tokens at or above t weigh more than p·total and contain the whole
// top-p set. One pass over the vocabulary sums it, validates it and collects
// the tokens above t (assuming total >= assumedMass, checked afterwards); a
// weighted quickselect over those few finds the smallest value τ that must
// be kept and how many tokens tied at τ to take. The pass is the encoder's
// cost, so it does as little per token as it can.
func (e *Encoder) selectTopP(probs []float32) error {
	thr := e.threshold(assumedMass, len(probs))
	total, bad := e.scan(probs, thr)
	if bad || !(total > 0) || math.IsInf(total, 0) {
		if err := invalidEntry(probs); err != nil {
			return err
		}
		return fmt.Errorf("%w: probabilities sum to %v", ErrInvalid, total)
	}
	if total < assumedMass {
		thr = e.threshold(total, len(probs))
		e.scan(probs, thr)
	}

	target := e.topP * total
	e.candVal = e.candVal[:0]
	var candMass float64
	for _, i := range e.candIdx {
		v := probs[i]
		e.candVal = append(e.candVal, v)
		candMass += float64(v)
	}
	e.keepIdx, e.keepVal = e.keepIdx[:0], e.keepVal[:0]
	if e.topP >= 1 || candMass <= target {
		// Everything collected is needed (p = 1, or float rounding left the
		// candidates a hair short of the target).
		e.keepIdx = append(e.keepIdx, e.candIdx...)
		e.keepVal = append(e.keepVal, e.candVal...)
		return nil
	}
	candMass = e.narrow(candMass, target)
	tau, ties := selectThreshold(e.candVal, target)
	for _, i := range e.candIdx {
		v := probs[i]
		if v > tau || (v == tau && ties > 0) {
			if v == tau {
				ties--
			}
			e.keepIdx = append(e.keepIdx, i)
			e.keepVal = append(e.keepVal, v)
		}
	}
	return nil
}

// narrow drops candidates that cannot be in the top-p set, by the same
// argument as the scan's threshold applied to the candidates alone: the n
// candidates below t2 = (candMass-target)/n weigh less than candMass-target,
// so those at or above t2 still weigh more than target. Each round raises
// t2; real distributions go from about a thousand candidates to a few
// dozen in two or three rounds, which leaves little for the quickselect.
// Ids stay in order. It returns the remaining mass.
func (e *Encoder) narrow(candMass, target float64) float64 {
	for len(e.candVal) > 16 {
		t64 := (candMass - target) / float64(len(e.candVal))
		t2 := float32(t64)
		if float64(t2) > t64 {
			t2 = math.Nextafter32(t2, 0)
		}
		n := 0
		var mass float64
		for _, v := range e.candVal {
			if v >= t2 {
				mass += float64(v)
				n++
			}
		}
		// Stop when nothing goes, or if rounding would leave the survivors
		// short of the target (keep the current, larger set).
		if n == len(e.candVal) || mass <= target {
			break
		}
		k := 0
		for j, v := range e.candVal {
			if v >= t2 {
				e.candVal[k], e.candIdx[k] = v, e.candIdx[j]
				k++
			}
		}
		shrunk := n < len(e.candVal)*3/4
		e.candVal, e.candIdx, candMass = e.candVal[:n], e.candIdx[:n], mass
		if !shrunk { // diminishing returns: leave the rest to the quickselect
			break
		}
	}
	return candMass
}

// threshold is (1-p)·mass/V rounded down, and positive so that zeros are
// never candidates.
func (e *Encoder) threshold(mass float64, vocab int) float32 {
	t64 := (1 - e.topP) * mass / float64(vocab)
	t := float32(t64)
	if float64(t) > t64 {
		t = math.Nextafter32(t, 0)
	}
	return max(t, math.SmallestNonzeroFloat32)
}

// scan sums probs, collects the ids at or above thr into candIdx and
// reports whether any entry has its sign bit set. NaN and infinities show
// up in the sum instead, which keeps the loop to one integer op of checking
// per token.
func (e *Encoder) scan(probs []float32, thr float32) (total float64, bad bool) {
	var s0, s1, s2, s3 float64
	var sign uint32
	idx := e.candIdx[:0]
	i := 0
	for ; i+4 <= len(probs); i += 4 {
		q := probs[i : i+4 : i+4]
		sign |= math.Float32bits(q[0]) | math.Float32bits(q[1]) | math.Float32bits(q[2]) | math.Float32bits(q[3])
		s0 += float64(q[0])
		s1 += float64(q[1])
		s2 += float64(q[2])
		s3 += float64(q[3])
		// Few tokens pass (about 2% for a real model at p = 0.8), so
		// these branches are well predicted.
		if q[0] >= thr {
			idx = append(idx, int32(i))
		}
		if q[1] >= thr {
			idx = append(idx, int32(i+1))
		}
		if q[2] >= thr {
			idx = append(idx, int32(i+2))
		}
		if q[3] >= thr {
			idx = append(idx, int32(i+3))
		}
	}
	for ; i < len(probs); i++ {
		sign |= math.Float32bits(probs[i])
		s0 += float64(probs[i])
		if probs[i] >= thr {
			idx = append(idx, int32(i))
		}
	}
	e.candIdx = idx
	return s0 + s1 + s2 + s3, sign&0x80000000 != 0 && hasNegative(probs)
}

// hasNegative is the slow check behind a set sign bit: -0 is a zero.
func hasNegative(probs []float32) bool {
	for _, v := range probs {
		if v < 0 {
			return true
		}
	}
	return false
}

// invalidEntry names the first entry that is not a probability, if any.
func invalidEntry(probs []float32) error {
	for i, v := range probs {
		if !(v >= 0) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: probability %v at token %d", ErrInvalid, v, i)
		}
	}
	return nil
}

// selectThreshold returns τ and a count such that the tokens above τ plus
// that many tokens equal to τ are the smallest set reaching target. vals
// must weigh more than target; it is permuted. Expected O(len(vals)).
func selectThreshold(vals []float32, target float64) (tau float32, ties int) {
	lo, hi := 0, len(vals)
	need := target
	seed := uint32(len(vals))*2654435761 + 1
	for hi-lo > 24 {
		// Median of three pseudo-random elements: no adversarial input
		// makes this quadratic in practice, and it needs no global rand.
		n := uint32(hi - lo)
		seed = seed*1664525 + 1013904223
		a := vals[lo+int(seed%n)]
		seed = seed*1664525 + 1013904223
		b := vals[lo+int(seed%n)]
		seed = seed*1664525 + 1013904223
		c := vals[lo+int(seed%n)]
		p := max(min(a, b), min(max(a, b), c))

		// Three-way partition: [lo,gt) > p, [gt,i) == p, [lt,hi) < p.
		gt, i, lt := lo, lo, hi
		var massGT, massEQ float64
		for i < lt {
			v := vals[i]
			switch {
			case v > p:
				vals[gt], vals[i] = v, vals[gt]
				massGT += float64(v)
				gt++
				i++
			case v < p:
				lt--
				vals[lt], vals[i] = v, vals[lt]
			default:
				massEQ += float64(v)
				i++
			}
		}
		switch {
		case massGT >= need:
			hi = gt
		case massGT+massEQ >= need:
			need -= massGT
			k := int(math.Ceil(need / float64(p)))
			return p, min(max(k, 1), lt-gt)
		default:
			need -= massGT + massEQ
			lo = lt
		}
	}
	// Few left: sort them and walk down from the largest.
	s := vals[lo:hi]
	slices.Sort(s)
	for j := len(s) - 1; j >= 0; j-- {
		need -= float64(s[j])
		if need <= 0 || j == 0 {
			tau = s[j]
			for k := j; k < len(s) && s[k] == tau; k++ {
				ties++
			}
			return tau, ties
		}
	}
	return 0, 0 // unreachable: vals is not empty
}

// insert adds tok to the kept set unless it is there already.
func (e *Encoder) insert(tok int32, v float32) {
	i, ok := slices.BinarySearch(e.keepIdx, tok)
	if ok {
		return
	}
	e.keepIdx = slices.Insert(e.keepIdx, i, tok)
	e.keepVal = slices.Insert(e.keepVal, i, v)
}

// quantize renormalises the kept set and rounds it to fp16, flooring at the
// smallest positive fp16 so no kept token (the drafted one in particular)
// decodes to probability 0.
func (e *Encoder) quantize() {
	var mass float64
	for _, v := range e.keepVal {
		mass += float64(v)
	}
	e.fp16 = slices.Grow(e.fp16[:0], len(e.keepVal))[:len(e.keepVal)]
	for i, v := range e.keepVal {
		h := float16.Fromfloat32(float32(float64(v) / mass)).Bits()
		if h == 0 {
			h = minFP16
		}
		e.fp16[i] = h
	}
}

func (e *Encoder) writeBody() {
	b := e.body[:0]
	b = binary.AppendUvarint(b, uint64(len(e.keepIdx)))
	prev := int64(-1)
	for _, t := range e.keepIdx {
		b = binary.AppendUvarint(b, uint64(int64(t)-prev-1))
		prev = int64(t)
	}
	for _, h := range e.fp16 {
		b = binary.LittleEndian.AppendUint16(b, h)
	}
	e.body = b
}

// normalize converts fp16 bits to probabilities summing to 1. Encoder views
// and Decode share it so both ends compute identical floats.
func normalize(h []uint16, dst []float32) {
	var sum float64
	for i, u := range h {
		f := float16.Frombits(u).Float32()
		dst[i] = f
		sum += float64(f)
	}
	for i, f := range dst {
		dst[i] = float32(float64(f) / sum)
	}
}

// Decoder turns payloads back into sparse distributions. It is not safe for
// concurrent use: keep one per receiver goroutine.
type Decoder struct {
	vocab   int
	maxBody int
	raw     []byte
	h       []uint16
}

// NewDecoder returns a decoder for a vocabulary of vocab tokens. The
// vocabulary bounds everything a payload may ask for: the entry count, the
// token ids and the LZ4 output size.
func NewDecoder(vocab int) (*Decoder, error) {
	if vocab <= 0 || vocab > math.MaxInt32 {
		return nil, fmt.Errorf("%w: vocabulary size %d", ErrInvalid, vocab)
	}
	// Largest body: count, then vocab ids (at most 5 varint bytes each,
	// as ids fit in 31 bits) and vocab fp16 values.
	return &Decoder{vocab: vocab, maxBody: binary.MaxVarintLen64 + vocab*(5+2)}, nil
}

// Vocab is the vocabulary size this decoder accepts.
func (d *Decoder) Vocab() int { return d.vocab }

// Decode parses payload into dst, reusing dst's slices. On error dst holds
// no meaningful distribution.
func (d *Decoder) Decode(payload []byte, dst *Sparse) error {
	if len(payload) == 0 {
		return fmt.Errorf("%w: empty payload", ErrCorrupt)
	}
	hdr := payload[0]
	if v := hdr >> 4; v != formatVersion {
		return fmt.Errorf("%w: format version %d, want %d", ErrCorrupt, v, formatVersion)
	}
	if f := hdr & 0x0F; f&^knownFlags != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, f)
	}
	body := payload[1:]
	if hdr&flagLZ4 != 0 {
		rawLen, n := binary.Uvarint(body)
		if n <= 0 {
			return fmt.Errorf("%w: bad LZ4 length", ErrCorrupt)
		}
		block := body[n:]
		// Cap the buffer by the vocabulary and by what the block can expand
		// to, so a small hostile payload cannot make us allocate much.
		if rawLen == 0 || rawLen > uint64(d.maxBody) || rawLen > uint64(len(block))*lz4MaxRatio+16 {
			return fmt.Errorf("%w: LZ4 length %d out of range", ErrCorrupt, rawLen)
		}
		// make, not slices.Grow: Grow rounds the capacity up to the
		// allocator's size class, past maxBody.
		if cap(d.raw) < int(rawLen) {
			d.raw = make([]byte, rawLen)
		}
		d.raw = d.raw[:rawLen]
		got, err := lz4.UncompressBlock(block, d.raw)
		if err != nil {
			return fmt.Errorf("%w: lz4: %v", ErrCorrupt, err)
		}
		if got != int(rawLen) {
			return fmt.Errorf("%w: LZ4 block holds %d bytes, header says %d", ErrCorrupt, got, rawLen)
		}
		body = d.raw
	}
	return d.decodeBody(body, dst)
}

func (d *Decoder) decodeBody(b []byte, dst *Sparse) error {
	count, n := binary.Uvarint(b)
	if n <= 0 {
		return fmt.Errorf("%w: bad entry count", ErrCorrupt)
	}
	b = b[n:]
	// Each entry takes at least 3 bytes (1 id byte, 2 fp16 bytes): checking
	// that first bounds the allocation by the payload size.
	if count == 0 || count > uint64(d.vocab) || count > uint64(len(b))/3 {
		return fmt.Errorf("%w: %d entries in %d bytes (vocabulary %d)", ErrCorrupt, count, len(b), d.vocab)
	}
	k := int(count)
	dst.Tokens = slices.Grow(dst.Tokens[:0], k)[:k]
	dst.Probs = slices.Grow(dst.Probs[:0], k)[:k]
	next := uint64(0) // smallest id the next entry may have
	for i := range k {
		delta, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("%w: bad token delta at entry %d", ErrCorrupt, i)
		}
		b = b[n:]
		if delta >= uint64(d.vocab) || next+delta >= uint64(d.vocab) {
			return fmt.Errorf("%w: token id beyond vocabulary of %d at entry %d", ErrCorrupt, d.vocab, i)
		}
		id := next + delta
		dst.Tokens[i] = int32(id)
		next = id + 1
	}
	if len(b) != 2*k {
		return fmt.Errorf("%w: %d probability bytes for %d entries", ErrCorrupt, len(b), k)
	}
	h := d.h[:0]
	for i := range k {
		u := binary.LittleEndian.Uint16(b[2*i:])
		// Zero, negative, Inf and NaN never come out of the encoder.
		if u == 0 || u >= fp16Inf {
			return fmt.Errorf("%w: probability bits %#04x at entry %d", ErrCorrupt, u, i)
		}
		h = append(h, u)
	}
	d.h = h
	normalize(h, dst.Probs)
	return nil
}

// Encode is a one-shot Encoder.Encode for callers that do not reuse
// buffers.
func Encode(probs []float32, drafted int32, topP float64) ([]byte, error) {
	e, err := NewEncoder(topP)
	if err != nil {
		return nil, err
	}
	return e.Encode(nil, probs, drafted, nil)
}

// Decode is a one-shot Decoder.Decode.
func Decode(payload []byte, vocab int) (Sparse, error) {
	d, err := NewDecoder(vocab)
	if err != nil {
		return Sparse{}, err
	}
	var s Sparse
	err = d.Decode(payload, &s)
	return s, err
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}
