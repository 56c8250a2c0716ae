package session

import (
	"bytes"
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/sampling"
)

// handLogLik is each passage's log-likelihood of answer on side's model,
// from the fake model's own distributions after each passage's prompt.
func handLogLik(t *testing.T, side aggregator.Side, passages []decoder.Passage, answer []engine.Token) []float64 {
	t.Helper()
	d := newDecoder(t, side, false)
	require.NoError(t, d.Begin(context.Background(), query, passages, nil))
	m := d.Model().(*fake.Model)
	out := make([]float64, d.Seqs())
	for s := range out {
		hist := append([]engine.Token(nil), d.Prompt(s)...)
		for _, tok := range answer {
			logits := m.Distribution(hist)
			lse := math.Inf(-1)
			for _, l := range logits {
				lse = logAdd(lse, float64(l))
			}
			out[s] += float64(logits[tok]) - lse
			hist = append(hist, tok)
		}
	}
	return out
}

func logAdd(a, b float64) float64 {
	if a < b {
		a, b = b, a
	}
	if math.IsInf(a, -1) {
		return a
	}
	return a + math.Log1p(math.Exp(b-a))
}

// decided is the answer's decided tokens as the evidence covers them: the
// end token after them when the answer ended with it.
func decided(sum Summary) []engine.Token {
	toks := append([]engine.Token(nil), sum.Tokens...)
	if sum.Finish == FinishEOG {
		toks = append(toks, fake.TokEOS)
	}
	return toks
}

// TestSourcesOfADragonAnswer: with sources asked for, the device ends with
// its passages' evidence and the cloud's entries, each the log-likelihood
// of the decided answer under the passage, whichever way the tokens were
// decided (local speculation, handovers, rejections over a jittery link),
// and the answer is the one decoded without sources.
func TestSourcesOfADragonAnswer(t *testing.T) {
	jitter := uniformDelay(3, 3*time.Millisecond)
	for name, c := range map[string]pairConfig{
		"token-wise":                      {sync: TokenWise},
		"greedy, speculation, handovers":  {spec: true, switchEvery: 3, latency: jitter},
		"sampled, the cloud aggregating":  {sampling: sampling.Params{Temperature: 0.9, Seed: 11}, first: aggregator.Cloud, latency: jitter},
		"sampled, speculation, handovers": {sampling: sampling.Params{Temperature: 0.9, Seed: 12}, spec: true, switchEvery: 4, latency: jitter},
	} {
		plain, _ := runPair(t, c)
		c.sources = true
		dev, cld := runPair(t, c)
		assert.Equal(t, plain.Tokens, dev.Tokens, "%s: sources change no answer", name)
		answer := decided(dev)
		require.NotEmpty(t, answer, name)

		assert.InDeltaSlice(t, handLogLik(t, aggregator.Device, devicePassages, answer), dev.Evidence, 1e-3, name)
		require.Len(t, dev.PeerSources, len(cloudPassages), name)
		assert.False(t, dev.PeerSourcesMissing, name)
		wantCloud := handLogLik(t, aggregator.Cloud, cloudPassages, answer)
		for i, e := range dev.PeerSources {
			assert.Equal(t, dragonv1.Side_SIDE_CLOUD, e.GetSide(), name)
			assert.True(t, e.GetHasEvidence(), name)
			assert.InDelta(t, wantCloud[i], e.GetLogLikelihood(), 1e-3, "%s: cloud passage %d", name, i)
			assert.Equal(t, cloudPassages[i].Score, e.GetScore(), name)
			assert.Equal(t, cloudPassages[i].Text, e.GetExcerpt(), name)
		}
		assert.Empty(t, cld.PeerSources, "%s: the cloud gets nothing of the device's", name)
		assert.Nil(t, cld.Evidence, name)

		all := append(Sources(aggregator.Device, devicePassages, dev.Evidence), dev.PeerSources...)
		require.False(t, CombineSources(all), name)
		var sum float64
		for i, e := range all {
			sum += e.GetShare()
			if i > 0 {
				assert.GreaterOrEqual(t, all[i-1].GetShare(), e.GetShare(), "%s: largest share first", name)
			}
		}
		assert.InDelta(t, 1, sum, 1e-9, name)
	}
}

// TestSourcesWithoutTheCloud: a cloud that fails mid-answer leaves the
// device with its own evidence and the cloud's sources marked missing.
func TestSourcesWithoutTheCloud(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := Pipe()
	dec := newDecoder(t, aggregator.Device, false)
	dec.SetEvidence(true)
	cloud := newDecoder(t, aggregator.Cloud, false)
	cloud.SetEvidence(true)
	opts := func(side aggregator.Side) Options {
		return Options{Self: side, SessionID: 3, Owner: side == aggregator.Device, MaxTokens: 30, PingEvery: 5 * time.Millisecond, Sources: true, Fallback: side == aggregator.Device}
	}
	cloudCtx, kill := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = Run(cloudCtx, opts(aggregator.Cloud), cloud, query, cloudPassages, b, func(step int, _ engine.Token) (bool, error) { return false, nil })
	}()
	sum, err := Run(ctx, opts(aggregator.Device), dec, query, devicePassages, a, func(step int, _ engine.Token) (bool, error) {
		if step == 4 {
			kill()
			b.Close()
		}
		return false, nil
	})
	require.NoError(t, err)
	<-done
	require.True(t, sum.Fallback)
	assert.True(t, sum.PeerSourcesMissing)
	assert.Empty(t, sum.PeerSources)
	assert.InDeltaSlice(t, handLogLik(t, aggregator.Device, devicePassages, decided(sum)), sum.Evidence, 1e-3)
}

