// Package session is one side of a two-sided generation, the same code on
// the device and in the cloud: it runs the side's decoder (with its local
// speculative decoding) as a producer of drafts, streams them to the peer,
// hosts the aggregator while it is on this side, applies verdicts (rolling
// the decoder back and aborting a forward pass whose drafts a rejection
// made stale), hands the aggregator over when the scheduler says so, and
// emits the target tokens. The decisions are aggregator.Node's; this
// package is the concurrency around it: one goroutine owns the Node and
// reacts to events, one decodes, one sends and one receives.
package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/codec"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/sampling"
)

// Sync is how often the two sides synchronise.
type Sync uint8

const (
	// Speculative: both sides draft ahead; the aggregator verifies pairs of
	// drafts (DRAGON).
	Speculative Sync = iota
	// TokenWise: each side drafts one token and waits for its verdict, the
	// device aggregating (DRDG/TW). Same targets as Speculative for a seed.
	TokenWise
)

// Options configure one side of a generation.
type Options struct {
	Self      aggregator.Side
	SessionID uint64
	Sync      Sync
	// Owner is the side that serves the request (the device): it ends the
	// generation and tells the peer with a Cancel.
	Owner     bool
	Sampling  sampling.Params
	MaxTokens int
	// CodecTopP is the mass the distribution codec keeps (0: 0.8).
	CodecTopP float64
	// Aggregator aggregates first (TokenWise: always the device).
	Aggregator aggregator.Side
	Strategy   aggregator.Strategy
	// SwitchEvery > 0 moves the aggregator every that many steps instead
	// of asking the scheduler.
	SwitchEvery int
	// Lookahead is how many undecided drafts this side may have beyond
	// those it drafts in one round trip (0: 32; see run.depth).
	Lookahead int
	// PingEvery is the RTT probe period (0: 200 ms).
	PingEvery time.Duration
	// Fits are the sides' decoding-latency fits, by side (device, cloud).
	Fits [2]profiler.DecodeFit
	// Prefilled says the caller has already started dec on this query and
	// these passages (decoder.Start), overlapping the handshake with the
	// prefill; Run then drafts from there.
	Prefilled bool
	// Record keeps a trace of decoding times and acceptance.
	Record bool
	// Blind keeps the aggregating side's drafts to itself, as DRAGON does:
	// no greedy draft is made beside the peer's, and the side that does not
	// aggregate waits for the verdicts (what sharing is worth is measured
	// against it).
	Blind bool
	// Confidence weighs each step by the sides' confidence too
	// (aggregator.Config.Confidence; 0: off).
	Confidence float64
	// Hedges and HedgeDepth bound both sides' hedged drafts
	// (aggregator.Config.Hedges, HedgeDepth); they need shared drafts. This
	// side hedges within them only when its decoder has hedge slots
	// (decoder.Options.Hedges), as the measured rule says (hedger).
	Hedges, HedgeDepth int
	// HedgeBelow, when > 0, hedges every draft of probability under it
	// instead (experiments: what hedging costs where the rule says no).
	HedgeBelow float64
	// Fallback (owner only): when the peer fails (the stream breaks, the
	// peer errs or sends garbage, or no step is decided for StallTimeout),
	// finish the answer alone from the tokens already decided.
	Fallback bool
	// StallTimeout is how long the owner waits for the next decided step
	// before it gives up on the peer (0: 10 s).
	StallTimeout time.Duration
	// OnFallback, when set, learns that the answer goes on alone after
	// step tokens, and why.
	OnFallback func(step int, cause error)
	// Sources: the answer's sources are wanted. Each side keeps its
	// passages' evidence (the caller turns the decoder's on before it
	// starts: decoder.SetEvidence); the owner ends with its own evidence
	// and the peer's entries in the Summary, the peer sends its entries
	// after the owner's Cancel.
	Sources bool
	// Metrics, when set, get the codec's compression and the link's
	// estimates live (the caller records the rest with Metrics.Observe).
	Metrics *Metrics
	Log     *slog.Logger
}

