package session

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/specdec"
)

// TestMain checks that no session leaves a goroutine behind (bleve, which
// IndexRetriever imports, starts its analysis workers at init).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

var (
	devicePassages = []decoder.Passage{
		{Text: "From: Ann. The lamp at the harbour office is broken; call Bob at 555-0100.", Score: 2},
		{Text: "From: Bob. Meeting moved to Friday at the lighthouse, bring the lamp.", Score: 1},
	}
	cloudPassages = []decoder.Passage{
		{Text: "The lighthouse keeper lit the lamp at dusk and put it out at dawn.", Score: 1.5},
		{Text: "Harbour offices keep spare lamps for the lighthouse in winter.", Score: 0.5},
	}
)

const query = "Who should I call about the lamp at the lighthouse?"

// copier is a fake model that copies text from its context often, so that
// local speculation pays. The fake's distributions hardly depend on the
// passages, so the cloud runs it with another seed: the two sides then
// disagree as sides with different corpora do.
var copier = fake.Config{Seed: 3, Vocab: 300, Copy: 5, CopyOrder: 1, CallLatency: 200 * time.Microsecond}

func newDecoder(t *testing.T, side aggregator.Side, spec bool) *decoder.Decoder {
	t.Helper()
	return newDecoderCalls(t, side, spec, copier.CallLatency)
}

// newDecoderCalls is newDecoder with each model call taking callLatency.
func newDecoderCalls(t *testing.T, side aggregator.Side, spec bool, callLatency time.Duration) *decoder.Decoder {
	t.Helper()
	return newDecoderHedged(t, side, spec, callLatency, 0)
}

// newDecoderHedged is newDecoderCalls with hedges slots for hedge
// branches.
func newDecoderHedged(t *testing.T, side aggregator.Side, spec bool, callLatency time.Duration, hedges int) *decoder.Decoder {
	t.Helper()
	return newDecoderWith(t, side, spec, callLatency, hedges, 0)
}

