// Package cloud is the cloud daemon's peer server: it answers devices'
// Session streams with the same session code the devices run, over its
// own corpus. Sessions share one loaded model and one engine context: each
// holds a slot of an engine/batcher executor, which decodes the rows of
// every live session in one pass per tick. Admission is bounded: a few
// sessions may wait for a slot, the rest are told to retry.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/batcher"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// Config configures the cloud side.
type Config struct {
	session.SideConfig
	// MaxSessions is how many generations run at once (0: 4).
	MaxSessions int
	// MaxQueue is how many more may wait for one of them (0: MaxSessions;
	// negative: none), each at most QueueTimeout (0: DefaultQueueTimeout).
	MaxQueue     int
	QueueTimeout time.Duration
	// SessionTimeout bounds one generation (0: 5 minutes).
	SessionTimeout time.Duration
	// PrefillChunk is the most prompt rows a session puts into one shared
	// pass (0: 64): a long prefill goes in pieces, so that the sessions
	// already answering wait for a piece rather than the whole of it.
	PrefillChunk int
}

// DefaultQueueTimeout is the longest a session waits for a free slot by
// default. It is half a device's default stall timeout (its
// --cloud-timeout, 10 s), so that a full cloud refuses a device with a
// reason ("cloud sessions exhausted", and when to retry) before the
// device gives up on the silence, and a session admitted at the end of
// its wait has the other half for its prefill.
const DefaultQueueTimeout = 5 * time.Second

func (c *Config) defaults() {
	if c.MaxSessions <= 0 {
		c.MaxSessions = 4
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = c.MaxSessions
	}
	if c.QueueTimeout <= 0 {
		c.QueueTimeout = DefaultQueueTimeout
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 5 * time.Minute
	}
	if c.PrefillChunk <= 0 {
		c.PrefillChunk = 64
	}
}

// Server serves dragon.v1.PeerService.
type Server struct {
	dragonv1.UnimplementedPeerServiceServer
	cfg      Config
	hello    *dragonv1.Hello
	exec     *batcher.Executor
	decoders map[*batcher.Slot]*decoder.Decoder
	waiting  atomic.Int32
}