func (o *Options) defaults() error {
	if !o.Self.Valid() {
		return fmt.Errorf("session: unknown side %v", o.Self)
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = 128
	}
	if o.CodecTopP == 0 {
		o.CodecTopP = codec.DefaultTopP
	}
	if !o.Aggregator.Valid() || o.Sync == TokenWise {
		o.Aggregator = aggregator.Device
	}
	if o.Strategy == 0 {
		o.Strategy = aggregator.Greedy
	}
	if o.Sync == TokenWise {
		o.Strategy, o.SwitchEvery, o.Lookahead = aggregator.StaticDevice, 0, 1
	}
	if o.Lookahead <= 0 {
		o.Lookahead = 32
	}
	if o.PingEvery <= 0 {
		o.PingEvery = 200 * time.Millisecond
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = defaultStallTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o.Sampling.Validate()
}

// defaultStallTimeout is Options.StallTimeout's default.
const defaultStallTimeout = 10 * time.Second

// Emit receives each target token as it is decided, in order (not the end
// token), with its step. Returning stop ends the generation (a stop string
// matched, enough tokens).
type Emit func(step int, tok engine.Token) (stop bool, err error)

// Finish says why a generation ended.
type Finish string

// Reasons a generation ends.
const (
	FinishEOG       Finish = "eog"
	FinishStop      Finish = "stop"
	FinishMaxTokens Finish = "max_tokens"
	FinishContext   Finish = "context"
	FinishCancelled Finish = "cancelled"
)

// Summary is what one side saw of a generation.
type Summary struct {
	Tokens []engine.Token
	Finish Finish
	// TokenTimes are when each target token was decided here.
	TokenTimes []time.Time
	// FirstLocal is when this side's decoder produced its first token, for
	// modes whose answer arrives all at once (sequence-wise).
	FirstLocal time.Time
	// By side (device, cloud): drafts accepted and rejected, stale drafts
	// dropped here, steps decided on that side, and rejections decided here
	// whose target was the side's second choice.
	Accepted, Rejected, Stale, Aggregated, SecondChoice [2]uint64
	// By side, as aggregator.Stats counts them: decided drafts below each
	// of aggregator.HedgeThresholds, and their second-choice rejections.
	LowProb, LowProbCaught [2][len(aggregator.HedgeThresholds)]uint64
	// By side: hedges the side declared, as far as this side saw them, and
	// rejections that adopted a hedge's branch instead of a round trip.
	Hedges, HedgeHits [2]uint64
	Switches          uint64
	// Early counts the steps this side decided itself while the peer
	// aggregated, before the verdicts came (aggregator.Node.Early).
	Early                    uint64
	BytesSent, BytesReceived uint64
	// This side's forward passes, local draft tokens accepted, and passes
	// aborted because a rejection made their drafts stale.
	ForwardPasses int
	LocalAccepted uint64
	AbortedPasses uint64
	// Beside counts this side's greedy drafts that took the mixture's
	// argmax from the peer's draft of the same step instead of its own
	// (Proposer.ProposeBeside).
	Beside uint64
	// RTT is the last round-trip estimate.
	RTT time.Duration
	// StallsSurvived counts, on the owner, waits for a decided step that
	// outlasted half the stall timeout and still ended in one: how close
	// the link came to a fallback without one.
	StallsSurvived uint64
	// Fallback: the peer failed after FallbackAt tokens and this side
	// finished the answer alone.
	Fallback   bool
	FallbackAt int
	// Trace, when Options.Record: decoding ms per token of each side (this
	// side's measured, the peer's as its drafts reported) and acceptance
	// flags per step.
	Trace *Trace
	// Restored is, by side (device, cloud), how many passages began from
	// that side's KV cache, as far as this side knows.
	Restored [2]int
	// With Options.Sources, on the owner: Evidence is each of this side's
	// sequences' log-likelihood of the answer (nil when not known), and
	// PeerSources the peer's entries as it sent them after the answer;
	// PeerSourcesMissing says they did not come though the peer's passages
	// had a part in the answer (it failed, or sent none in time).
	Evidence           []float64
	PeerSources        []*dragonv1.Source
	PeerSourcesMissing bool
}

// Trace records decoding times and acceptance, by side (device, cloud).
type Trace struct {
	DecodeMS [2][]float64
	Accept   [2][]bool
}

// burst is the drafts of one forward pass.
type burst struct {
	drafts []aggregator.Draft
}

type inbound struct {
	msg *dragonv1.PeerMessage
	err error
}

// run is one generation on this side.
type run struct {
	opts  Options
	dec   *decoder.Decoder
	model engine.Model
	conn  Conn
	emit  Emit
	log   *slog.Logger

	node   *aggregator.Node
	sched  *aggregator.Scheduler
	est    *profiler.Estimator
	decode *codec.Decoder

	out     chan *dragonv1.PeerMessage
	sent    atomic.Uint64
	aborted atomic.Uint64
	// rttMicros is the round-trip estimate, for the producer's drafting
	// depth (the estimator itself belongs to the core goroutine).
	rttMicros atomic.Int64
	received  uint64
	senderErr chan error

	sum      Summary
	over     bool // the generation is over for this side
	finish   Finish
	pingSeq  uint64
	plainRTT float64 // ms of the last unpadded ping
	// heldFrom is the step at which this side last took the aggregator.
	heldFrom uint64
	// peerRestored is what the peer's drafts say of its KV cache.
	peerRestored int
	// targets are the decided tokens, the end token included; progress is
	// when the last one was decided (or the generation began).
	targets  []engine.Token
	progress time.Time
	// cancel is the owner's Cancel, once it came (the peer's side).
	cancel *dragonv1.Cancel

	// Shared with the producer goroutine.
	mu      sync.Mutex
	wake    chan struct{}
	decided uint64
	// pending are the rollbacks the producer has yet to carry out, in
	// order: a branch adopted at one step may have a draft rejected at a
	// later one before the producer adopts it.
	pending []aggregator.Rollback
	stopped bool
	// stopProd cancels the producer's context: its prefill, its pass in
	// flight and any wait, including a burst the core no longer reads.
	stopProd   context.CancelFunc
	cancelPass context.CancelFunc
	// peer are the peer's undecided drafts as the Node holds them
	// (Node.PeerDrafts) and peerEpoch this side's epoch then; greedy drafts
	// on the same prefix are made beside them.
	peer      []aggregator.Draft
	peerEpoch uint32
	beside    atomic.Uint64
	// settled is NextStep after the last action list the core carried
	// out: a hedge of this side at an earlier step that is not pending
	// adoption died (its draft was decided).
	settled uint64
	// aggregating mirrors the Node's role for the producer, which hedges
	// only while the peer aggregates.
	aggregating atomic.Bool
	hedge       *hedger
}

// padEvery pings is one padded with padBytes, whose extra round-trip time
// measures the bandwidth.
const (
	padEvery = 8
	padBytes = 16 << 10
)

// Run is one side of a generation of the given query over this side's
// passages: it returns when the generation is over (the owner) or when the
// peer ends it. dec must not be used by anyone else meanwhile.
func Run(ctx context.Context, opts Options, dec *decoder.Decoder, query string, passages []decoder.Passage, conn Conn, emit Emit) (Summary, error) {
	if err := opts.defaults(); err != nil {
		return Summary{}, err
	}
	node, err := aggregator.New(aggregator.Config{
		Self: opts.Self, Aggregator: opts.Aggregator, Greedy: opts.Sampling.Greedy(), Seed: opts.Sampling.Seed,
		MaxSteps: uint64(opts.MaxTokens), IsEnd: func(t int32) bool { return dec.Model().IsEOG(t) },
		Share: opts.share(), Confidence: opts.Confidence, Hedges: opts.hedges(), HedgeDepth: opts.HedgeDepth,
	})
	if err != nil {
		return Summary{}, err
	}
	sched, err := aggregator.NewScheduler(aggregator.SchedulerConfig{Strategy: opts.Strategy, Seed: opts.Sampling.Seed})
	if err != nil {
		return Summary{}, err
	}
	cd, err := codec.NewDecoder(dec.Model().Info().VocabSize)
	if err != nil {
		return Summary{}, err
	}
	r := &run{
		opts: opts, dec: dec, model: dec.Model(), conn: conn, emit: emit,
		log:  opts.Log.With("session", opts.SessionID, "side", opts.Self.String()),
		node: node, sched: sched, decode: cd,
		est: profiler.NewEstimator(profiler.Config{}, opts.Fits[0], opts.Fits[1]),
		out: make(chan *dragonv1.PeerMessage, 256), senderErr: make(chan error, 1),
		wake: make(chan struct{}, 1), hedge: newHedger(opts.HedgeBelow),
	}
	r.aggregating.Store(node.Aggregating())
	if opts.Record {
		r.sum.Trace = &Trace{}
	}
	return r.run(ctx, query, passages)
}

func (r *run) run(ctx context.Context, query string, passages []decoder.Passage) (Summary, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inbox := messages(ctx, r.conn)
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		r.send()
	}()
	bursts := make(chan burst, 4)
	fail := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	pctx, stopProd := context.WithCancel(ctx)
	r.stopProd = stopProd
	go func() {
		defer wg.Done()
		if err := r.produce(pctx, query, passages, bursts); err != nil {
			fail <- err
		}
	}()
	ping := time.NewTicker(r.opts.PingEvery)
	defer ping.Stop()
	r.ping()

	r.progress = time.Now()
	err := r.loop(ctx, inbox, bursts, fail, ping.C)
	r.stopProducer()
	wg.Wait()
	var pf peerFailure
	if errors.As(err, &pf) && r.opts.Owner && r.opts.Fallback && ctx.Err() == nil {
		err = r.continueAlone(ctx, pf.err)
	}
	// The peer learns the answer's end first, so that it works out its
	// sources while this side works out its own.
	askPeer := r.opts.Owner && r.opts.Sources && err == nil && !r.sum.Fallback
	if r.opts.Owner {
		reason := string(r.finish)
		if err != nil {
			reason = err.Error()
		}
		c := &dragonv1.Cancel{SessionId: r.opts.SessionID, Reason: reason}
		if askPeer {
			c.Answer = r.targets
		}
		r.enqueue(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Cancel{Cancel: c}})
		if r.opts.Sources && err == nil {
			r.sum.Evidence = evidence(ctx, r.opts, r.dec, r.targets)
		}
		if leakSources {
			r.enqueue(sourcesMessage(r.opts.SessionID, Sources(r.opts.Self, passages, r.sum.Evidence)))
		}
	} else if err != nil && !errors.Is(err, io.EOF) {
		if ctx.Err() != nil {
			// Why the session's context ended (the cloud's session
			// timeout says so), rather than a bare "deadline exceeded".
			err = context.Cause(ctx)
		}
		r.enqueue(errorMessage(r.opts.SessionID, err))
	} else if r.opts.Sources && r.cancel != nil {
		answer, aerr := answerOf(r.cancel, r.decode.Vocab(), r.opts.MaxTokens)
		if aerr != nil {
			r.log.Warn("sources: the device's answer is not one", "err", aerr)
		}
		r.enqueue(sourcesMessage(r.opts.SessionID, peerSources(ctx, r.opts, r.dec, passages, answer, true)))
	}
	r.dec.Finish()
	close(r.out)
	select {
	case <-senderDone:
	case <-time.After(2 * time.Second): // a peer that stopped reading
	}
	if askPeer {
		var n uint64
		var ok bool
		r.sum.PeerSources, n, ok = awaitSources(ctx, inbox, r.opts.StallTimeout)
		r.received += n
		r.sum.PeerSourcesMissing = !ok
	}
	r.sum.PeerSourcesMissing = r.sum.PeerSourcesMissing || (r.opts.Sources && r.sum.Fallback)
	r.fillSummary()
	if err == nil && r.finish == "" {
		r.sum.Finish = FinishCancelled
	}
	return r.sum, err
}

