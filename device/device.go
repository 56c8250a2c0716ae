// Package device is the device daemon's service for local apps
// (dragon.v1.DeviceService): it retrieves from the user's private corpus,
// opens a peer stream to the cloud for each generation, runs this side of
// the session and streams the answer to the app with a summary.
package device

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// Config configures the device side.
type Config struct {
	session.SideConfig
	// Peer reaches the cloud; nil: only device-only generations.
	Peer dragonv1.PeerServiceClient
	// StallTimeout: a generation whose cloud answers no handshake or
	// decides no step for this long goes on alone (0: 10 s).
	StallTimeout time.Duration
	// IdleUnload > 0 frees the decoder's context and the model's weights
	// after this long without a generation, so an idle daemon gives its
	// memory back; the next generation loads them back first. The model
	// must then be an Unloader.
	IdleUnload time.Duration
	// MaxQueue is how many generations may wait while one runs (0: 4;
	// negative: none); beyond it, and after QueueTimeout (0: 2 minutes)
	// in it, a generation is refused with a time to retry after.
	MaxQueue     int
	QueueTimeout time.Duration
}

func (c Config) maxQueue() int {
	if c.MaxQueue == 0 {
		return 4
	}
	return max(c.MaxQueue, 0)
}

func (c Config) queueTimeout() time.Duration { return cmp.Or(c.QueueTimeout, 2*time.Minute) }

// Unloader is a model that can free its weights while idle and load them
// back when next used (llamacpp.Model).
type Unloader interface {
	Unload() error
}

// defaultStallTimeout is StallTimeout's default.
const defaultStallTimeout = 10 * time.Second

// Server serves dragon.v1.DeviceService.
type Server struct {
	dragonv1.UnimplementedDeviceServiceServer
	cfg   Config
	hello *dragonv1.Hello
	busy  chan struct{}
	start time.Time
	ids   atomic.Uint64
	// waiting counts the generations queued for busy; meanGen is a
	// moving mean of how long one holds it, for their Retry-After.
	waiting atomic.Int64
	meanGen atomic.Int64 // nanoseconds
	// cloudModel is the model the cloud named in its last handshake.
	cloudModel atomic.Pointer[string]

	// life guards loading and freeing the decoder: a generation holds a
	// lease (acquire, release) from before its first use of dec to after
	// its last, and nothing is freed while one is held. A generation
	// that comes while the model is being freed waits, then loads it.
	life   sync.Mutex
	dec    *decoder.Decoder // nil while unloaded; read freely under a lease
	leases int
	// idleGen tells a stale idle timer (one armed before the latest
	// acquire) from the current one.
	idleGen uint64
	idle    *time.Timer
	closed  bool

	mu    sync.Mutex
	stats dragonv1.StatsResponse
}

// New loads the decoder the server generates with.
func New(cfg Config) (*Server, error) {
	if _, ok := cfg.Model.(Unloader); cfg.IdleUnload > 0 && !ok {
		return nil, fmt.Errorf("device: idle unload needs a model that can unload, not %T", cfg.Model)
	}
	dec, hello, err := cfg.Open(aggregator.Device)
	if err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	s := &Server{cfg: cfg, hello: hello, dec: dec, busy: make(chan struct{}, 1), start: time.Now()}
	s.ids.Store(rand.Uint64())
	s.armIdleLocked()
	return s, nil
}

// admit takes the generation slot, waiting for it in the queue (told to
// note) while another generation holds it.
func (s *Server) admit(ctx context.Context, note func(*dragonv1.Progress)) error {
	select {
	case s.busy <- struct{}{}:
		return nil
	default:
	}
	ahead := s.waiting.Add(1)
	defer s.waiting.Add(-1)
	full := func() error {
		return wire.ResourceExhausted(fmt.Sprintf("device generations (%d queued)", s.waiting.Load()-1), 1, 1, s.retryAfter(ahead))
	}
	if ahead > int64(s.cfg.maxQueue()) {
		return full()
	}
	note(&dragonv1.Progress{Phase: dragonv1.ProgressPhase_PROGRESS_PHASE_QUEUED, QueuePosition: uint32(ahead)})
	t := time.NewTimer(s.cfg.queueTimeout())
	defer t.Stop()
	select {
	case s.busy <- struct{}{}:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-t.C:
		return full()
	}
}