// New loads a decoder per session slot, all sharing one engine context.
func New(cfg Config) (*Server, error) {
	cfg.defaults()
	if cfg.Model == nil {
		return nil, errors.New("cloud: no model")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	opts := cfg.Decoder
	if opts.MaxPassages <= 0 {
		opts.MaxPassages = 8
	}
	if opts.CtxPerSeq <= 0 {
		opts.CtxPerSeq = 1024
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 512
	}
	exec, err := batcher.New(cfg.Model, batcher.Options{
		Slots: cfg.MaxSessions, SeqsPerSlot: opts.MaxPassages * (1 + opts.Hedges),
		Context: engine.ContextOptions{CtxPerSeq: opts.CtxPerSeq, BatchSize: opts.BatchSize, Threads: opts.Threads},
		OnTick:  cfg.Metrics.Tick,
	})
	if err != nil {
		return nil, fmt.Errorf("cloud: %w", err)
	}
	s := &Server{cfg: cfg, exec: exec, decoders: map[*batcher.Slot]*decoder.Decoder{}}
	verifyRows := 0 // a verification pass is never cut in pieces
	if opts.Spec.Enabled {
		verifyRows = (opts.Spec.MaxDraft + 1) * opts.MaxPassages
	}
	if opts.Spec.Enabled && !opts.NoCostModel && opts.VerifyTable == nil {
		// One profile of verification costs for all: each decoder refines
		// a copy of its own.
		if opts.VerifyTable, err = decoder.ProfileVerify(context.Background(), exec.Slot(0), verifyRows, 2); err != nil {
			exec.Close()
			return nil, fmt.Errorf("cloud: %w", err)
		}
	}
	for i := range exec.Slots() {
		slot := exec.Slot(i)
		o := opts
		o.Context = slot
		o.BatchSize = min(max(cfg.PrefillChunk, verifyRows), opts.BatchSize)
		if opts.VerifyTable != nil {
			o.VerifyTable = opts.VerifyTable.Clone()
		}
		side := cfg.SideConfig
		side.Decoder = o
		dec, hello, err := side.Open(aggregator.Cloud)
		if err != nil {
			exec.Close()
			return nil, fmt.Errorf("cloud: %w", err)
		}
		s.decoders[slot], s.hello = dec, hello
	}
	return s, nil
}

// Close frees the decoders and the shared context.
func (s *Server) Close() error {
	for _, d := range s.decoders {
		d.Close()
	}
	return s.exec.Close()
}

// admit takes a slot for a session, waiting in the bounded queue when all
// are busy; a session the queue cannot take, or that waits too long, is
// told to retry.
func (s *Server) admit(ctx context.Context) (*batcher.Slot, error) {
	if slot, ok := s.exec.TryAcquire(); ok {
		return slot, nil
	}
	n := s.waiting.Add(1)
	s.cfg.Metrics.Queue(int(n))
	defer func() { s.cfg.Metrics.Queue(int(s.waiting.Add(-1))) }()
	if int(n) > max(s.cfg.MaxQueue, 0) {
		return nil, wire.ResourceExhausted("cloud sessions", int64(s.cfg.MaxSessions), int64(s.cfg.MaxSessions), time.Second)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueueTimeout)
	defer cancel()
	slot, err := s.exec.Acquire(ctx)
	if err != nil {
		return nil, status.Errorf(codes.ResourceExhausted, "cloud sessions exhausted (%d of %d in use) for %v; retry later", s.cfg.MaxSessions, s.cfg.MaxSessions, s.cfg.QueueTimeout)
	}
	return slot, nil
}

// Session implements dragon.v1.PeerService: one generation.
func (s *Server) Session(stream dragonv1.PeerService_SessionServer) (err error) {
	defer func() { s.cfg.Metrics.Refusal(err) }()
	ctx := stream.Context()
	peer, err := session.Handshake(ctx, stream, s.hello)
	if err != nil {
		// The device is told why; the operator of the cloud is too.
		s.cfg.Log.Warn("handshake refused", "err", err)
		return err
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	b := m.GetBegin()
	if b == nil {
		return s.refuse(stream, 0, status.Errorf(codes.InvalidArgument, "expected a Begin after the Hello, got %T", m.GetKind()))
	}
	req, err := session.ParseBegin(b, s.cfg.Limits, s.cfg.Defaults)
	if err != nil {
		return s.refuse(stream, b.GetSessionId(), err)
	}
	if req.Mode == dragonv1.Mode_MODE_DEVICE_ONLY {
		return s.refuse(stream, b.GetSessionId(), status.Error(codes.InvalidArgument, "invalid mode: device-only generations do not use the cloud"))
	}
	slot, err := s.admit(ctx)
	if err != nil {
		return s.refuse(stream, b.GetSessionId(), err)
	}
	defer s.exec.Release(slot)
	dec := s.decoders[slot]
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.SessionTimeout,
		fmt.Errorf("cloud: the answer outlasted the session timeout (%v): %w", s.cfg.SessionTimeout, context.DeadlineExceeded))
	defer cancel()
	log := s.cfg.Log.With("session", b.GetSessionId(), "mode", session.ModeName(req.Mode))
	id := b.GetSessionId()
	opts := req.Options(aggregator.Cloud, id)
	opts.Fits = [2]profiler.DecodeFit{session.FitFromHello(peer), s.cfg.Fit}
	opts.Log, opts.Metrics, opts.HedgeBelow = log, s.cfg.Metrics, s.cfg.HedgeBelow
	start := time.Now()
	defer s.cfg.Metrics.Begin()()
	passages, err := s.cfg.Retrieve(ctx, req, req.PassagesCloud)
	if err != nil {
		// A retrieval backend's outage shows here first: say so, not only
		// to the device.
		log.Warn("retrieval failed: refusing the session", "err", err)
		return s.refuse(stream, id, status.Errorf(codes.Internal, "cloud retrieval: %v", err))
	}
	dec.SetSystem(req.System)
	dec.SetHistory(req.History)
	dec.SetEvidence(req.Sources)
	dec.SetPosteriorEvery(req.PosteriorEvery)
	log.Debug("cloud session", "passages", len(passages))
	var sum session.Summary
	switch req.Mode {
	case dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, dragonv1.Mode_MODE_TOKEN_WISE_SYNC:
		sum, err = session.Run(ctx, opts, dec, req.Query, passages, stream, nil)
	case dragonv1.Mode_MODE_SEQUENCE_WISE_SYNC:
		err = session.ServeSequenceWise(ctx, opts, dec, req.Query, passages, stream)
	case dragonv1.Mode_MODE_CLOUD_ONLY:
		err = session.ServeSolo(ctx, opts, dec, req.Query, passages, stream)
	case dragonv1.Mode_MODE_CONTEXT:
		err = session.ServePassages(ctx, opts, dec, passages, stream)
	case dragonv1.Mode_MODE_KV:
		err = session.ServeKV(ctx, opts, dec, req.Query, passages, stream)
	default:
		return s.refuse(stream, id, status.Errorf(codes.Unimplemented, "mode %v is not served by this cloud", req.Mode))
	}
	// The answer joins the shared cache: the conversation's next turn may
	// land on another slot.
	log.Debug("cloud session done", "passages_restored", dec.Restored(), "err", err)
	dec.Retain()
	s.cfg.Metrics.Observe(session.ModeName(req.Mode), start, sum, err)
	if err != nil && ctx.Err() == nil {
		log.Warn("cloud session failed", "err", err)
		return statusOf(err)
	}
	if err != nil && stream.Context().Err() == nil {
		// The session's own timeout ended it while the device still
		// listens: the stream's status says so too, since the error
		// message the session queued may not have gone out before its
		// sender saw the context end (the device would read a bare EOF).
		return status.Error(codes.DeadlineExceeded, context.Cause(ctx).Error())
	}
	return nil
}

// refuse tells the device why before ending the stream with err.
func (s *Server) refuse(stream dragonv1.PeerService_SessionServer, id uint64, err error) error {
	st := status.Convert(err)
	_ = stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Error{Error: &dragonv1.Error{
		SessionId: id, Code: uint32(st.Code()), Message: st.Message(),
	}}})
	return err
}

// statusOf maps a session error to a gRPC status.
func statusOf(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, aggregator.ErrProtocol) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, fmt.Sprint(err))
}