// peerFailure is an error on the peer's side of the session: the stream
// broke, the peer reported an error or broke the protocol, or it stalled.
type peerFailure struct{ err error }

func (p peerFailure) Error() string { return p.err.Error() }
func (p peerFailure) Unwrap() error { return p.err }

// emitError is an error of this side's consumer (the app went away), not
// of the peer.
type emitError struct{ err error }

func (e emitError) Error() string { return e.err.Error() }
func (e emitError) Unwrap() error { return e.err }

// errStalled: no step was decided for Options.StallTimeout.
var errStalled = errors.New("session: the peer decided no step in time")

func (r *run) loop(ctx context.Context, inbox <-chan inbound, bursts <-chan burst, fail <-chan error, ping <-chan time.Time) error {
	for !r.over {
		select {
		case <-ctx.Done():
			r.finish = FinishCancelled
			return ctx.Err()
		case err := <-fail:
			if errors.Is(err, engine.ErrContextFull) {
				r.finish, r.over = FinishContext, r.opts.Owner
				if !r.over {
					continue
				}
				return nil
			}
			return err
		case err := <-r.senderErr:
			if errors.Is(err, io.EOF) {
				// gRPC tells why a stream ended on its receive side only:
				// a send answered io.EOF means the peer ended it, and the
				// receive that follows carries its status.
				if rerr := awaitReceiveError(ctx, inbox); rerr != nil {
					return peerFailure{fmt.Errorf("session: receive: %w", rerr)}
				}
			}
			return peerFailure{fmt.Errorf("session: send: %w", err)}
		case b := <-bursts:
			for i := range b.drafts {
				r.record(r.opts.Self, b.drafts[i])
				r.hedge.drafted(&b.drafts[i])
			}
			acts, err := r.node.Step(aggregator.LocalDrafts{Drafts: b.drafts})
			if err != nil {
				return err
			}
			if err := r.apply(acts); err != nil {
				return err
			}
		case in := <-inbox:
			if in.err != nil {
				if errors.Is(in.err, io.EOF) && !r.opts.Owner {
					r.finish = FinishCancelled
					return nil // the device closed the stream
				}
				return peerFailure{fmt.Errorf("session: receive: %w", in.err)}
			}
			if err := r.handle(in.msg); err != nil {
				if errors.As(err, new(emitError)) {
					return err
				}
				return peerFailure{err}
			}
		case <-ping:
			if r.opts.Owner && time.Since(r.progress) > r.opts.StallTimeout {
				return peerFailure{fmt.Errorf("%w: %v since the last", errStalled, r.opts.StallTimeout)}
			}
			r.ping()
		}
	}
	return nil
}