// retryAfter is how long the generations ahead of one are likely to take,
// by the mean of those before (a second at least).
func (s *Server) retryAfter(ahead int64) time.Duration {
	d := time.Duration(s.meanGen.Load() * ahead)
	return max(d.Round(time.Second), time.Second)
}

// observeHold folds one generation's hold of the slot into meanGen.
func (s *Server) observeHold(d time.Duration) {
	old := s.meanGen.Load()
	if old == 0 {
		s.meanGen.Store(int64(d))
		return
	}
	s.meanGen.Store(old + (int64(d)-old)/4)
}

// CloudModel is the model the cloud named in its latest handshake ("" if
// none yet).
func (s *Server) CloudModel() string {
	if p := s.cloudModel.Load(); p != nil {
		return *p
	}
	return ""
}

// Queued is how many generations wait for the one running.
func (s *Server) Queued() int { return int(s.waiting.Load()) }

// Generating says whether an answer is being generated now: background
// work (embedding new documents) waits while it is, so that it does not
// slow the answer.
func (s *Server) Generating() bool { return len(s.busy) > 0 }

// Close frees the decoder.
func (s *Server) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	s.closed = true
	s.idleGen++
	if s.idle != nil {
		s.idle.Stop()
	}
	if s.dec == nil {
		return nil
	}
	err := s.dec.Close()
	s.dec = nil
	return err
}

// ModelLoaded reports whether the model is loaded (false after an idle
// unload, until the next generation).
func (s *Server) ModelLoaded() bool {
	s.life.Lock()
	defer s.life.Unlock()
	return s.dec != nil
}

// acquire takes a lease on the decoder, loading it back after an idle
// unload.
func (s *Server) acquire() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return status.Error(codes.Unavailable, "the device daemon is shutting down")
	}
	s.idleGen++
	if s.idle != nil {
		s.idle.Stop()
	}
	if s.dec == nil {
		start := time.Now()
		dec, _, err := s.cfg.Open(aggregator.Device)
		if err != nil {
			return status.Errorf(codes.Unavailable, "loading the model back: %v", err)
		}
		s.dec = dec
		s.cfg.Log.Info("model loaded back after idling", "took", time.Since(start))
	}
	s.leases++
	return nil
}

// release ends a lease; the last one arms the idle timer.
func (s *Server) release() {
	s.life.Lock()
	defer s.life.Unlock()
	s.leases--
	s.armIdleLocked()
}

func (s *Server) armIdleLocked() {
	if s.cfg.IdleUnload <= 0 || s.leases > 0 || s.closed {
		return
	}
	s.idleGen++
	gen := s.idleGen
	s.idle = time.AfterFunc(s.cfg.IdleUnload, func() { s.unloadIdle(gen) })
}

// unloadIdle frees the decoder's context and the model's weights, unless
// a generation took a lease since the timer gen was armed.
func (s *Server) unloadIdle(gen uint64) {
	s.life.Lock()
	defer s.life.Unlock()
	if gen != s.idleGen || s.leases > 0 || s.dec == nil {
		return
	}
	// The verification costs were measured for this model and these
	// threads already: the decoder made on reload need not measure again.
	s.cfg.Decoder.VerifyTable = s.dec.VerifyTable()
	if err := s.dec.Close(); err != nil {
		s.cfg.Log.Warn("idle unload: closing the decoder", "err", err)
	}
	s.dec = nil
	// Another holder of a context (the chat model as retrieval
	// embedder) keeps the weights loaded: only the context goes.
	if err := s.cfg.Model.(Unloader).Unload(); err != nil {
		s.cfg.Log.Warn("idle unload: the model stays loaded", "err", err)
		return
	}
	s.cfg.Log.Info("model unloaded after idling", "idle", s.cfg.IdleUnload)
}

// Generate implements dragon.v1.DeviceService.
func (s *Server) Generate(g *dragonv1.GenerateRequest, stream dragonv1.DeviceService_GenerateServer) error {
	return s.Serve(stream.Context(), g, stream.Send)
}