// newDecoderWith is newDecoderHedged with posterior weights every
// posteriorEvery tokens (0: static weights), on a model whose logits
// depend on the whole context (so that the passages disagree) when they
// are on.
func newDecoderWith(t *testing.T, side aggregator.Side, spec bool, callLatency time.Duration, hedges, posteriorEvery int) *decoder.Decoder {
	t.Helper()
	cfg := copier
	if posteriorEvery > 0 {
		cfg.Order = 1 << 20
	}
	cfg.CallLatency = callLatency
	if side == aggregator.Cloud {
		cfg.Seed = 4
	}
	opts := decoder.Options{MaxPassages: 4, CtxPerSeq: 512, Hedges: hedges, PosteriorEvery: posteriorEvery}
	if spec {
		opts.Spec = specdec.DefaultOptions()
		opts.NoCostModel = true // verify every draft: bursts are what this tests
	}
	d, err := decoder.New(fake.New(cfg), opts)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// delayed delivers each sent message after a latency, in order, as a
// slow link would.
type delayed struct {
	Conn
	mu    sync.Mutex
	last  time.Time
	delay func() time.Duration
	wg    sync.WaitGroup
	queue chan func()
}

func withLatency(c Conn, delay func() time.Duration) *delayed {
	d := &delayed{Conn: c, delay: delay, queue: make(chan func(), 4096)}
	go func() {
		for f := range d.queue {
			f()
		}
	}()
	return d
}

func (d *delayed) Send(m *dragonv1.PeerMessage) error {
	d.mu.Lock()
	at := time.Now().Add(d.delay())
	if at.Before(d.last) {
		at = d.last
	}
	d.last = at
	d.mu.Unlock()
	d.queue <- func() {
		time.Sleep(time.Until(at))
		_ = d.Conn.Send(m)
	}
	return nil
}

func (d *delayed) close() { close(d.queue) }

type pairConfig struct {
	sync        Sync
	sampling    sampling.Params
	switchEvery int
	first       aggregator.Side
	spec        bool
	latency     func() time.Duration
	maxTokens   int
	// deviceCall and cloudCall, when set, are each side's model time per
	// call.
	deviceCall, cloudCall time.Duration
	blind                 bool
	strategy              aggregator.Strategy
	confidence            float64
	// hedges: both sides may hedge this many drafts at once, branches
	// hedgeDepth deep, every blind draft of probability under hedgeBelow.
	hedges, hedgeDepth int
	hedgeBelow         float64
	// sources: the device asks for the answer's sources.
	sources bool
	// posteriorEvery: both sides weigh their passages by their posterior
	// every this many tokens (decoder.Options.PosteriorEvery).
	posteriorEvery int
}

// runPair runs a device and a cloud side against each other and returns
// both summaries.
func runPair(t *testing.T, c pairConfig) (dev, cld Summary) {
	t.Helper()
	a, b := Pipe()
	var devConn, cldConn Conn = a, b
	if c.latency != nil {
		da, db := withLatency(a, c.latency), withLatency(b, c.latency)
		defer da.close()
		defer db.close()
		devConn, cldConn = da, db
	}
	if c.maxTokens == 0 {
		c.maxTokens = 40
	}
	if c.deviceCall == 0 {
		c.deviceCall = copier.CallLatency
	}
	if c.cloudCall == 0 {
		c.cloudCall = copier.CallLatency
	}
	opts := func(side aggregator.Side) Options {
		return Options{
			Self: side, SessionID: 9, Sync: c.sync, Owner: side == aggregator.Device, Sampling: c.sampling,
			MaxTokens: c.maxTokens, Aggregator: c.first, SwitchEvery: c.switchEvery, PingEvery: 5 * time.Millisecond,
			Blind: c.blind, Strategy: c.strategy, Confidence: c.confidence,
			Hedges: c.hedges, HedgeDepth: c.hedgeDepth, HedgeBelow: c.hedgeBelow, Sources: c.sources,
		}
	}
	newDec := func(side aggregator.Side, call time.Duration) *decoder.Decoder {
		d := newDecoderWith(t, side, c.spec, call, c.hedges, c.posteriorEvery)
		d.SetEvidence(c.sources)
		return d
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var cloudErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		cld, cloudErr = Run(ctx, opts(aggregator.Cloud), newDec(aggregator.Cloud, c.cloudCall), query, cloudPassages, cldConn, nil)
	}()
	var emitted []engine.Token
	dev, err := Run(ctx, opts(aggregator.Device), newDec(aggregator.Device, c.deviceCall), query, devicePassages, devConn,
		func(step int, tok engine.Token) (bool, error) {
			require.Equal(t, len(emitted), step)
			emitted = append(emitted, tok)
			return false, nil
		})
	require.NoError(t, err)
	wg.Wait()
	a.Close()
	require.NoError(t, cloudErr)
	require.Equal(t, emitted, dev.Tokens)
	return dev, cld
}

// TestGreedySpeculativeEqualsTokenWise: greedy DRAGON emits exactly the
// tokens token-wise synchronisation emits, with or without local
// speculation, whoever aggregates and however often the aggregator moves.
func TestGreedySpeculativeEqualsTokenWise(t *testing.T) {
	tw, _ := runPair(t, pairConfig{sync: TokenWise})
	require.NotEmpty(t, tw.Tokens)
	assert.Zero(t, tw.Switches)
	for _, c := range []pairConfig{
		{first: aggregator.Device},
		{first: aggregator.Cloud, spec: true},
		{switchEvery: 3, spec: true},
		{switchEvery: 1, first: aggregator.Cloud},
	} {
		name := fmt.Sprintf("first %v, switch every %d, spec %v", c.first, c.switchEvery, c.spec)
		dev, cld := runPair(t, c)
		assert.Equal(t, tw.Tokens, dev.Tokens, name)
		assert.Equal(t, dev.Tokens, cld.Tokens, "%s: both sides decided the same", name)
		assert.Equal(t, tw.Finish, dev.Finish, name)
		if c.switchEvery > 0 {
			// A burst of local drafts can decide several steps at once.
			assert.GreaterOrEqual(t, dev.Switches, uint64(len(dev.Tokens)/(c.switchEvery+specdec.DefaultOptions().MaxDraft)), name)
			assert.Greater(t, dev.Switches, uint64(2), name)
			assert.Positive(t, dev.Aggregated[0], name)
			assert.Positive(t, dev.Aggregated[1], name)
		}
	}
}

// TestGreedyDraftsBesideThePeer: the slower side has the faster side's
// drafts in hand when it drafts (the follower's through shared drafts), and
// drafts the mixture's argmax there instead of its own: its drafts are
// rejected less often than blind ones, and the answer is still the
// token-wise one.
func TestGreedyDraftsBesideThePeer(t *testing.T) {
	tw, _ := runPair(t, pairConfig{sync: TokenWise})
	slow := 3 * time.Millisecond
	for _, c := range []pairConfig{
		{deviceCall: slow},             // the aggregator lags
		{deviceCall: slow, spec: true}, // with local speculation
		{cloudCall: slow},              // the follower lags
	} {
		c.first, c.strategy = aggregator.Device, aggregator.StaticDevice
		lagging, sum := aggregator.Device, func(dev, _ Summary) Summary { return dev }
		if c.cloudCall > 0 {
			lagging, sum = aggregator.Cloud, func(_, cld Summary) Summary { return cld }
		}
		name := fmt.Sprintf("%v lags, spec %v", lagging, c.spec)
		beside := sum(runPair(t, c))
		c.blind = true
		blind := sum(runPair(t, c))
		assert.Equal(t, tw.Tokens, beside.Tokens, name)
		assert.Equal(t, tw.Tokens, blind.Tokens, name)
		assert.Zero(t, beside.Switches, name)
		assert.Positive(t, beside.Beside, name)
		assert.Zero(t, blind.Beside, name)
		i := lagging.Index()
		assert.Positive(t, blind.Rejected[i], "%s: the sides disagree", name)
		assert.Less(t, beside.Rejected[i], blind.Rejected[i], name)
		t.Logf("%s: %d drafts moved, %d rejected; blind %d rejected of %d", name, beside.Beside, beside.Rejected[i], blind.Rejected[i], len(tw.Tokens))
	}
}

// TestSampledAnswerDependsOnSeedOnly: sampled DRAGON and token-wise
// synchronisation give the same answer for a seed (the randomness is keyed
// by step), under a jittery link, with local speculation and handovers.
func TestSampledAnswerDependsOnSeedOnly(t *testing.T) {
	sp := sampling.Params{Temperature: 0.9, Seed: 77}
	tw, _ := runPair(t, pairConfig{sync: TokenWise, sampling: sp})
	jitter := uniformDelay(1, 3*time.Millisecond)
	dev, cld := runPair(t, pairConfig{sampling: sp, spec: true, switchEvery: 4, latency: jitter})
	assert.Equal(t, tw.Tokens, dev.Tokens)
	assert.Equal(t, dev.Tokens, cld.Tokens)
	assert.Positive(t, dev.Rejected[0]+dev.Rejected[1], "the sides disagreed at times")
	assert.Positive(t, dev.AbortedPasses+cld.AbortedPasses, "rejections stopped passes in flight")
	assert.Positive(t, dev.Early+cld.Early, "drafts are shared, so the side that does not aggregate decides steps itself")

	blind, blindCld := runPair(t, pairConfig{sampling: sp, spec: true, switchEvery: 4, latency: jitter, blind: true})
	assert.Equal(t, tw.Tokens, blind.Tokens, "DRAGON's own protocol, drafts kept to the aggregator")
	assert.Zero(t, blind.Early+blindCld.Early)

	other, _ := runPair(t, pairConfig{sync: TokenWise, sampling: sampling.Params{Temperature: 0.9, Seed: 78}})
	assert.NotEqual(t, tw.Tokens, other.Tokens, "another seed, another answer")
}

// TestConfidenceWeightsAgreeAcrossModes: with confidence weights both
// sides weigh each step alike, so greedy and sampled dragon (local
// speculation, handovers) still give token-wise sync's answer under the
// same weights; the weights change the greedy answer of these sides.
func TestConfidenceWeightsAgreeAcrossModes(t *testing.T) {
	for _, sp := range []sampling.Params{{}, {Temperature: 0.9, Seed: 5}} {
		tw, _ := runPair(t, pairConfig{sync: TokenWise, sampling: sp, confidence: 0.3})
		require.NotEmpty(t, tw.Tokens)
		dev, cld := runPair(t, pairConfig{sampling: sp, spec: true, switchEvery: 3, confidence: 0.3})
		assert.Equal(t, tw.Tokens, dev.Tokens, "temperature %v", sp.Temperature)
		assert.Equal(t, dev.Tokens, cld.Tokens, "temperature %v", sp.Temperature)
	}
	plain, _ := runPair(t, pairConfig{sync: TokenWise})
	weighed, _ := runPair(t, pairConfig{sync: TokenWise, confidence: 0.3})
	assert.NotEqual(t, plain.Tokens, weighed.Tokens, "the weights take effect")
}

// TestPosteriorWeightsAgreeAcrossModes: with posterior weights each side
// weighs its passages by their evidence of the answer so far, at
// positions fixed by the token count, so greedy and sampled dragon (local
// speculation, handovers, a jittery link) give token-wise sync's answer;
// the weights change the greedy answer.
func TestPosteriorWeightsAgreeAcrossModes(t *testing.T) {
	jitter := uniformDelay(5, 2*time.Millisecond)
	for _, sp := range []sampling.Params{{}, {Temperature: 0.9, Seed: 5}} {
		tw, _ := runPair(t, pairConfig{sync: TokenWise, sampling: sp, posteriorEvery: 4})
		require.NotEmpty(t, tw.Tokens)
		dev, cld := runPair(t, pairConfig{sampling: sp, spec: true, switchEvery: 3, latency: jitter, posteriorEvery: 4, sources: true})
		assert.Equal(t, tw.Tokens, dev.Tokens, "temperature %v", sp.Temperature)
		assert.Equal(t, dev.Tokens, cld.Tokens, "temperature %v", sp.Temperature)
	}
	plain, _ := runPair(t, pairConfig{sync: TokenWise, posteriorEvery: 1 << 20})
	weighed, _ := runPair(t, pairConfig{sync: TokenWise, posteriorEvery: 1})
	assert.NotEqual(t, plain.Tokens, weighed.Tokens, "the weights take effect")
}

// uniformDelay is a link's delay of each message, uniform in [0, most)
// microsecond by microsecond, from a generator seeded by seed that both
// directions draw from.
func uniformDelay(seed uint64, most time.Duration) func() time.Duration {
	r := rand.New(rand.NewPCG(seed, seed+1))
	var mu sync.Mutex
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(r.Int64N(most.Microseconds())) * time.Microsecond
	}
}