// continueAlone finishes the answer on this side alone after the peer
// failed: the decoder is rewound to the decided tokens and decodes on,
// drafting as it did, each draft now the answer's token.
func (r *run) continueAlone(ctx context.Context, cause error) error {
	r.sum.Fallback, r.sum.FallbackAt = true, len(r.sum.Tokens)
	r.log.Warn("the peer failed: finishing the answer alone", "tokens", len(r.sum.Tokens), "err", cause)
	if r.opts.OnFallback != nil {
		r.opts.OnFallback(len(r.sum.Tokens), cause)
	}
	if _, err := r.node.Step(aggregator.Finish{}); err != nil {
		return err
	}
	gen := r.dec.Generated()
	k := 0
	for k < len(gen) && k < len(r.targets) && gen[k] == r.targets[k] {
		k++
	}
	if err := r.dec.Rewind(k, r.targets[k:]...); err != nil {
		return err
	}
	prop, err := aggregator.NewProposer(r.opts.Self, r.opts.Sampling.Seed, r.opts.Sampling.Greedy(), r.opts.CodecTopP)
	if err != nil {
		return err
	}
	choose := r.chooser(prop, func() uint32 { return 0 }, nil, false)
	for !r.over {
		limit := r.opts.MaxTokens - len(r.targets)
		switch {
		case limit <= 0:
			r.finish, r.over = FinishMaxTokens, true
			continue
		case r.dec.Room() <= 0:
			r.finish, r.over = FinishContext, true
			continue
		}
		toks, err := r.dec.Step(ctx, choose, limit)
		if err != nil {
			if ctx.Err() != nil {
				r.finish = FinishCancelled
				return ctx.Err()
			}
			return err
		}
		for _, t := range toks {
			if err := r.target(t); err != nil || r.over {
				return err
			}
		}
	}
	return nil
}

// endedStatusWait bounds the wait for the receive error that says why the
// peer ended a stream.
const endedStatusWait = 2 * time.Second

