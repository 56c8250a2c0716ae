package codec

import (
	"encoding/binary"
	"errors"
	"go/build"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	vocabSmol = 49152  // SmolLM2
	vocabQwen = 151936 // Qwen2.5: beyond 16-bit ids
)

// llmLike returns a distribution shaped like a small language model's
// next-token output: Zipf-distributed probabilities (exponent 1.2 to 2.4)
// over a random permutation of the vocabulary. Measured on SmolLM2-135M, a
// real model keeps a median of 5 tokens at p = 0.8 (90th percentile 47);
// this keeps 3 (20).
func llmLike(rng *rand.Rand, vocab int) []float32 {
	s := 1.2 + rng.Float64()*1.2
	var z float64
	for k := range vocab {
		z += math.Pow(float64(k+1), -s)
	}
	out := make([]float32, vocab)
	for k, i := range rng.Perm(vocab) {
		out[i] = float32(math.Pow(float64(k+1), -s) / z)
	}
	return out
}

// refTopP is the obvious implementation: sort the whole vocabulary.
func refTopP(probs []float32, p float64) []int32 {
	idx := make([]int32, len(probs))
	var total float64
	for i, v := range probs {
		idx[i] = int32(i)
		total += float64(v)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		switch {
		case probs[a] > probs[b]:
			return -1
		case probs[a] < probs[b]:
			return 1
		}
		return 0
	})
	var mass float64
	n := 0
	for n < len(idx) && probs[idx[n]] > 0 && (mass < p*total || p >= 1) {
		mass += float64(probs[idx[n]])
		n++
	}
	kept := slices.Clone(idx[:n])
	slices.Sort(kept)
	return kept
}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	oneHot := make([]float32, vocabQwen)
	oneHot[vocabQwen-1] = 1
	lastHeavy := llmLike(rng, vocabQwen)
	lastHeavy[vocabQwen-1] = 5 // unnormalised input is fine
	zeroDrafted := llmLike(rng, vocabSmol)
	zeroDrafted[7] = 0
	scaledDown := llmLike(rng, vocabSmol) // sums to 0.01: the two-pass path
	for i := range scaledDown {
		scaledDown[i] /= 100
	}

	cases := []struct {
		name    string
		probs   []float32
		topP    float64
		drafted int32
	}{
		{"smol peaked", llmLike(rng, vocabSmol), 0.8, NoToken},
		{"qwen peaked", llmLike(rng, vocabQwen), 0.8, NoToken},
		{"smol p=0.99", llmLike(rng, vocabSmol), 0.99, NoToken},
		{"qwen p=1", llmLike(rng, vocabQwen), 1, NoToken},
		{"drafted outside top-p", llmLike(rng, vocabSmol), 0.8, 12345},
		{"qwen drafted outside top-p, high id", llmLike(rng, vocabQwen), 0.8, 151000},
		{"drafted with zero probability", zeroDrafted, 0.8, 7},
		{"one-hot at the last id", oneHot, 0.8, NoToken},
		{"one-hot, drafted elsewhere", oneHot, 0.8, 3},
		{"last id heavy, unnormalised", lastHeavy, 0.9, NoToken},
		{"sums to 0.01", scaledDown, 0.8, NoToken},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vocab := len(tc.probs)
			enc, err := NewEncoder(tc.topP)
			require.NoError(t, err)
			var view Sparse
			payload, err := enc.Encode(nil, tc.probs, tc.drafted, &view)
			require.NoError(t, err)

			got, err := Decode(payload, vocab)
			require.NoError(t, err)
			assert.Equal(t, view, got, "the encoder's view must equal the decoded distribution bit for bit")
			checkSparse(t, &got, vocab)

			want := refTopP(tc.probs, tc.topP)
			if tc.drafted != NoToken {
				if i, ok := slices.BinarySearch(want, tc.drafted); !ok {
					want = slices.Insert(want, i, tc.drafted)
				}
				assert.Positive(t, got.Prob(tc.drafted), "the drafted token must keep positive mass")
			}
			assert.Equal(t, want, got.Tokens, "kept set")
			if tc.topP < 1 {
				assert.LessOrEqual(t, TVD(tc.probs, &got), 1-tc.topP+1e-3)
			}
			t.Logf("kept %d tokens in %d bytes (lz4=%v)", got.Len(), len(payload), payload[0]&flagLZ4 != 0)
		})
	}
}