// runModes runs the device half f against the cloud half g over a pipe.
func runModes(t *testing.T, dev func(Conn) (Summary, error), cld func(Conn) error) Summary {
	t.Helper()
	a, b := Pipe()
	defer a.Close()
	var wg sync.WaitGroup
	var cloudErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		cloudErr = cld(b)
	}()
	sum, err := dev(a)
	require.NoError(t, err)
	a.Close()
	wg.Wait()
	require.NoError(t, cloudErr)
	return sum
}

// TestBaselineModes runs sequence-wise aggregation, the cloud alone and the
// cloud's passages as text, and checks each answer against what the same
// computation gives locally.
func TestBaselineModes(t *testing.T) {
	ctx := context.Background()
	opts := func(side aggregator.Side) Options {
		return Options{Self: side, SessionID: 4, Owner: side == aggregator.Device, MaxTokens: 30, Sampling: sampling.Params{Temperature: 1, Seed: 5}}
	}
	local := func(side aggregator.Side, passages []decoder.Passage, concat bool) []engine.Token {
		sum, err := Local(ctx, opts(side), newDecoder(t, side, false), Input{Query: query, Passages: passages, Context: concat}, nil)
		require.NoError(t, err)
		return sum.Tokens
	}
	devAlone, cloudAlone := local(aggregator.Device, devicePassages, false), local(aggregator.Cloud, cloudPassages, false)
	require.NotEqual(t, devAlone, cloudAlone, "the two corpora lead to different answers")

	t.Run("cloud only", func(t *testing.T) {
		var emitted []engine.Token
		sum := runModes(t, func(c Conn) (Summary, error) {
			return ReceiveSolo(ctx, opts(aggregator.Device), c, func(_ int, tok engine.Token) (bool, error) {
				emitted = append(emitted, tok)
				return false, nil
			})
		}, func(c Conn) error {
			return ServeSolo(ctx, opts(aggregator.Cloud), newDecoder(t, aggregator.Cloud, true), query, cloudPassages, c)
		})
		assert.Equal(t, cloudAlone, sum.Tokens)
		assert.Equal(t, cloudAlone, emitted)
	})

	t.Run("context", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			ps, _, err := FetchPassages(ctx, NewInbox(ctx, c))
			if err != nil {
				return Summary{}, err
			}
			assert.Equal(t, cloudPassages, ps)
			all := append(append([]decoder.Passage(nil), devicePassages...), ps...)
			return Local(ctx, opts(aggregator.Device), newDecoder(t, aggregator.Device, true), Input{Query: query, Passages: all, Context: true}, nil)
		}, func(c Conn) error {
			return ServePassages(ctx, opts(aggregator.Cloud), newDecoder(t, aggregator.Cloud, false), cloudPassages, c)
		})
		all := append(append([]decoder.Passage(nil), devicePassages...), cloudPassages...)
		assert.Equal(t, local(aggregator.Device, all, true), sum.Tokens)
	})

	t.Run("kv", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			imported, n, err := FetchKV(ctx, NewInbox(ctx, c), copier.Vocab)
			if err != nil {
				return Summary{}, err
			}
			assert.Positive(t, n)
			require.Len(t, imported, len(cloudPassages))
			return Local(ctx, opts(aggregator.Device), newDecoder(t, aggregator.Device, true), Input{Query: query, Passages: devicePassages, Imported: imported}, nil)
		}, func(c Conn) error {
			return ServeKV(ctx, opts(aggregator.Cloud), newDecoder(t, aggregator.Cloud, false), query, cloudPassages, c)
		})
		// The device decodes the cloud's sequences as if it had prefilled
		// them itself.
		all := append(append([]decoder.Passage(nil), devicePassages...), cloudPassages...)
		assert.Equal(t, local(aggregator.Device, all, false), sum.Tokens)
	})

	t.Run("sequence-wise", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			return SequenceWise(ctx, opts(aggregator.Device), newDecoder(t, aggregator.Device, true), query, devicePassages, c, nil)
		}, func(c Conn) error {
			return ServeSequenceWise(ctx, opts(aggregator.Cloud), newDecoder(t, aggregator.Cloud, true), query, cloudPassages, c)
		})
		// The answer is one of the two candidates, the one the mixture
		// prefers: score both by hand.
		var want []engine.Token
		best := math.Inf(-1)
		for _, cand := range [][]engine.Token{devAlone, cloudAlone} {
			ll := mixtureLogLikelihood(t, cand)
			if ll > best {
				best, want = ll, cand
			}
		}
		assert.Equal(t, want, sum.Tokens)
		assert.Equal(t, uint64(1), sum.Aggregated[0]+sum.Aggregated[1])
	})
}