// Serve runs one generation for any front end (gRPC, the OpenAI API): send
// gets the chunks of the answer and, last, the summary. Errors are gRPC
// statuses.
func (s *Server) Serve(ctx context.Context, g *dragonv1.GenerateRequest, send func(*dragonv1.GenerateResponse) error) (err error) {
	defer func() { s.cfg.Metrics.Refusal(err) }()
	start := time.Now()
	req, err := session.ParseGenerate(g, s.cfg.Limits, s.cfg.Defaults)
	if err != nil {
		return err
	}
	if req.Mode != dragonv1.Mode_MODE_DEVICE_ONLY && s.cfg.Peer == nil {
		return status.Errorf(codes.FailedPrecondition, "mode %v needs the cloud, and this device has none configured (--cloud)", req.Mode)
	}
	note := func(*dragonv1.Progress) {}
	if g.GetProgress() {
		note = func(p *dragonv1.Progress) {
			_ = send(&dragonv1.GenerateResponse{Kind: &dragonv1.GenerateResponse_Progress{Progress: p}})
		}
	}
	if err := s.admit(ctx, note); err != nil {
		return err
	}
	held := time.Now()
	defer func() { <-s.busy; s.observeHold(time.Since(held)) }()
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	id := s.ids.Add(1)
	log := s.cfg.Log.With("session", id, "mode", session.ModeName(req.Mode))
	out := newChunker(s.cfg.Model, req.Stop, send)
	opts := req.Options(aggregator.Device, id)
	opts.Log, opts.Record, opts.Metrics, opts.HedgeBelow = log, g.GetRecordTrace(), s.cfg.Metrics, s.cfg.HedgeBelow
	defer s.cfg.Metrics.Begin()()
	s.dec.SetSystem(req.System)
	s.dec.SetHistory(req.History)
	s.dec.SetEvidence(req.Sources)
	s.dec.SetPosteriorEvery(req.PosteriorEvery)
	s.track(func(st *dragonv1.StatsResponse) { st.Generations++; st.GenerationsActive++ })
	defer s.track(func(st *dragonv1.StatsResponse) { st.GenerationsActive-- })

	sum, own, err := s.generate(ctx, req, opts, out, note)
	// The answer joins the cache, so the conversation's next turn, or the
	// same question again, prefills only what it adds.
	s.dec.Retain()
	sum.Fallback = sum.Fallback || out.fellBack
	s.cfg.Metrics.Observe(session.ModeName(req.Mode), start, sum, err)
	if err != nil {
		log.Warn("generation failed", "err", err)
		return toStatus(ctx, err)
	}
	if err := out.flush(); err != nil {
		return err
	}
	summary := s.summarize(req, sum, out.text.String(), start)
	if req.Sources {
		summary.Sources, summary.SourcesPartial = answerSources(own, sum)
	}
	if out.fellBack {
		summary.Fallback, summary.FallbackStep, summary.FallbackReason = true, uint32(out.fallbackStep), out.fallbackCause.Error()
		s.cfg.Metrics.Fallback(out.fallbackCause)
	}
	s.track(func(st *dragonv1.StatsResponse) {
		st.Tokens += uint64(len(sum.Tokens))
		st.AggregatorSwitches += sum.Switches
		st.StaleDrafts += sum.Stale[0] + sum.Stale[1]
		st.BytesSent += sum.BytesSent
		st.BytesReceived += sum.BytesReceived
		st.AcceptanceRateDevice, st.AcceptanceRateCloud = summary.GetAcceptanceRateDevice(), summary.GetAcceptanceRateCloud()
		st.Rtt = durationpb.New(sum.RTT)
	})
	return send(&dragonv1.GenerateResponse{Kind: &dragonv1.GenerateResponse_Summary{Summary: summary}})
}

// generate runs the request in its mode; it returns the summary and the
// device's own passages the answer was decoded over.
func (s *Server) generate(ctx context.Context, req session.Request, opts session.Options, out *chunker, note func(*dragonv1.Progress)) (session.Summary, []decoder.Passage, error) {
	if req.Mode == dragonv1.Mode_MODE_DEVICE_ONLY {
		return s.alone(ctx, req, opts, out.emit, note)
	}
	opts.Fallback, opts.StallTimeout = true, cmp.Or(s.cfg.StallTimeout, defaultStallTimeout)
	opts.OnFallback = func(step int, cause error) { out.fallback(step, cause) }
	sum, own, err := s.withCloud(ctx, req, opts, out.emit, note)
	if err == nil || ctx.Err() != nil || out.sentAny() {
		return sum, own, err
	}
	// The cloud failed before the answer began (unreachable, refused, or a
	// baseline that cannot go on alone): answer alone from the start.
	opts.Log.Warn("the cloud failed: answering alone", "err", err)
	out.fallback(0, err)
	alone, own, aerr := s.alone(ctx, req, opts, out.emit, note)
	alone.BytesSent, alone.BytesReceived = sum.BytesSent, sum.BytesReceived
	return alone, own, aerr
}

