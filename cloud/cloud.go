// Package cloud is the cloud daemon's peer server: it answers a device's
// Session stream with the same session code the device runs, over its own
// corpus. One generation at a time (a second device is told to retry);
// the multi-session batching server comes later.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// Config configures the cloud side.
type Config struct {
	session.SideConfig
}

// Server serves dragon.v1.PeerService.
type Server struct {
	dragonv1.UnimplementedPeerServiceServer
	cfg   Config
	hello *dragonv1.Hello
	dec   *decoder.Decoder
	busy  chan struct{}
}

// New loads the decoder the server generates with.
func New(cfg Config) (*Server, error) {
	dec, hello, err := cfg.Open(aggregator.Cloud)
	if err != nil {
		return nil, fmt.Errorf("cloud: %w", err)
	}
	return &Server{cfg: cfg, hello: hello, dec: dec, busy: make(chan struct{}, 1)}, nil
}

// Close frees the decoder.
func (s *Server) Close() error { return s.dec.Close() }

// Session implements dragon.v1.PeerService: one generation.
func (s *Server) Session(stream dragonv1.PeerService_SessionServer) error {
	ctx := stream.Context()
	peer, err := session.Handshake(ctx, stream, s.hello)
	if err != nil {
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
	select {
	case s.busy <- struct{}{}:
		defer func() { <-s.busy }()
	default:
		return s.refuse(stream, b.GetSessionId(), wire.ResourceExhausted("cloud generations", 1, 1, 0))
	}
	log := s.cfg.Log.With("session", b.GetSessionId(), "mode", req.Mode.String())
	id := b.GetSessionId()
	opts := req.Options(aggregator.Cloud, id)
	opts.Fits = [2]profiler.DecodeFit{session.FitFromHello(peer), s.cfg.Fit}
	opts.Log, opts.Metrics = log, s.cfg.Metrics
	start := time.Now()
	defer s.cfg.Metrics.Begin()()
	passages, err := s.cfg.Retrieve(ctx, req.Query, req.PassagesCloud)
	if err != nil {
		return s.refuse(stream, id, status.Errorf(codes.Internal, "cloud retrieval: %v", err))
	}
	s.dec.SetSystem(req.System)
	log.Debug("cloud session", "passages", len(passages))
	var sum session.Summary
	switch req.Mode {
	case dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, dragonv1.Mode_MODE_TOKEN_WISE_SYNC:
		sum, err = session.Run(ctx, opts, s.dec, req.Query, passages, stream, nil)
	case dragonv1.Mode_MODE_SEQUENCE_WISE_SYNC:
		err = session.ServeSequenceWise(ctx, opts, s.dec, req.Query, passages, stream)
	case dragonv1.Mode_MODE_CLOUD_ONLY:
		err = session.ServeSolo(ctx, opts, s.dec, req.Query, passages, stream)
	case dragonv1.Mode_MODE_CONTEXT:
		err = session.ServePassages(ctx, id, passages, stream)
	case dragonv1.Mode_MODE_KV:
		err = session.ServeKV(ctx, opts, s.dec, req.Query, passages, stream)
	default:
		return s.refuse(stream, id, status.Errorf(codes.Unimplemented, "mode %v is not served by this cloud", req.Mode))
	}
	s.cfg.Metrics.Observe(session.ModeName(req.Mode), start, sum, err)
	if err != nil && ctx.Err() == nil {
		log.Warn("cloud session failed", "err", err)
		return statusOf(err)
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