// awaitReceiveError drops messages until the peer's Error message or the
// receiver's error, which it returns (nil if neither comes within
// endedStatusWait).
func awaitReceiveError(ctx context.Context, inbox <-chan inbound) error {
	timeout := time.NewTimer(endedStatusWait)
	defer timeout.Stop()
	for {
		select {
		case in := <-inbox:
			if in.err != nil {
				return in.err
			}
			if e := in.msg.GetError(); e != nil {
				// The peer said why before it ended the stream: that,
				// not the bare EOF that follows, is the cause.
				return peerError(e)
			}
		case <-timeout.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// send is the only goroutine that calls conn.Send.
func (r *run) send() {
	failed := false
	for m := range r.out {
		if failed {
			continue
		}
		if err := r.conn.Send(m); err != nil {
			failed = true
			r.senderErr <- err
			continue
		}
		r.sent.Add(uint64(proto.Size(m)))
	}
}

// enqueue hands m to the sender. When the sender is behind (a slow link)
// it waits rather than drop a message the peer needs; a sender that failed
// keeps draining, so this never blocks for good.
func (r *run) enqueue(m *dragonv1.PeerMessage) { r.out <- m }

func (r *run) handle(m *dragonv1.PeerMessage) error {
	r.received += uint64(proto.Size(m))
	var (
		acts []aggregator.Action
		err  error
	)
	switch k := m.GetKind().(type) {
	case *dragonv1.PeerMessage_Drafts:
		var ds []aggregator.Draft
		if ds, err = fromDrafts(r.decode, k.Drafts.GetDrafts()); err != nil {
			return err
		}
		r.peerRestored = max(r.peerRestored, int(k.Drafts.GetPassagesRestored()))
		for _, d := range ds {
			r.record(r.opts.Self.Other(), d)
			r.est.Decode(d.Side(), float64(d.Meta.Context), float64(d.Meta.DecodeMicros)/1000)
		}
		acts, err = r.node.Step(aggregator.RemoteDrafts{Drafts: ds})
	case *dragonv1.PeerMessage_Verdicts:
		vs := make([]aggregator.Verdict, len(k.Verdicts.GetVerdicts()))
		for i, v := range k.Verdicts.GetVerdicts() {
			vs[i] = fromVerdict(v)
		}
		acts, err = r.node.Step(aggregator.RemoteVerdicts{Verdicts: vs})
	case *dragonv1.PeerMessage_Handover:
		var h aggregator.Handover
		if h, err = fromHandover(r.decode, k.Handover); err != nil {
			return err
		}
		r.heldFrom = h.NextStep
		acts, err = r.node.Step(aggregator.RemoteHandover{Handover: h})
	case *dragonv1.PeerMessage_Ping:
		r.enqueue(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Pong{Pong: &dragonv1.Pong{
			Seq: k.Ping.GetSeq(), PingSentUnixNano: k.Ping.GetSentUnixNano(), SentUnixNano: time.Now().UnixNano(),
		}}})
		return nil
	case *dragonv1.PeerMessage_Pong:
		r.pong(k.Pong)
		return nil
	case *dragonv1.PeerMessage_Cancel:
		if r.finish == "" {
			r.finish = FinishCancelled
		}
		r.over, r.cancel = true, k.Cancel
		return nil
	case *dragonv1.PeerMessage_Error:
		return peerError(k.Error)
	default:
		return fmt.Errorf("%w: unexpected %T during a generation", aggregator.ErrProtocol, k)
	}
	if err != nil {
		return err
	}
	return r.apply(acts)
}

// apply carries out a Node's actions, then asks the scheduler whether the
// aggregator should move.
func (r *run) apply(acts []aggregator.Action) error {
	r.publishPeerDrafts()
	decided := false
	for _, a := range acts {
		switch a := a.(type) {
		case aggregator.SendDrafts:
			m := msgDrafts(r.opts.SessionID, a.Drafts, r.dec.Restored())
			r.est.Message(proto.Size(m))
			for i := range a.Drafts {
				r.opts.Metrics.draftSent(r.decode.Vocab(), len(a.Drafts[i].Payload()))
			}
			r.enqueue(m)
		case aggregator.SendVerdicts:
			r.enqueue(msgVerdicts(r.opts.SessionID, a.Verdicts))
		case aggregator.SendHandover:
			r.log.Debug("handing the aggregator over", "next_step", a.Handover.NextStep)
			r.enqueue(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Handover{Handover: toHandover(r.opts.SessionID, a.Handover)}})
		case aggregator.Decided:
			decided = true
			if err := r.onDecided(a.Verdict); err != nil {
				return err
			}
		case aggregator.Rollback:
			r.mu.Lock()
			r.pending = append(r.pending, a)
			if r.cancelPass != nil {
				r.cancelPass() // its drafts are stale: stop the pass in flight
			}
			r.mu.Unlock()
			r.signal()
		case aggregator.Done:
			if r.finish == "" {
				r.finish = FinishMaxTokens
			}
			r.stopProducer()
			r.over = r.over || r.opts.Owner
		}
	}
	r.mu.Lock()
	r.settled = r.node.NextStep()
	r.mu.Unlock()
	r.aggregating.Store(r.node.Aggregating())
	if decided && r.node.Aggregating() && !r.node.Done() && !r.over && r.shouldMove() {
		acts, err := r.node.Step(aggregator.SwitchRequest{})
		if err != nil {
			return err
		}
		return r.apply(acts)
	}
	return nil
}

// share says whether both sides' drafts cross the link whoever
// aggregates (aggregator.Config.Share), so that the side that does not
// aggregate decides each step it holds both drafts of itself, a round trip
// before the verdict. Token-wise sync stays the plain baseline, and blind
// drafts (dragon-blind) DRAGON's own protocol.
func (o *Options) share() bool {
	return !o.Blind && o.Sync == Speculative
}

// hedges is the most hedges a side may have open: Options.Hedges where
// drafts are shared, none otherwise.
func (o *Options) hedges() int {
	if !o.share() {
		return 0
	}
	return o.Hedges
}

// beside says whether greedy drafts are made beside the peer's: drafts
// are shared, and a side drafting a step the peer's draft of which it
// holds drafts the mixture's argmax. Sampled drafts cannot be moved
// (Algorithm 1 needs x ~ p).
func (o *Options) beside() bool {
	return o.Sampling.Greedy() && o.share()
}

// publishPeerDrafts hands the Node's view of the peer's undecided drafts
// to the producer.
func (r *run) publishPeerDrafts() {
	if !r.opts.beside() {
		return
	}
	ds := r.node.PeerDrafts()
	r.mu.Lock()
	r.peer, r.peerEpoch = ds, r.node.Epoch(r.opts.Self)
	r.mu.Unlock()
}

// peerDraft is the peer's draft of step pos when it was drafted on the
// same answer as hist (this side's tokens before pos, drafted under epoch),
// nil otherwise. The Node's chain starts at the first undecided step, and
// this side's answer before it is the decided one while its epoch is the
// Node's, so matching the chain's tokens up to pos proves the prefixes
// equal.
func (r *run) peerDraft(pos int, hist []engine.Token, epoch uint32) *aggregator.Draft {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.peer) == 0 || epoch != r.peerEpoch || len(hist) != pos {
		return nil
	}
	from := int(r.peer[0].Step())
	if pos < from || pos >= from+len(r.peer) {
		return nil
	}
	for i, d := range r.peer[:pos-from] {
		if d.Token() != hist[from+i] {
			return nil
		}
	}
	return &r.peer[pos-from]
}