// mixtureLogLikelihood scores toks (the end token after them when they
// end before the limit) under the η-mixture of the two sides, decoding
// step by step.
func mixtureLogLikelihood(t *testing.T, toks []engine.Token) float64 {
	ctx := context.Background()
	dd, dc := newDecoder(t, aggregator.Device, false), newDecoder(t, aggregator.Cloud, false)
	require.NoError(t, dd.Begin(ctx, query, devicePassages, nil))
	require.NoError(t, dc.Begin(ctx, query, cloudPassages, nil))
	etaD, etaC := aggregator.Weights(dd.HTilde(), dc.HTilde())
	seq := append([]engine.Token(nil), toks...)
	if len(seq) < 30 {
		seq = append(seq, fake.TokEOS)
	}
	var ll float64
	for _, tok := range seq {
		pd, err := dd.Next(ctx)
		require.NoError(t, err)
		pc, err := dc.Next(ctx)
		require.NoError(t, err)
		ll += math.Log(etaD*float64(pd[tok]) + etaC*float64(pc[tok]))
		dd.Push(tok)
		dc.Push(tok)
	}
	return ll
}

// failing breaks a side's sending once broken: it closes the stream (the
// cloud process died), or swallows what is sent (a partition).
type failing struct {
	*PipeEnd
	mu        sync.Mutex
	broken    bool
	partition bool
}