// alone answers from the device's passages only.
func (s *Server) alone(ctx context.Context, req session.Request, opts session.Options, emit session.Emit, note func(*dragonv1.Progress)) (session.Summary, []decoder.Passage, error) {
	note(&dragonv1.Progress{Phase: dragonv1.ProgressPhase_PROGRESS_PHASE_RETRIEVING})
	passages, err := s.retrieve(ctx, req)
	if err != nil {
		return session.Summary{}, nil, err
	}
	note(&dragonv1.Progress{Phase: dragonv1.ProgressPhase_PROGRESS_PHASE_PREFILLING, PassagesDevice: uint32(len(passages))})
	sum, err := session.Local(ctx, opts, s.dec, session.Input{Query: req.Query, Passages: passages}, emit)
	sum.Aggregated[aggregator.Device.Index()] = uint64(len(sum.Tokens))
	return sum, passages, err
}

// answerSources are the answer's sources: the device's own passages with
// their evidence and the cloud's entries (in the KV baseline the device's
// evidence of the cloud's sequences, which it decoded), weighed and
// shared over all of them. partial says some passage the answer used is
// missing.
func answerSources(own []decoder.Passage, sum session.Summary) ([]*dragonv1.Source, bool) {
	var ownLL, imported []float64
	if len(sum.Evidence) >= len(own) && sum.Evidence != nil {
		ownLL, imported = sum.Evidence[:len(own)], sum.Evidence[len(own):]
	}
	list := session.Sources(aggregator.Device, own, ownLL)
	for i, e := range sum.PeerSources {
		if i < len(imported) && !e.GetHasEvidence() {
			e.LogLikelihood, e.HasEvidence = imported[i], true
		}
	}
	list = append(list, sum.PeerSources...)
	mixed := session.CombineSources(list)
	return list, mixed || sum.PeerSourcesMissing
}

func (s *Server) retrieve(ctx context.Context, req session.Request) ([]decoder.Passage, error) {
	ps, err := s.cfg.Retrieve(ctx, req, req.PassagesDevice)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "device retrieval: %v", err)
	}
	return ps, nil
}

// hangUp ends a session whose handshake failed without cancelling it
// first: the cloud still reads what was sent (our Hello, and why we
// refused its own), so that its log says why too. Cancelled at once, the
// stream could end before the cloud reads them; its operator would see
// only "context canceled". The wait is bounded: a cloud that does not
// end the stream is cut off by the caller's cancel.
func hangUp(conn dragonv1.PeerService_SessionClient) {
	_ = conn.CloseSend()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			if _, err := conn.Recv(); err != nil {
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(time.Second):
	}
}