func (r *run) shouldMove() bool {
	if r.opts.SwitchEvery > 0 {
		return r.node.NextStep() >= r.heldFrom+uint64(r.opts.SwitchEvery)
	}
	return r.sched.Move(r.node.NextStep(), r.opts.Self, r.est.Costs())
}

// onDecided handles one target token.
func (r *run) onDecided(v aggregator.Verdict) error {
	if r.node.Aggregating() {
		r.sum.Aggregated[r.opts.Self.Index()]++
	} else {
		r.sum.Aggregated[r.opts.Self.Other().Index()]++
	}
	r.est.Verdict(v)
	r.hedge.decided(v, r.opts.Self)
	if t := r.sum.Trace; t != nil {
		t.Accept[0] = append(t.Accept[0], v.Accept[0])
		t.Accept[1] = append(t.Accept[1], v.Accept[1])
	}
	r.mu.Lock()
	r.decided = v.Step + 1
	r.mu.Unlock()
	r.signal()
	if r.over {
		return nil
	}
	if err := r.target(v.Target); err != nil {
		return err
	}
	if r.finish == FinishStop {
		if _, err := r.node.Step(aggregator.Finish{}); err != nil {
			return err
		}
		r.stopProducer()
		r.over = r.over || r.opts.Owner
	}
	return nil
}

// target takes one decided token: the end token ends the answer; any other
// joins it and goes to emit, which may end it (a stop string). Running
// alone, reaching MaxTokens ends it too; with the peer the Node says so.
func (r *run) target(tok engine.Token) error {
	r.targets = append(r.targets, tok)
	now := time.Now()
	if r.opts.Owner && !r.sum.Fallback && now.Sub(r.progress) > r.opts.StallTimeout/2 {
		r.sum.StallsSurvived++
	}
	r.progress = now
	alone := r.sum.Fallback
	if r.model.IsEOG(tok) {
		r.finish = FinishEOG
		r.over = r.over || alone
		return nil
	}
	r.sum.Tokens = append(r.sum.Tokens, tok)
	r.sum.TokenTimes = append(r.sum.TokenTimes, time.Now())
	if r.emit != nil {
		stop, err := r.emit(len(r.sum.Tokens)-1, tok)
		if err != nil {
			return emitError{err}
		}
		if stop {
			r.finish = FinishStop
			r.over = r.over || alone
			return nil
		}
	}
	if alone && len(r.targets) >= r.opts.MaxTokens {
		r.finish, r.over = FinishMaxTokens, true
	}
	return nil
}

// record adds a draft's decoding time to the trace.
func (r *run) record(side aggregator.Side, d aggregator.Draft) {
	if t := r.sum.Trace; t != nil {
		i := side.Index()
		t.DecodeMS[i] = append(t.DecodeMS[i], float64(d.Meta.DecodeMicros)/1000)
	}
}