func (f *failing) Send(m *dragonv1.PeerMessage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.broken:
		return f.PipeEnd.Send(m)
	case f.partition:
		return nil
	}
	return io.ErrClosedPipe
}

// breakNow fails the link from now on.
func (f *failing) breakNow() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken = true
	if !f.partition {
		f.PipeEnd.Close()
	}
}

// runCloudFailing runs a device session with fallback against a cloud
// session, calls breakLink at the device's eighth token, and returns the
// device's summary, the step it fell back at and why.
func runCloudFailing(t *testing.T, devConn, cloudConn Conn, stall time.Duration, breakLink func()) (Summary, int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		opts := Options{Self: aggregator.Cloud, SessionID: 1, MaxTokens: 40, PingEvery: 5 * time.Millisecond}
		_, _ = Run(ctx, opts, newDecoder(t, aggregator.Cloud, false), query, cloudPassages, cloudConn, nil)
	}()
	fellBackAt := -1
	var why error
	opts := Options{Self: aggregator.Device, SessionID: 1, Owner: true, MaxTokens: 40, PingEvery: 5 * time.Millisecond,
		Fallback: true, StallTimeout: stall, OnFallback: func(step int, err error) { fellBackAt, why = step, err }}
	dev, err := Run(ctx, opts, newDecoder(t, aggregator.Device, true), query, devicePassages, devConn, func(step int, _ engine.Token) (bool, error) {
		if step == 7 {
			breakLink()
		}
		return false, nil
	})
	require.NoError(t, err)
	if c, ok := devConn.(interface{ Close() }); ok {
		c.Close() // the cloud's receive ends
	}
	cancel()
	wg.Wait()
	return dev, fellBackAt, why
}