// checkSparse asserts what every decoded distribution guarantees.
func checkSparse(t *testing.T, s *Sparse, vocab int) {
	t.Helper()
	require.Equal(t, len(s.Tokens), len(s.Probs))
	require.NotEmpty(t, s.Tokens)
	var sum float64
	for i, tok := range s.Tokens {
		require.True(t, tok >= 0 && int(tok) < vocab, "token %d outside vocabulary %d", tok, vocab)
		if i > 0 {
			require.Greater(t, tok, s.Tokens[i-1], "tokens must increase")
		}
		require.Positive(t, s.Probs[i])
		sum += float64(s.Probs[i])
	}
	require.InDelta(t, 1, sum, 1e-4)
}

func TestProbabilitiesSurviveFP16(t *testing.T) {
	probs := make([]float32, 1000)
	probs[10], probs[20], probs[30] = 0.5, 0.3, 0.2
	s, err := Decode(mustEncode(t, probs, NoToken, 1), len(probs))
	require.NoError(t, err)
	assert.Equal(t, []int32{10, 20, 30}, s.Tokens)
	assert.InDeltaSlice(t, []float32{0.5, 0.3, 0.2}, s.Probs, 1e-3)
	assert.InDelta(t, 0.3, s.Prob(20), 1e-3)
	assert.Zero(t, s.Prob(11))
	assert.Zero(t, s.Prob(-1))

	dense := s.Dense(nil, len(probs))
	require.Len(t, dense, len(probs))
	assert.Equal(t, s.Probs[1], dense[20])
	assert.Zero(t, dense[21])
	// Dense reuses and clears its buffer.
	dense[999] = 7
	dense = s.Dense(dense, len(probs))
	assert.Zero(t, dense[999])
}

func TestTopPTies(t *testing.T) {
	// A flat distribution: every token ties, so exactly ceil(0.8·V) are kept.
	const vocab = 1000
	probs := make([]float32, vocab)
	for i := range probs {
		probs[i] = 1.0 / vocab
	}
	s, err := Decode(mustEncode(t, probs, NoToken, 0.8), vocab)
	require.NoError(t, err)
	assert.InDelta(t, 800, s.Len(), 1)
	checkSparse(t, &s, vocab)

	// Two plateaus: all of the upper one and part of the lower one.
	for i := range probs {
		probs[i] = 1
		if i%2 == 0 {
			probs[i] = 3
		}
	}
	s, err = Decode(mustEncode(t, probs, NoToken, 0.9), vocab)
	require.NoError(t, err)
	var high int
	for _, tok := range s.Tokens {
		if tok%2 == 0 {
			high++
		}
	}
	assert.Equal(t, 500, high)
	assert.InDelta(t, 500+300, s.Len(), 1) // 0.9·2000 = 1500 + 300·1
}

func TestEncodeLargeKeptSetUsesLZ4(t *testing.T) {
	// A uniform block of tokens: zero deltas and equal values compress well.
	probs := make([]float32, vocabSmol)
	for i := 100; i < 2100; i++ {
		probs[i] = 1
	}
	payload := mustEncode(t, probs, NoToken, 1)
	require.NotZero(t, payload[0]&flagLZ4, "LZ4 should be chosen")
	assert.Less(t, len(payload), 2000*3/10)
	s, err := Decode(payload, vocabSmol)
	require.NoError(t, err)
	require.Equal(t, 2000, s.Len())
	assert.Equal(t, int32(100), s.Tokens[0])
	assert.Equal(t, int32(2099), s.Tokens[1999])

	// A few scattered tokens do not compress: raw body, flag clear.
	rng := rand.New(rand.NewPCG(3, 4))
	payload = mustEncode(t, llmLike(rng, vocabSmol), NoToken, 0.8)
	assert.Zero(t, payload[0]&flagLZ4)
}

func TestEncoderReuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	enc, err := NewEncoder(0.8)
	require.NoError(t, err)
	dec, err := NewDecoder(vocabSmol)
	require.NoError(t, err)
	var buf []byte
	var view, out Sparse
	for i := range 50 {
		probs := llmLike(rng, vocabSmol)
		buf, err = enc.Encode(buf[:0], probs, int32(i*997), &view)
		require.NoError(t, err)
		require.NoError(t, dec.Decode(buf, &out))
		require.Equal(t, view, out)
		fresh, err := Encode(probs, int32(i*997), 0.8)
		require.NoError(t, err)
		require.Equal(t, fresh, buf, "a reused encoder must produce the same bytes")
	}
}

func TestEncodeRejectsBadInput(t *testing.T) {
	good := []float32{0.5, 0.5}
	cases := []struct {
		name    string
		probs   []float32
		drafted int32
		topP    float64
	}{
		{"empty", nil, NoToken, 0.8},
		{"NaN", []float32{0.5, float32(math.NaN())}, NoToken, 0.8},
		{"negative", []float32{0.5, -0.1, 0.6}, NoToken, 0.8},
		{"+Inf", []float32{float32(math.Inf(1)), 0, 0, 0, 0}, NoToken, 0.8},
		{"all zero", make([]float32, 9), NoToken, 0.8},
		{"drafted beyond vocabulary", good, 2, 0.8},
		{"drafted negative", good, -5, 0.8},
		{"top-p zero", good, NoToken, 0},
		{"top-p above one", good, NoToken, 1.5},
		{"top-p NaN", good, NoToken, math.NaN()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Encode(tc.probs, tc.drafted, tc.topP)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
		})
	}
	// -0 is a zero, not a negative probability.
	_, err := Encode([]float32{float32(math.Copysign(0, -1)), 1}, NoToken, 0.8)
	assert.NoError(t, err)
}

func TestDecodeRejectsGarbage(t *testing.T) {
	const vocab = 1000
	body := func(parts ...[]byte) []byte { return slices.Concat(parts...) }
	uv := func(x uint64) []byte { return binary.AppendUvarint(nil, x) }
	fp := func(bits ...uint16) []byte {
		var b []byte
		for _, h := range bits {
			b = binary.LittleEndian.AppendUint16(b, h)
		}
		return b
	}
	hdr := []byte{formatVersion << 4}
	one := uint16(0x3C00) // fp16 1.0

	valid := body(hdr, uv(2), uv(5), uv(0), fp(one, one))
	s, err := Decode(valid, vocab)
	require.NoError(t, err, "the baseline payload must be valid")
	require.Equal(t, []int32{5, 6}, s.Tokens)

	cases := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"header only", hdr},
		{"version 0", body([]byte{0x00}, uv(1), uv(5), fp(one))},
		{"version 2", body([]byte{0x20}, uv(1), uv(5), fp(one))},
		{"unknown flag", body([]byte{formatVersion<<4 | 0x2}, uv(1), uv(5), fp(one))},
		{"zero entries", body(hdr, uv(0))},
		{"more entries than vocabulary", body(hdr, uv(vocab+1), make([]byte, 3*(vocab+1)))},
		{"count larger than payload", body(hdr, uv(50), uv(1), fp(one))},
		{"truncated varint", body(hdr, []byte{0x80})},
		{"id at vocabulary size", body(hdr, uv(1), uv(vocab), fp(one))},
		{"ids run past vocabulary", body(hdr, uv(2), uv(vocab-1), uv(0), fp(one, one))},
		{"huge delta", body(hdr, uv(1), uv(math.MaxUint64), fp(one, 0))},
		{"trailing byte", body(valid, []byte{0})},
		{"missing probability byte", valid[:len(valid)-1]},
		{"zero probability", body(hdr, uv(1), uv(5), fp(0))},
		{"negative probability", body(hdr, uv(1), uv(5), fp(0xBC00))},
		{"infinite probability", body(hdr, uv(1), uv(5), fp(0x7C00))},
		{"NaN probability", body(hdr, uv(1), uv(5), fp(0x7E00))},
		{"lz4 without length", []byte{formatVersion<<4 | flagLZ4}},
		{"lz4 zero length", body([]byte{formatVersion<<4 | flagLZ4}, uv(0), []byte{0x10, 0})},
		{"lz4 length beyond vocabulary bound", body([]byte{formatVersion<<4 | flagLZ4}, uv(1<<40), []byte{0x10, 0})},
		{"lz4 length beyond block expansion", body([]byte{formatVersion<<4 | flagLZ4}, uv(5000), []byte{0x10, 0})},
		{"lz4 garbage block", body([]byte{formatVersion<<4 | flagLZ4}, uv(9), []byte{0xff, 0xff, 0xff})},
		{"lz4 short block", body([]byte{formatVersion<<4 | flagLZ4}, uv(9), []byte{0x30, 1, 2, 3})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.payload, vocab)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrCorrupt)
		})
	}

	_, err = NewDecoder(0)
	assert.ErrorIs(t, err, ErrInvalid)
}

func TestSelectThresholdMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 300 {
		n := 1 + rng.IntN(3000)
		vals := make([]float32, n)
		levels := 1 + rng.IntN(50) // few levels: many ties
		var total float64
		for i := range vals {
			vals[i] = float32(1 + rng.IntN(levels))
			if trial%2 == 0 {
				vals[i] = rng.Float32() + 1e-6
			}
			total += float64(vals[i])
		}
		target := total * (0.05 + 0.9*rng.Float64())
		sorted := slices.Clone(vals)
		slices.Sort(sorted)
		slices.Reverse(sorted)

		tau, ties := selectThreshold(slices.Clone(vals), target)
		var mass float64
		kept := 0
		for _, v := range sorted {
			if v > tau {
				mass += float64(v)
				kept++
			}
		}
		mass += float64(ties) * float64(tau)
		kept += ties
		require.GreaterOrEqual(t, mass, target*(1-1e-9), "trial %d: kept set must reach the target", trial)
		// Minimal: without the last kept token the target is missed.
		require.Less(t, mass-float64(tau), target*(1+1e-9), "trial %d: kept set must be the smallest", trial)
		require.Equal(t, sorted[kept-1], tau, "trial %d: τ must be the smallest kept value", trial)
	}
}

func TestTVD(t *testing.T) {
	probs := []float32{0.5, 0.3, 0.2, 0}
	s := Sparse{Tokens: []int32{0, 1}, Probs: []float32{0.625, 0.375}}
	assert.InDelta(t, 0.2, TVD(probs, &s), 1e-6)
	same := Sparse{Tokens: []int32{0, 1, 2}, Probs: []float32{0.5, 0.3, 0.2}}
	assert.InDelta(t, 0, TVD(probs, &same), 1e-6)
}

func TestBench(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	dists := make([][]float32, 12)
	drafted := make([]int32, len(dists))
	for i := range dists {
		dists[i] = llmLike(rng, vocabSmol)
		drafted[i] = int32(rng.IntN(vocabSmol))
	}
	res, err := Bench(dists, drafted)
	require.NoError(t, err)
	assert.Equal(t, len(dists), res.Tokens)
	assert.Equal(t, vocabSmol, res.Vocab)
	assert.Positive(t, res.BytesPerToken)
	assert.Greater(t, res.RatioVsFP32, 100.0)
	assert.Greater(t, res.RatioVsJSON, res.RatioVsFP32, "JSON is bigger than fp32")
	assert.Positive(t, res.EncDecUS)
	require.Len(t, res.TVD, 4)
	assert.LessOrEqual(t, res.TVD["0.8"], 0.2+1e-3)
	assert.LessOrEqual(t, res.TVD["0.99"], res.TVD["0.8"])
	t.Logf("%+v", res)

	_, err = Bench(nil, nil)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = Bench(dists, drafted[:1])
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = Bench([][]float32{{1, 0}, {1}}, nil)
	assert.ErrorIs(t, err, ErrInvalid)
}