// TestSourcesInBaselineModes: the cloud alone and sequence-wise
// aggregation give the cloud's evidence of the answer; the context
// baseline (one sequence over every passage) gives entries without it; the
// KV baseline's evidence of the cloud's passages is the device's own.
func TestSourcesInBaselineModes(t *testing.T) {
	ctx := context.Background()
	opts := func(side aggregator.Side) Options {
		return Options{Self: side, SessionID: 4, Owner: side == aggregator.Device, MaxTokens: 30, Sampling: sampling.Params{Temperature: 1, Seed: 5}, Sources: true}
	}
	dec := func(side aggregator.Side, spec bool) *decoder.Decoder {
		d := newDecoder(t, side, spec)
		d.SetEvidence(true)
		return d
	}
	checkCloud := func(t *testing.T, sum Summary, withEvidence bool) {
		t.Helper()
		require.Len(t, sum.PeerSources, len(cloudPassages))
		answer := decided(sum)
		want := handLogLik(t, aggregator.Cloud, cloudPassages, answer)
		for i, e := range sum.PeerSources {
			assert.Equal(t, withEvidence, e.GetHasEvidence())
			if withEvidence {
				assert.InDelta(t, want[i], e.GetLogLikelihood(), 1e-3, "cloud passage %d", i)
			}
		}
	}
	t.Run("cloud only", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			return ReceiveSolo(ctx, opts(aggregator.Device), c, nil)
		}, func(c Conn) error {
			return ServeSolo(ctx, opts(aggregator.Cloud), dec(aggregator.Cloud, true), query, cloudPassages, c)
		})
		checkCloud(t, sum, true)
	})
	t.Run("sequence-wise", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			return SequenceWise(ctx, opts(aggregator.Device), dec(aggregator.Device, true), query, devicePassages, c, nil)
		}, func(c Conn) error {
			return ServeSequenceWise(ctx, opts(aggregator.Cloud), dec(aggregator.Cloud, true), query, cloudPassages, c)
		})
		checkCloud(t, sum, true)
		assert.InDeltaSlice(t, handLogLik(t, aggregator.Device, devicePassages, decided(sum)), sum.Evidence, 1e-3)
	})
	t.Run("context", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			inbox := NewInbox(ctx, c)
			ps, _, err := FetchPassages(ctx, inbox)
			if err != nil {
				return Summary{}, err
			}
			all := append(append([]decoder.Passage(nil), devicePassages...), ps...)
			sum, err := Local(ctx, opts(aggregator.Device), dec(aggregator.Device, true), Input{Query: query, Passages: all, Context: true}, nil)
			FinishFetched(ctx, opts(aggregator.Device), c, inbox, &sum)
			return sum, err
		}, func(c Conn) error {
			return ServePassages(ctx, opts(aggregator.Cloud), dec(aggregator.Cloud, false), cloudPassages, c)
		})
		checkCloud(t, sum, false)
		assert.Nil(t, sum.Evidence, "one sequence over every passage: no passage's own evidence")
	})
	t.Run("kv", func(t *testing.T) {
		sum := runModes(t, func(c Conn) (Summary, error) {
			inbox := NewInbox(ctx, c)
			imported, _, err := FetchKV(ctx, inbox, copier.Vocab)
			if err != nil {
				return Summary{}, err
			}
			sum, err := Local(ctx, opts(aggregator.Device), dec(aggregator.Device, true), Input{Query: query, Passages: devicePassages, Imported: imported}, nil)
			FinishFetched(ctx, opts(aggregator.Device), c, inbox, &sum)
			return sum, err
		}, func(c Conn) error {
			return ServeKV(ctx, opts(aggregator.Cloud), dec(aggregator.Cloud, false), query, cloudPassages, c)
		})
		checkCloud(t, sum, false)
		// The device decoded the cloud's sequences: its evidence covers
		// them, after its own, on the device's model.
		all := append(append([]decoder.Passage(nil), devicePassages...), cloudPassages...)
		assert.InDeltaSlice(t, handLogLik(t, aggregator.Device, all, decided(sum)), sum.Evidence, 1e-3)
	})
}