// TestDeviceFinishesAloneWhenTheCloudFails: the cloud dies or goes silent
// after 8 tokens; the device keeps the tokens already decided and
// finishes the answer alone, saying so.
func TestDeviceFinishesAloneWhenTheCloudFails(t *testing.T) {
	full, _ := runPair(t, pairConfig{maxTokens: 40})
	require.Len(t, full.Tokens, 40, "the fake answers at length")
	for _, partition := range []bool{false, true} {
		a, b := Pipe()
		cloudConn := &failing{PipeEnd: b, partition: partition}
		dev, fellBackAt, _ := runCloudFailing(t, a, cloudConn, 200*time.Millisecond, cloudConn.breakNow)
		assert.True(t, dev.Fallback, "partition %v", partition)
		assert.Equal(t, dev.FallbackAt, fellBackAt)
		require.GreaterOrEqual(t, dev.FallbackAt, 8, "the tokens decided together")
		require.Less(t, dev.FallbackAt, 40)
		assert.Equal(t, full.Tokens[:dev.FallbackAt], dev.Tokens[:dev.FallbackAt], "the decided tokens are kept")
		assert.Len(t, dev.Tokens, 40, "the answer is finished")
		assert.Equal(t, FinishMaxTokens, dev.Finish)
	}
}

// endingConn is the device's end of a stream the cloud ends with a status
// at some step: sends answer io.EOF at once, as gRPC's do, and the status
// reaches the receive side a little later.
type endingConn struct {
	*PipeEnd
	peer  *PipeEnd
	ended atomic.Bool
}