// TestImports keeps the codec a leaf: no gRPC, no cgo, nothing of ours.
func TestImports(t *testing.T) {
	pkg, err := build.Default.ImportDir(".", 0)
	require.NoError(t, err)
	allowed := map[string]bool{"github.com/pierrec/lz4/v4": true, "github.com/x448/float16": true}
	for _, imp := range pkg.Imports {
		if strings.Contains(imp, ".") { // not the standard library
			assert.True(t, allowed[imp], "codec must not import %s", imp)
		}
		assert.NotEqual(t, "C", imp, "codec must not use cgo")
	}
}

func mustEncode(t *testing.T, probs []float32, drafted int32, topP float64) []byte {
	t.Helper()
	b, err := Encode(probs, drafted, topP)
	require.NoError(t, err)
	return b
}

func FuzzDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, p := range []float64{0.8, 1} {
		b, err := Encode(llmLike(rng, 5000), 17, p)
		require.NoError(f, err)
		f.Add(b, uint32(5000))
	}
	flat := make([]float32, 3000)
	for i := range flat {
		flat[i] = 1
	}
	b, err := Encode(flat, NoToken, 1) // an LZ4 payload
	require.NoError(f, err)
	f.Add(b, uint32(3000))
	f.Add([]byte{}, uint32(10))
	f.Add([]byte{0x11, 0xff, 0xff, 0xff, 0x0f, 0x00}, uint32(152000))

	dec := map[uint32]*Decoder{}
	f.Fuzz(func(t *testing.T, payload []byte, v uint32) {
		vocab := 1 + v%200_000
		d := dec[vocab]
		if d == nil {
			var err error
			d, err = NewDecoder(int(vocab))
			require.NoError(t, err)
			dec[vocab] = d
		}
		var s Sparse
		err := d.Decode(payload, &s)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		// Plain checks, not testify: the minimizer runs this body a lot.
		if len(s.Tokens) == 0 || len(s.Tokens) != len(s.Probs) {
			t.Fatalf("%d tokens, %d probabilities", len(s.Tokens), len(s.Probs))
		}
		var sum float64
		prev := int32(-1)
		for i, tok := range s.Tokens {
			if tok <= prev || int64(tok) >= int64(vocab) || !(s.Probs[i] > 0) {
				t.Fatalf("entry %d: token %d after %d, p %v (vocabulary %d)", i, tok, prev, s.Probs[i], vocab)
			}
			prev = tok
			sum += float64(s.Probs[i])
		}
		if math.Abs(sum-1) > 1e-4 {
			t.Fatalf("probabilities sum to %v", sum)
		}
		// A payload of n bytes holds at most 255·n LZ4-expanded bytes,
		// three or more per entry.
		if s.Len() > len(payload)*lz4MaxRatio/3+16 || cap(d.raw) > d.maxBody {
			t.Fatalf("%d entries and a %d-byte buffer from %d bytes", s.Len(), cap(d.raw), len(payload))
		}
	})
}