// withCloud runs a generation that uses the cloud, in the request's mode.
func (s *Server) withCloud(ctx context.Context, req session.Request, opts session.Options, emit session.Emit, note func(*dragonv1.Progress)) (_ session.Summary, passages []decoder.Passage, _ error) {
	// The Hello and the Begin go out together, and this side retrieves and
	// prefills while they travel: the cloud starts half a round trip after
	// the question instead of one and a half, and the first token waits for
	// one round trip and the slower prefill rather than for their sum.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := s.cfg.Peer.Session(ctx)
	if err != nil {
		return session.Summary{}, passages, status.Errorf(codes.Unavailable, "cloud: %v", err)
	}
	defer func() { _ = conn.CloseSend() }()
	if err := session.SendHello(conn, s.hello); err != nil {
		return session.Summary{}, passages, status.Errorf(codes.Unavailable, "cloud: %v", err)
	}
	if err := session.Send(conn, &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: req.Begin(opts.SessionID)}}); err != nil {
		return session.Summary{}, passages, status.Errorf(codes.Unavailable, "cloud: %v", err)
	}
	type handshake struct {
		peer *dragonv1.Hello
		err  error
	}
	// A refused handshake stops the prefill it overlaps.
	local, stopLocal := context.WithCancel(ctx)
	defer stopLocal()
	shook := make(chan handshake, 1)
	go func() {
		hctx, done := context.WithTimeout(ctx, cmp.Or(s.cfg.StallTimeout, defaultStallTimeout))
		defer done()
		peer, err := session.AwaitHello(hctx, conn, s.hello)
		if err != nil {
			stopLocal()
		}
		shook <- handshake{peer, err}
	}()
	var localErr error
	if req.Mode != dragonv1.Mode_MODE_CLOUD_ONLY {
		note(&dragonv1.Progress{Phase: dragonv1.ProgressPhase_PROGRESS_PHASE_RETRIEVING})
		passages, localErr = s.retrieve(local, req)
	}
	note(&dragonv1.Progress{Phase: dragonv1.ProgressPhase_PROGRESS_PHASE_PREFILLING,
		PassagesDevice: uint32(len(passages)), PassagesCloud: uint32(req.PassagesCloud)})
	if localErr == nil && (req.Mode == dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION || req.Mode == dragonv1.Mode_MODE_TOKEN_WISE_SYNC) {
		if err := s.dec.Start(local, req.Query, passages); err != nil {
			localErr = fmt.Errorf("device prefill: %w", err)
		} else {
			opts.Prefilled = true
		}
	}
	hs := <-shook
	if hs.err != nil {
		// Unless the wait timed out: AwaitHello's Recv may then still be
		// pending, and a stream takes one Recv at a time.
		if !errors.Is(hs.err, context.DeadlineExceeded) && !errors.Is(hs.err, context.Canceled) {
			hangUp(conn)
		}
		return session.Summary{}, passages, hs.err
	}
	name := hs.peer.GetModelName()
	s.cloudModel.Store(&name)
	if localErr != nil {
		return session.Summary{}, passages, localErr
	}
	opts.Fits = [2]profiler.DecodeFit{s.cfg.Fit, session.FitFromHello(hs.peer)}
	switch req.Mode {
	case dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, dragonv1.Mode_MODE_TOKEN_WISE_SYNC:
		sum, err := session.Run(ctx, opts, s.dec, req.Query, passages, conn, emit)
		return sum, passages, err
	case dragonv1.Mode_MODE_SEQUENCE_WISE_SYNC:
		sum, err := session.SequenceWise(ctx, opts, s.dec, req.Query, passages, conn, emit)
		return sum, passages, err
	case dragonv1.Mode_MODE_CLOUD_ONLY:
		sum, err := session.ReceiveSolo(ctx, opts, conn, emit)
		sum.Aggregated[aggregator.Cloud.Index()] = uint64(len(sum.Tokens))
		return sum, nil, err
	case dragonv1.Mode_MODE_CONTEXT:
		inbox := session.NewInbox(ctx, conn)
		cloudPassages, n, err := session.FetchPassages(ctx, inbox)
		if err != nil {
			return session.Summary{}, passages, err
		}
		all := append(slices.Clip(passages), cloudPassages...)
		sum, err := s.finishLocal(ctx, opts, conn, inbox, session.Input{Query: req.Query, Passages: all, Context: true}, n, emit)
		return sum, passages, err
	case dragonv1.Mode_MODE_KV:
		inbox := session.NewInbox(ctx, conn)
		imported, n, err := session.FetchKV(ctx, inbox, s.cfg.Model.Info().VocabSize)
		if err != nil {
			return session.Summary{}, passages, err
		}
		sum, err := s.finishLocal(ctx, opts, conn, inbox, session.Input{Query: req.Query, Passages: passages, Imported: imported}, n, emit)
		return sum, passages, err
	}
	return session.Summary{}, passages, status.Errorf(codes.Unimplemented, "mode %v is not implemented", req.Mode)
}

// finishLocal decodes what the cloud sent (its passages as text or as KV
// state) on the device, then ends the peer session.
func (s *Server) finishLocal(ctx context.Context, opts session.Options, conn session.Conn, inbox *session.Inbox, in session.Input, received uint64, emit session.Emit) (session.Summary, error) {
	sum, err := session.Local(ctx, opts, s.dec, in, emit)
	sum.BytesReceived += received
	sum.Aggregated[aggregator.Device.Index()] = uint64(len(sum.Tokens))
	session.FinishFetched(ctx, opts, conn, inbox, &sum)
	return sum, err
}

func (s *Server) track(f func(*dragonv1.StatsResponse)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.stats)
}

// Health implements dragon.v1.DeviceService.
func (s *Server) Health(ctx context.Context, _ *dragonv1.HealthRequest) (*dragonv1.HealthResponse, error) {
	info := s.cfg.Model.Info()
	return &dragonv1.HealthResponse{
		Serving: true, CloudConnected: s.cfg.Peer != nil, ModelName: info.Name, ModelFingerprint: info.Fingerprint,
		ProtocolVersion: wire.ProtocolVersion,
	}, nil
}