func (c *endingConn) Send(m *dragonv1.PeerMessage) error {
	if c.ended.Load() {
		return io.EOF
	}
	return c.PipeEnd.Send(m)
}

func (c *endingConn) Recv() (*dragonv1.PeerMessage, error) {
	m, err := c.PipeEnd.Recv()
	if err != nil && c.ended.Load() {
		time.Sleep(50 * time.Millisecond) // the send's io.EOF comes first
		return nil, status.Error(codes.Unavailable, "cloud: retrieval failed")
	}
	return m, err
}

func (c *endingConn) end() {
	c.ended.Store(true)
	c.peer.Close()
}

// TestFallbackSaysWhyTheCloudEndedTheStream: when a send learns first that
// the cloud ended the stream, the device still reports the cloud's status,
// not the send's bare io.EOF.
func TestFallbackSaysWhyTheCloudEndedTheStream(t *testing.T) {
	a, b := Pipe()
	devConn := &endingConn{PipeEnd: a, peer: b}
	dev, _, why := runCloudFailing(t, devConn, b, 10*time.Second, devConn.end)
	assert.True(t, dev.Fallback)
	require.Error(t, why)
	assert.Equal(t, codes.Unavailable, status.Code(why), "the fallback reason: %v", why)
	assert.Contains(t, why.Error(), "retrieval failed")
}

// slowConn is the device's end of a stream whose next receive, once
// armed, waits first: a link that stalls once.
type slowConn struct {
	*PipeEnd
	wait  time.Duration
	armed atomic.Bool
}

func (c *slowConn) Recv() (*dragonv1.PeerMessage, error) {
	if c.armed.CompareAndSwap(true, false) {
		select {
		case <-time.After(c.wait):
		case <-c.done: // closed while it waited
		}
	}
	return c.PipeEnd.Recv()
}

// TestStallsSurvivedAreCounted: a wait for the next step longer than half
// the stall timeout that still ends in one is counted, and the answer goes
// on with the cloud; a shorter one is not counted, and a longer one is a
// fallback, not a stall survived.
func TestStallsSurvivedAreCounted(t *testing.T) {
	const stall = time.Second
	for _, c := range []struct {
		name     string
		wait     time.Duration
		survived uint64
		fallback bool
	}{
		{"no stall", 0, 0, false},
		{"a stall under half the timeout", stall / 5, 0, false},
		{"a stall over half of it", stall * 7 / 10, 1, false},
		{"a stall over all of it", stall * 3 / 2, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := Pipe()
			devConn := &slowConn{PipeEnd: a, wait: c.wait}
			dev, _, _ := runCloudFailing(t, devConn, b, stall, func() { devConn.armed.Store(c.wait > 0) })
			assert.Equal(t, c.fallback, dev.Fallback)
			assert.Equal(t, c.survived, dev.StallsSurvived)
		})
	}
}

// TestDraftingDepthCoversTheRoundTrip: a speculative side may draft one
// round trip's worth of tokens beyond its lookahead, and 4 lookaheads
// before the first round trip is measured; token-wise (lookahead 1) stays
// at one, and without a decoding estimate the lookahead holds.
func TestDraftingDepthCoversTheRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name       string
		lookahead  int
		rttMS      float64
		perTokenMS float64
		want       int
	}{
		{"no round trip measured yet", 32, 0, 8, 4 * 32},
		{"no decoding estimate", 32, 600, 0, 32},
		{"300 ms one way, 8 ms tokens", 32, 600, 8, 32 + 75},
		{"a part token rounds up", 32, 100, 30, 32 + 4},
		{"token-wise", 1, 600, 8, 1},
		{"token-wise before the first round trip", 1, 0, 8, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &run{opts: Options{Lookahead: c.lookahead}}
			r.rttMicros.Store(int64(c.rttMS * 1000))
			assert.Equal(t, c.want, r.depth(c.perTokenMS))
		})
	}
}