func BenchmarkEncodeDecode(b *testing.B) {
	for _, vocab := range []int{vocabSmol, vocabQwen} {
		b.Run("vocab="+strconv.Itoa(vocab), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(13, 14))
			dists := make([][]float32, 64)
			for i := range dists {
				dists[i] = llmLike(rng, vocab)
			}
			enc, _ := NewEncoder(DefaultTopP)
			dec, _ := NewDecoder(vocab)
			var buf []byte
			var out Sparse
			var bytes int
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				d := dists[i%len(dists)]
				var err error
				if buf, err = enc.Encode(buf[:0], d, NoToken, nil); err != nil {
					b.Fatal(err)
				}
				if err := dec.Decode(buf, &out); err != nil {
					b.Fatal(err)
				}
				bytes += len(buf)
			}
			b.ReportMetric(float64(bytes)/float64(b.N), "payload-B/op")
		})
	}
}

// BenchmarkEncodeDecodeReal measures real model output when
// DRAGON_CODEC_DISTS names a dump: a little-endian uint32 vocabulary size,
// then per token an int32 drafted token and vocab float32 probabilities.
func BenchmarkEncodeDecodeReal(b *testing.B) {
	path := os.Getenv("DRAGON_CODEC_DISTS")
	if path == "" {
		b.Skip("DRAGON_CODEC_DISTS not set")
	}
	dists, drafted := loadDump(b, path)
	enc, _ := NewEncoder(DefaultTopP)
	dec, _ := NewDecoder(len(dists[0]))
	var buf []byte
	var out Sparse
	var bytes int
	for i := 0; b.Loop(); i++ {
		k := i % len(dists)
		var err error
		if buf, err = enc.Encode(buf[:0], dists[k], drafted[k], nil); err != nil {
			b.Fatal(err)
		}
		if err := dec.Decode(buf, &out); err != nil {
			b.Fatal(err)
		}
		bytes += len(buf)
	}
	b.ReportMetric(float64(bytes)/float64(b.N), "payload-B/op")
	if b.N > 1 {
		res, err := Bench(dists, drafted)
		require.NoError(b, err)
		b.Logf("Bench: %+v", res)
	}
}

func loadDump(tb testing.TB, path string) ([][]float32, []int32) {
	raw, err := os.ReadFile(path)
	require.NoError(tb, err)
	require.GreaterOrEqual(tb, len(raw), 4)
	vocab := int(binary.LittleEndian.Uint32(raw))
	raw = raw[4:]
	var dists [][]float32
	var drafted []int32
	for len(raw) >= 4+4*vocab {
		drafted = append(drafted, int32(binary.LittleEndian.Uint32(raw)))
		d := make([]float32, vocab)
		for i := range d {
			d[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4+4*i:]))
		}
		dists = append(dists, d)
		raw = raw[4+4*vocab:]
	}
	require.NotEmpty(tb, dists, "no distributions in %s", path)
	return dists, drafted
}

func BenchmarkEncode(b *testing.B) {
	rng := rand.New(rand.NewPCG(15, 16))
	probs := llmLike(rng, vocabSmol)
	enc, _ := NewEncoder(DefaultTopP)
	var buf []byte
	for b.Loop() {
		buf, _ = enc.Encode(buf[:0], probs, NoToken, nil)
	}
}

func BenchmarkDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(17, 18))
	payload, _ := Encode(llmLike(rng, vocabSmol), NoToken, DefaultTopP)
	dec, _ := NewDecoder(vocabSmol)
	var out Sparse
	for b.Loop() {
		_ = dec.Decode(payload, &out)
	}
}

// TestDraftFromViewKeepsPayload checks the order Encode documents: a token
// drawn from the view does not change the payload, so a side can encode
// first, draft from the view, and send those bytes.
func TestDraftFromViewKeepsPayload(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	enc, err := NewEncoder(DefaultTopP)
	require.NoError(t, err)
	for range 20 {
		probs := llmLike(rng, vocabSmol)
		var view Sparse
		first, err := enc.Encode(nil, probs, NoToken, &view)
		require.NoError(t, err)
		draft := view.Tokens[rng.IntN(view.Len())]
		again, err := enc.Encode(nil, probs, draft, nil)
		require.NoError(t, err)
		require.Equal(t, first, again)
	}
}