func (r *run) ping() {
	r.pingSeq++
	p := &dragonv1.Ping{Seq: r.pingSeq, SentUnixNano: time.Now().UnixNano()}
	if r.pingSeq%padEvery == 0 {
		p.Padding = make([]byte, padBytes)
	}
	r.enqueue(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Ping{Ping: p}})
}

func (r *run) pong(p *dragonv1.Pong) {
	ms := float64(time.Now().UnixNano()-p.GetPingSentUnixNano()) / 1e6
	if ms < 0 || ms > 60_000 {
		return // not a time this side sent
	}
	if p.GetSeq()%padEvery == 0 {
		r.est.Bandwidth(padBytes, ms-r.plainRTT)
		return
	}
	r.plainRTT = ms
	r.est.RTT(ms)
	rtt := r.est.RTTMS()
	r.rttMicros.Store(int64(rtt * 1000))
	r.opts.Metrics.link(time.Duration(rtt*float64(time.Millisecond)), r.est.BandwidthBytesPerMS()*1000)
}

func (r *run) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *run) stopProducer() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.stopProd()
}

func (r *run) fillSummary() {
	s := &r.sum
	s.Finish = r.finish
	for i, side := range aggregator.Sides {
		st := r.node.Stats(side)
		s.Accepted[i], s.Rejected[i], s.Stale[i], s.SecondChoice[i] = st.Accepted, st.Rejected, st.Stale, st.SecondChoice
		s.LowProb[i], s.LowProbCaught[i] = st.LowProb, st.LowProbCaught
		s.Hedges[i], s.HedgeHits[i] = st.Hedges, st.HedgeHits
	}
	s.Switches, s.Early = r.node.Handovers(), r.node.Early()
	s.BytesSent, s.BytesReceived = r.sent.Load(), r.received
	s.ForwardPasses = r.dec.Steps()
	s.LocalAccepted = r.dec.SpecStats().AcceptedTokens
	s.AbortedPasses = r.aborted.Load()
	s.Beside = r.beside.Load()
	s.Restored[r.opts.Self.Index()] = r.dec.Restored()
	s.Restored[r.opts.Self.Other().Index()] = r.peerRestored
	s.RTT = time.Duration(r.est.RTTMS() * float64(time.Millisecond))
}

// depth is how many undecided drafts this side may have: the lookahead,
// plus, when drafting speculatively, the drafts it makes in one round
// trip at perTokenMS, since its drafts stay undecided for about that long
// from its own point of view. With the lookahead alone a side drafting
// 8 ms tokens over a 600 ms round trip stalled every 32 tokens, capping an
// answer at 600 / 32 ms a token however few drafts were rejected (issue
// 42). Until the first ping comes back (one round trip after the start,
// when the first 32 drafts are long made) the round trip is unknown, and
// the side may draft 4 lookaheads ahead: the pong then arrives before
// that runs out wherever a round trip is under 96 of its tokens.
func (r *run) depth(perTokenMS float64) int {
	d := r.opts.Lookahead
	if d <= 1 {
		return d
	}
	rtt := r.rttMicros.Load()
	if rtt == 0 {
		return 4 * d
	}
	if perTokenMS > 0 {
		d += int(math.Ceil(float64(rtt) / 1000 / perTokenMS))
	}
	return d
}