// Stats implements dragon.v1.DeviceService.
func (s *Server) Stats(context.Context, *dragonv1.StatsRequest) (*dragonv1.StatsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &dragonv1.StatsResponse{
		Uptime: durationpb.New(time.Since(s.start)), Generations: s.stats.Generations, GenerationsActive: s.stats.GenerationsActive,
		Tokens: s.stats.Tokens, AcceptanceRateDevice: s.stats.AcceptanceRateDevice, AcceptanceRateCloud: s.stats.AcceptanceRateCloud,
		AggregatorSwitches: s.stats.AggregatorSwitches, StaleDrafts: s.stats.StaleDrafts, BytesSent: s.stats.BytesSent,
		BytesReceived: s.stats.BytesReceived, Rtt: s.stats.Rtt,
	}
	if s.cfg.Fit.Valid() {
		st.DecodeTimeDevice = durationpb.New(time.Duration(s.cfg.Fit.At(256) * float64(time.Millisecond)))
	}
	return st, nil
}

// summarize builds the summary the app gets last.
func (s *Server) summarize(req session.Request, sum session.Summary, text string, start time.Time) *dragonv1.GenerateSummary {
	out := &dragonv1.GenerateSummary{
		FinishReason: finishReason(sum.Finish), Text: text, Tokens: uint32(len(sum.Tokens)), Mode: req.Mode,
		Total:              durationpb.New(time.Since(start)),
		AggregatorSwitches: uint32(sum.Switches), StaleDrafts: sum.Stale[0] + sum.Stale[1],
		BytesSent: sum.BytesSent, BytesReceived: sum.BytesReceived,
		StepsAggregatedDevice: sum.Aggregated[0], StepsAggregatedCloud: sum.Aggregated[1],
		ForwardPassesDevice: uint64(sum.ForwardPasses), LocalDraftTokensAcceptedDevice: sum.LocalAccepted,
		PassagesDevice: uint32(req.PassagesDevice), PassagesCloud: uint32(req.PassagesCloud),
		SecondChoiceDevice: sum.SecondChoice[0], SecondChoiceCloud: sum.SecondChoice[1],
		RejectedDevice: sum.Rejected[0], RejectedCloud: sum.Rejected[1],
		PassagesRestoredDevice: uint32(sum.Restored[0]), PassagesRestoredCloud: uint32(sum.Restored[1]),
		LowProbDraftsDevice: sum.LowProb[0][:], LowProbDraftsCloud: sum.LowProb[1][:],
		LowProbCaughtDevice: sum.LowProbCaught[0][:], LowProbCaughtCloud: sum.LowProbCaught[1][:],
		HedgesDevice: sum.Hedges[0], HedgesCloud: sum.Hedges[1], HedgeHitsDevice: sum.HedgeHits[0], HedgeHitsCloud: sum.HedgeHits[1],
	}
	if req.Mode == dragonv1.Mode_MODE_DEVICE_ONLY {
		out.PassagesCloud = 0
	}
	if req.Mode == dragonv1.Mode_MODE_CLOUD_ONLY {
		out.PassagesDevice = 0
	}
	rate := func(i int) float64 {
		if n := sum.Accepted[i] + sum.Rejected[i]; n > 0 {
			return float64(sum.Accepted[i]) / float64(n)
		}
		return 0
	}
	out.AcceptanceRateDevice, out.AcceptanceRateCloud = rate(0), rate(1)
	if len(sum.TokenTimes) > 0 {
		out.Ttft = durationpb.New(sum.TokenTimes[0].Sub(start))
		var gaps []time.Duration
		for i := 1; i < len(sum.TokenTimes); i++ {
			gaps = append(gaps, sum.TokenTimes[i].Sub(sum.TokenTimes[i-1]))
		}
		if len(gaps) > 0 {
			first := sum.TokenTimes[0]
			if !sum.FirstLocal.IsZero() {
				// The answer arrived at once (sequence-wise): its tokens took
				// from the first one decoded here to the decision.
				first = sum.FirstLocal
			}
			span := sum.TokenTimes[len(sum.TokenTimes)-1].Sub(first)
			out.TokenLatencyMean = durationpb.New(span / time.Duration(len(gaps)))
			slices.Sort(gaps)
			out.TokenLatencyP50 = durationpb.New(gaps[len(gaps)/2])
			out.TokenLatencyP95 = durationpb.New(gaps[min(len(gaps)-1, len(gaps)*95/100)])
			out.TokensPerSecond = float64(len(gaps)) / span.Seconds()
		}
	}
	if t := sum.Trace; t != nil {
		out.Trace = &dragonv1.Trace{DecodeMsDevice: t.DecodeMS[0], DecodeMsCloud: t.DecodeMS[1], AcceptDevice: t.Accept[0], AcceptCloud: t.Accept[1]}
	}
	return out
}