// TestHedgedAnswersAreTokenWiseOnes: with hedged drafts (every blind draft
// of the side that does not aggregate hedges its runner-up while a slot is
// free) greedy and sampled answers are the token-wise ones, over a link of
// 0 and 15 ms one way with jitter, with and without local speculation,
// the device or the cloud aggregating or the aggregator moving; and
// rejections do land on hedges.
func TestHedgedAnswersAreTokenWiseOnes(t *testing.T) {
	jitter := func(mean time.Duration) func() time.Duration {
		r := rand.New(rand.NewPCG(5, 9))
		var mu sync.Mutex // both directions draw from r
		return func() time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return mean + time.Duration(r.NormFloat64()*float64(mean)/5)
		}
	}
	var hits uint64
	for _, sp := range []sampling.Params{{}, {Temperature: 0.9, Seed: 77}} {
		tw, _ := runPair(t, pairConfig{sync: TokenWise, sampling: sp, maxTokens: 80})
		for _, c := range []pairConfig{
			{first: aggregator.Device, strategy: aggregator.StaticDevice},
			{first: aggregator.Device, strategy: aggregator.StaticDevice, spec: true, latency: jitter(15 * time.Millisecond)},
			{first: aggregator.Cloud, strategy: aggregator.StaticCloud, latency: jitter(15 * time.Millisecond)},
			{switchEvery: 5, spec: true, latency: jitter(15 * time.Millisecond)},
		} {
			c.sampling, c.hedges, c.hedgeDepth, c.hedgeBelow = sp, 3, 64, 1
			c.maxTokens = 80                   // rejections enough for some to land on hedges
			c.cloudCall = 2 * time.Millisecond // the cloud lags, so it drafts blind
			name := fmt.Sprintf("temperature %v, first %v, switch every %d, spec %v, latency %v", sp.Temperature, c.first, c.switchEvery, c.spec, c.latency != nil)
			dev, cld := runPair(t, c)
			assert.Equal(t, tw.Tokens, dev.Tokens, name)
			assert.Equal(t, dev.Tokens, cld.Tokens, name)
			for i := range aggregator.Sides {
				assert.Equal(t, dev.HedgeHits[i], cld.HedgeHits[i], "%s: both sides adopted the same branches", name)
			}
			hits += dev.HedgeHits[0] + dev.HedgeHits[1]
			t.Logf("%s: hedges %v, adopted %v, rejected %v", name, cld.Hedges, cld.HedgeHits, cld.Rejected)
		}
	}
	assert.Positive(t, hits, "rejections landed on hedges")
}

// TestAwaitReceiveErrorKeepsThePeersReason: after a send answered EOF,
// the reason the peer sent before ending the stream wins over the bare
// EOF the receiver reports after it (a cloud's session timeout had reached
// the device as "receive: EOF").
func TestAwaitReceiveErrorKeepsThePeersReason(t *testing.T) {
	for name, c := range map[string]struct {
		inbox []inbound
		code  codes.Code
		want  string
	}{
		"the peer's error, then EOF": {
			inbox: []inbound{
				{msg: &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Pong{Pong: &dragonv1.Pong{}}}},
				{msg: &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Error{Error: &dragonv1.Error{
					Code: uint32(codes.DeadlineExceeded), Message: "cloud: the answer outlasted the session timeout (1s)"}}}},
				{err: io.EOF},
			},
			code: codes.DeadlineExceeded, want: "peer: cloud: the answer outlasted the session timeout (1s)",
		},
		"EOF alone": {inbox: []inbound{{err: io.EOF}}, code: codes.Unknown, want: "EOF"},
	} {
		t.Run(name, func(t *testing.T) {
			in := make(chan inbound, len(c.inbox))
			for _, m := range c.inbox {
				in <- m
			}
			err := awaitReceiveError(context.Background(), in)
			require.Error(t, err)
			assert.Equal(t, c.code, status.Code(err))
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