// The LZ4 buffer a decoder keeps is bounded by maxBody, capacity included,
// even when a payload asks for maxBody bytes and then fails to decode.
func TestDecoderBufferStaysWithinMaxBody(t *testing.T) {
	d, err := NewDecoder(161)
	require.NoError(t, err)
	raw := make([]byte, d.maxBody)
	block := make([]byte, lz4.CompressBlockBound(len(raw)))
	n, err := lz4.CompressBlock(raw, block, nil)
	require.NoError(t, err)
	payload := binary.AppendUvarint([]byte{formatVersion<<4 | flagLZ4}, uint64(len(raw)))
	payload = append(payload, block[:n]...)
	var s Sparse
	require.ErrorIs(t, d.Decode(payload, &s), ErrCorrupt)
	assert.LessOrEqual(t, cap(d.raw), d.maxBody)
}

// weightsOf turns fuzz bytes into a probability vector with zeros, ties,
// a wide range of magnitudes (subnormals, then 2^-16 to about 2^14) and,
// from some bytes, values the encoder must refuse (NaN, -x, +Inf).
func weightsOf(b []byte) []float32 {
	probs := make([]float32, len(b))
	for i, c := range b {
		switch {
		case c == 0:
		case c == 0xfd:
			probs[i] = float32(math.NaN())
		case c == 0xfe:
			probs[i] = -1
		case c == 0xff:
			probs[i] = float32(math.Inf(1))
		case c >= 0xf0:
			probs[i] = math.Float32frombits(uint32(c - 0xf0 + 1)) // subnormal
		default:
			probs[i] = float32(math.Ldexp(1+float64(c&7)/8, int(c>>3)-16))
		}
	}
	return probs
}

// FuzzEncode: any vector the encoder takes gives a payload that decodes,
// bit for bit, to the view it reports, holds the drafted token, and keeps
// at least the top-p share of the mass; anything else is ErrInvalid.
func FuzzEncode(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 200, 0, 7}, uint8(80), int32(3))
	f.Add([]byte{0, 0, 0, 0}, uint8(99), int32(-1))
	f.Add([]byte{0xf1, 0xf2, 0xef, 0, 0xef}, uint8(50), int32(0))
	f.Add([]byte{10, 10, 10, 10, 10, 10, 10, 10}, uint8(0), int32(7))
	dec := map[int]*Decoder{}
	f.Fuzz(func(t *testing.T, b []byte, p uint8, drafted int32) {
		probs := weightsOf(b)
		topP := float64(p%100+1) / 100
		if drafted < 0 {
			drafted = NoToken
		}
		enc, err := NewEncoder(topP)
		if err != nil {
			t.Fatal(err)
		}
		var view Sparse
		payload, err := enc.Encode(nil, probs, drafted, &view)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		d := dec[len(probs)]
		if d == nil {
			if d, err = NewDecoder(len(probs)); err != nil {
				t.Fatal(err)
			}
			dec[len(probs)] = d
		}
		var got Sparse
		if err := d.Decode(payload, &got); err != nil {
			t.Fatalf("its own payload does not decode: %v", err)
		}
		if !slices.Equal(got.Tokens, view.Tokens) || !slices.EqualFunc(got.Probs, view.Probs, func(a, b float32) bool {
			return math.Float32bits(a) == math.Float32bits(b)
		}) {
			t.Fatalf("decoded %v, the encoder's view %v", got, view)
		}
		if drafted != NoToken && !slices.Contains(view.Tokens, drafted) {
			t.Fatalf("drafted token %d not kept in %v", drafted, view.Tokens)
		}
		var total, kept float64
		for _, q := range probs {
			total += float64(q)
		}
		for _, tok := range view.Tokens {
			kept += float64(probs[tok])
		}
		if kept < topP*total*(1-1e-6) {
			t.Fatalf("kept %v of %v, under top-p %v", kept, total, topP)
		}
	})
}