func finishReason(f session.Finish) dragonv1.FinishReason {
	switch f {
	case session.FinishEOG, session.FinishStop:
		return dragonv1.FinishReason_FINISH_REASON_STOP
	case session.FinishMaxTokens:
		return dragonv1.FinishReason_FINISH_REASON_LENGTH
	case session.FinishContext:
		return dragonv1.FinishReason_FINISH_REASON_CONTEXT_FULL
	}
	return dragonv1.FinishReason_FINISH_REASON_CANCELLED
}

// toStatus maps a generation error to the status the app gets.
func toStatus(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, aggregator.ErrProtocol):
		return status.Errorf(codes.Internal, "the cloud broke the protocol: %v", err)
	case errors.Is(err, engine.ErrContextFull):
		return status.Errorf(codes.OutOfRange, "%v", err)
	case errors.Is(err, engine.ErrInvalidInput):
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	return status.Errorf(codes.Internal, "%v", err)
}

// chunker streams the answer to the app: each token with the text it
// completes, stop strings cut (text that may be the start of a stop string
// is held back until it cannot be).
type chunker struct {
	detok  *engine.Detokenizer
	stop   []string
	out    func(*dragonv1.GenerateResponse) error
	text   strings.Builder // the answer so far
	sent   int             // bytes of text already streamed
	step   uint64
	toks   []int32
	chunks int // chunks sent

	// The cloud failed: the next chunk says so.
	fellBack, announce bool
	fallbackStep       int
	fallbackCause      error
}

// fallback notes that the answer goes on without the cloud after step
// tokens.
func (c *chunker) fallback(step int, cause error) {
	c.fellBack, c.announce, c.fallbackStep, c.fallbackCause = true, true, step, cause
}

// sentAny reports whether any of the answer reached the app.
func (c *chunker) sentAny() bool { return c.chunks > 0 }

func newChunker(m engine.Model, stop []string, out func(*dragonv1.GenerateResponse) error) *chunker {
	return &chunker{detok: engine.NewDetokenizer(m), stop: stop, out: out}
}

func (c *chunker) emit(step int, tok engine.Token) (bool, error) {
	if len(c.toks) == 0 {
		c.step = uint64(step)
	}
	c.toks = append(c.toks, tok)
	c.text.WriteString(c.detok.Add(tok))
	full := c.text.String()
	if i := earliest(full, c.stop); i >= 0 {
		c.text.Reset()
		c.text.WriteString(full[:i])
		return true, c.send(i)
	}
	return false, c.send(len(full) - heldBack(full, c.stop))
}

// send streams the text up to end and the tokens since the last chunk.
func (c *chunker) send(end int) error {
	if end < c.sent {
		end = c.sent
	}
	chunk := &dragonv1.TokenChunk{Step: c.step, Tokens: c.toks, Text: c.text.String()[c.sent:end], Fallback: c.announce}
	c.sent = end
	c.toks = nil
	c.announce = false
	c.chunks++
	return c.out(&dragonv1.GenerateResponse{Kind: &dragonv1.GenerateResponse_Chunk{Chunk: chunk}})
}

// flush streams what was held back.
func (c *chunker) flush() error {
	c.text.WriteString(c.detok.Flush())
	if c.text.Len() == c.sent && len(c.toks) == 0 {
		return nil
	}
	if i := earliest(c.text.String(), c.stop); i >= 0 {
		full := c.text.String()
		c.text.Reset()
		c.text.WriteString(full[:i])
	}
	return c.send(c.text.Len())
}

// earliest is where the first stop string starts in text, or -1.
func earliest(text string, stops []string) int {
	at := -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// heldBack is how many bytes at the end of text could begin a stop string.
func heldBack(text string, stops []string) int {
	n := 0
	for _, s := range stops {
		for k := min(len(s)-1, len(text)); k > n; k-- {
			if strings.HasSuffix(text, s[:k]) {
				n = k
				break
			}
		}
	}
	return n
}