// produce runs the decoder: prefill, then drafts as fast as the decoder
// makes them, within the lookahead, until stopped. A rollback request
// aborts the pass in flight and rewinds the decoder to the decided answer.
func (r *run) produce(ctx context.Context, query string, passages []decoder.Passage, bursts chan<- burst) error {
	if !r.opts.Prefilled {
		if err := r.dec.Start(ctx, query, passages); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("session: prefill: %w", err)
		}
	}
	prop, err := aggregator.NewProposer(r.opts.Self, r.opts.Sampling.Seed, r.opts.Sampling.Greedy(), r.opts.CodecTopP)
	if err != nil {
		return err
	}
	prop.SetConfidence(r.opts.Confidence)
	var (
		epoch     uint32
		paused    bool // drafted the end token: wait for its verdict
		proposals = map[int]aggregator.Draft{}
		perToken  = profiler.EWMA{Weight: 0.1} // this side's decoding, ms a token
	)
	blind := map[int]bool{} // drafted without the peer's draft of the step
	choose := r.chooser(prop, func() uint32 { return epoch }, func(pos int, d aggregator.Draft, besidePeer bool) {
		proposals[pos], blind[pos] = d, !besidePeer
	}, true)
	var live []liveHedge
	for {
		next := uint64(len(r.dec.Generated()))
		r.mu.Lock()
		var limit int
		for {
			limit = min(int(r.decided)+r.depth(perToken.Value())-int(next), r.opts.MaxTokens-int(next))
			if r.stopped || len(r.pending) > 0 || (!paused && limit > 0) {
				break
			}
			r.mu.Unlock()
			select {
			case <-r.wake:
			case <-ctx.Done():
				return nil
			}
			r.mu.Lock()
		}
		if r.stopped {
			r.mu.Unlock()
			return nil
		}
		if len(r.pending) > 0 {
			rbs := r.pending
			r.pending = nil
			r.mu.Unlock()
			for _, rb := range rbs {
				if rb.Hedged {
					if err := r.adopt(live, rb.Step); err != nil {
						return err
					}
				} else if err := r.dec.Rewind(int(rb.Step), rb.Target); err != nil {
					return err
				}
				gen := r.dec.Generated()
				epoch, paused, live = rb.Epoch, r.model.IsEOG(gen[len(gen)-1]), live[:0]
			}
			continue
		}
		settled := r.settled
		decided := int(r.decided)
		passCtx, cancel := context.WithCancel(ctx)
		r.cancelPass = cancel
		r.mu.Unlock()
		// A rollback's step is the last one decided, whose distribution it
		// needs for the target's evidence: only those before it are final.
		r.dec.Settle(decided - 1)

		if live, err = r.pruneHedges(live, settled); err != nil {
			cancel()
			return err
		}
		start := time.Now()
		toks, err := r.dec.Step(passCtx, choose, limit)
		r.mu.Lock()
		r.cancelPass = nil
		r.mu.Unlock()
		cancel()
		if err != nil {
			if errors.Is(err, engine.ErrAborted) {
				if ctx.Err() != nil {
					return nil
				}
				r.mu.Lock()
				if len(r.pending) > 0 {
					r.aborted.Add(1)
				}
				r.mu.Unlock()
				continue // a rollback or the end
			}
			return err
		}
		per := time.Since(start) / time.Duration(len(toks))
		perToken.Add(float64(per.Microseconds()) / 1000)
		longest := 0
		for i := range r.dec.Seqs() {
			longest = max(longest, len(r.dec.Prompt(i)))
		}
		b := burst{drafts: make([]aggregator.Draft, 0, len(toks))}
		for i, t := range toks {
			d := proposals[int(next)+i]
			if d.Meta.Moved {
				r.beside.Add(1)
			}
			d.Meta.DecodeMicros, d.Meta.Context = uint32(per.Microseconds()), uint32(longest+int(next)+i)
			b.drafts = append(b.drafts, d)
			if r.model.IsEOG(t) {
				paused = true
				break // nothing after the end is worth sending
			}
		}
		meta := aggregator.Meta{DecodeMicros: uint32(per.Microseconds()), Context: uint32(longest)}
		if b.drafts, err = r.extendHedges(prop, live, b.drafts, meta); err != nil {
			return err
		}
		if live, err = r.openHedges(live, b.drafts, blind, epoch, perToken.Value()); err != nil {
			return err
		}
		clear(proposals)
		clear(blind)
		select {
		case bursts <- b:
		case <-ctx.Done():
			return nil
		}
		// The loop that takes the burst waits in this P's run queue: let it
		// send the drafts now rather than after the next pass has started
		// and the OS gives the core back (about a millisecond, one core).
		runtime.Gosched()
	}
}

// chooser is how this side decides its token at each position: the draft
// Proposer makes from the processed mixture, under the current epoch,
// beside the peer's draft of the position when beside and one is at hand;
// keep, when not nil, receives each draft.
func (r *run) chooser(prop *aggregator.Proposer, epoch func() uint32, keep func(pos int, d aggregator.Draft, besidePeer bool), beside bool) decoder.Chooser {
	var probs, scores []float32
	return func(mix []float32, pos int, hist []engine.Token) (engine.Token, error) {
		// h̃ of this position's weights (they follow the answer with
		// dynamic weights): the peer learns it with the draft.
		hTilde := r.dec.HTilde()
		probs, scores = r.process(mix, hist, probs, scores)
		e := epoch()
		var peer *aggregator.Draft
		if beside {
			peer = r.peerDraft(pos, hist, e)
		}
		var (
			d   aggregator.Draft
			err error
		)
		if peer == nil {
			d, err = prop.Propose(probs, uint64(pos), e, hTilde)
		} else {
			d, err = prop.ProposeBeside(probs, uint64(pos), e, hTilde, peer)
		}
		if err != nil {
			return 0, err
		}
		if keep != nil {
			keep(pos, d, peer != nil)
		}
		return d.Token(), nil
	}
}

// process is the distribution a side drafts from and sends: the mixture
// shaped by the sampling parameters. Greedy decoding sends the mixture
// itself (with the repetition penalty), so that the aggregator can take the
// argmax of the two sides' mixture; the draft is its argmax.
func (r *run) process(mix []float32, hist []engine.Token, dst, scores []float32) ([]float32, []float32) {
	sp := r.opts.Sampling
	if sp.Greedy() {
		sp.Temperature = 1
	}
	plain := sp.Temperature == 1 && (sp.RepeatPenalty == 0 || sp.RepeatPenalty == 1) && sp.TopK == 0 &&
		(sp.TopP == 0 || sp.TopP == 1) && sp.MinP == 0
	if plain {
		return mix, scores
	}
	scores = slices.Grow(scores[:0], len(mix))[:len(mix)]
	for i, p := range mix {
		scores[i] = float32(math.Log(float64(p)))
	}
	return sp.Dist(scores, hist, dst), scores
}