// TestPeerSourcesAreChecked: entries a peer made up are refused.
func TestPeerSourcesAreChecked(t *testing.T) {
	good := func() *dragonv1.Source {
		return &dragonv1.Source{Side: dragonv1.Side_SIDE_CLOUD, Score: 1, HasEvidence: true, LogLikelihood: -3, Excerpt: "text"}
	}
	require.NoError(t, checkPeerSources([]*dragonv1.Source{good()}))
	for name, f := range map[string]func(*dragonv1.Source){
		"the device's side":        func(e *dragonv1.Source) { e.Side = dragonv1.Side_SIDE_DEVICE },
		"a NaN relevance":          func(e *dragonv1.Source) { e.Score = math.NaN() },
		"a positive likelihood":    func(e *dragonv1.Source) { e.LogLikelihood = 2 },
		"a NaN likelihood":         func(e *dragonv1.Source) { e.LogLikelihood = math.NaN() },
		"a long excerpt":           func(e *dragonv1.Source) { e.Excerpt = string(make([]rune, 301)) },
		"too much metadata":        func(e *dragonv1.Source) { e.Metadata = bigMeta(17) },
		"a name of many kilobytes": func(e *dragonv1.Source) { e.Source = string(make([]byte, 5000)) },
	} {
		e := good()
		f(e)
		assert.ErrorIs(t, checkPeerSources([]*dragonv1.Source{e}), aggregator.ErrProtocol, name)
	}
	many := make([]*dragonv1.Source, maxPeerSources+1)
	for i := range many {
		many[i] = good()
	}
	assert.ErrorIs(t, checkPeerSources(many), aggregator.ErrProtocol, "too many")
}

func bigMeta(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[string(rune('a'+i))] = "v"
	}
	return m
}

// tapped is a Conn that keeps every message sent through it, marshalled.
type tapped struct {
	Conn
	mu   sync.Mutex
	sent [][]byte
}

func (t *tapped) Send(m *dragonv1.PeerMessage) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.sent = append(t.sent, b)
	t.mu.Unlock()
	return t.Conn.Send(m)
}

// crossed are the strings of secret found in what the tap saw sent.
func (t *tapped) crossed(secret []string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var found []string
	for _, s := range secret {
		for _, b := range t.sent {
			if bytes.Contains(b, []byte(s)) {
				found = append(found, s)
				break
			}
		}
	}
	return found
}

// cancelAnswer is the answer the tapped Cancel carried.
func (t *tapped) cancelAnswer(tb testing.TB) []engine.Token {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range t.sent {
		var m dragonv1.PeerMessage
		require.NoError(tb, proto.Unmarshal(b, &m))
		if c := m.GetCancel(); c != nil {
			return c.GetAnswer()
		}
	}
	return nil
}

// TestNoDeviceSourceCrosses: with sources on, nothing the device sends
// holds its passages' text, names, titles or metadata, though the device
// ends with all of them; the control, a device that sends its sources on
// purpose, is caught by the same tap.
func TestNoDeviceSourceCrosses(t *testing.T) {
	private := []decoder.Passage{
		{Text: "From: Ann. The lamp at the harbour office is broken; call Bob at 555-0100.", Score: 2, Source: "/home/me/mail/inbox.mbox#12",
			Meta: map[string]string{"subject": "Broken lamp at the office", "from": "Ann Example <ann@example.org>", "date": "Mon, 2 Sep 2002 10:00:00 +0100"}},
		{Text: "From: Bob. Meeting moved to Friday at the lighthouse, bring the lamp.", Score: 1, Source: "/home/me/notes/meeting-friday.md",
			Meta: map[string]string{"title": "Meeting notes, Friday"}},
	}
	var secret []string
	for _, e := range Sources(aggregator.Device, private, nil) {
		secret = append(secret, e.GetSource(), e.GetTitle(), e.GetExcerpt(), e.GetDocumentId())
		for _, v := range e.GetMetadata() {
			secret = append(secret, v)
		}
	}
	for _, leak := range []bool{false, true} {
		leakSources = leak
		a, b := Pipe()
		tap := &tapped{Conn: a}
		opts := func(side aggregator.Side) Options {
			return Options{Self: side, SessionID: 5, Owner: side == aggregator.Device, MaxTokens: 24, PingEvery: 5 * time.Millisecond, Sources: true}
		}
		dev, cld := newDecoder(t, aggregator.Device, true), newDecoder(t, aggregator.Cloud, true)
		dev.SetEvidence(true)
		cld.SetEvidence(true)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		done := make(chan error, 1)
		go func() {
			_, err := Run(ctx, opts(aggregator.Cloud), cld, query, cloudPassages, b, nil)
			done <- err
		}()
		sum, err := Run(ctx, opts(aggregator.Device), dev, query, private, tap, nil)
		require.NoError(t, err)
		a.Close()
		require.NoError(t, <-done)
		cancel()
		leakSources = false
		require.Len(t, sum.Evidence, len(private), "the device knows its own sources")
		require.Len(t, sum.PeerSources, len(cloudPassages))
		require.Equal(t, decided(sum), tap.cancelAnswer(t), "the tap sees what the device sends: its Cancel with the answer")
		if leak {
			assert.NotEmpty(t, tap.crossed(secret), "the control: a device that sends its sources is caught")
		} else {
			assert.Empty(t, tap.crossed(secret), "nothing of the device's sources crosses")
		}
	}
}
