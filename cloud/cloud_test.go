package cloud

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

// stream is a PeerService_SessionServer over one end of a session.Pipe.
type stream struct {
	grpc.ServerStream
	*session.PipeEnd
}

func (stream) Context() context.Context { return context.Background() }

func newServer(t *testing.T) *Server {
	return newServerWith(t, Config{MaxSessions: 1, MaxQueue: -1})
}

func newServerWith(t *testing.T, cfg Config) *Server {
	cfg.SideConfig = session.SideConfig{Model: fake.New(fake.Config{Vocab: 300}), Decoder: decoder.Options{MaxPassages: 2, CtxPerSeq: 256},
		Limits: session.Limits{MaxTokens: 32, MaxPassages: 2, MaxPrompt: 100}, Defaults: session.Defaults{MaxTokens: 8}}
	s, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// open runs a Session against the server and returns the device's end,
// with the handshake done, and the handler's result.
func open(t *testing.T, s *Server) (*session.PipeEnd, <-chan error) {
	dev, cld := session.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- s.Session(stream{PipeEnd: cld})
		cld.Close()
	}()
	hello := session.NewHello(fake.New(fake.Config{Vocab: 300}).Info(), aggregator.Device, profiler.DecodeFit{})
	_, err := session.Handshake(context.Background(), dev, hello)
	require.NoError(t, err)
	return dev, done
}

func begin(t *testing.T, c *session.PipeEnd, b *dragonv1.Begin) {
	require.NoError(t, c.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: b}}))
}

// refusal reads until the cloud's Error and returns its code.
func refusal(t *testing.T, c *session.PipeEnd) codes.Code {
	for {
		m, err := c.Recv()
		if err == io.EOF {
			t.Fatal("stream ended without an Error")
		}
		require.NoError(t, err)
		if e := m.GetError(); e != nil {
			return codes.Code(e.GetCode())
		}
	}
}

func TestSessionRefusals(t *testing.T) {
	s := newServer(t)
	for name, c := range map[string]struct {
		b    *dragonv1.Begin
		code codes.Code
	}{
		"empty query":        {&dragonv1.Begin{SessionId: 1}, codes.InvalidArgument},
		"device-only":        {&dragonv1.Begin{SessionId: 1, Query: "q", Mode: dragonv1.Mode_MODE_DEVICE_ONLY}, codes.InvalidArgument},
		"unknown mode":       {&dragonv1.Begin{SessionId: 1, Query: "q", Mode: 42}, codes.InvalidArgument},
		"too many tokens":    {&dragonv1.Begin{SessionId: 1, Query: "q", Sampling: &dragonv1.SamplingParams{MaxTokens: 33}}, codes.InvalidArgument},
		"bad codec top-p":    {&dragonv1.Begin{SessionId: 1, Query: "q", CodecTopP: -0.5}, codes.InvalidArgument},
		"unknown first side": {&dragonv1.Begin{SessionId: 1, Query: "q", Aggregator: 7}, codes.InvalidArgument},
	} {
		dev, done := open(t, s)
		begin(t, dev, c.b)
		assert.Equal(t, c.code, refusal(t, dev), name)
		assert.Equal(t, c.code, status.Code(<-done), name)
	}

	// Not a Begin after the Hello.
	dev, done := open(t, s)
	require.NoError(t, dev.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Ping{Ping: &dragonv1.Ping{}}}))
	assert.Equal(t, codes.InvalidArgument, refusal(t, dev))
	assert.Equal(t, codes.InvalidArgument, status.Code(<-done))

	// All slots busy and no queue: retry later.
	slot, ok := s.exec.TryAcquire()
	require.True(t, ok)
	dev, done = open(t, s)
	begin(t, dev, &dragonv1.Begin{SessionId: 2, Query: "q"})
	assert.Equal(t, codes.ResourceExhausted, refusal(t, dev))
	<-done
	s.exec.Release(slot)
}

// TestAdmissionQueue: a session waits in the queue for a slot and gets it
// when one frees; one that waits longer than the queue timeout is refused.
func TestAdmissionQueue(t *testing.T) {
	s := newServerWith(t, Config{MaxSessions: 1, MaxQueue: 1, QueueTimeout: 300 * time.Millisecond})
	slot, ok := s.exec.TryAcquire()
	require.True(t, ok)
	dev, done := open(t, s)
	begin(t, dev, &dragonv1.Begin{SessionId: 3, Query: "q", Mode: dragonv1.Mode_MODE_CONTEXT})
	assert.Equal(t, codes.ResourceExhausted, refusal(t, dev), "waited too long")
	<-done

	dev, done = open(t, s)
	begin(t, dev, &dragonv1.Begin{SessionId: 4, Query: "q", Mode: dragonv1.Mode_MODE_CONTEXT})
	time.Sleep(50 * time.Millisecond)
	s.exec.Release(slot)
	m, err := dev.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetPassages(), "served once the slot freed")
	require.NoError(t, dev.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Cancel{Cancel: &dragonv1.Cancel{SessionId: 4}}}))
	require.NoError(t, <-done)
}

// TestHandshakeRefusesOtherModel: a device with another model is told why.
func TestHandshakeRefusesOtherModel(t *testing.T) {
	s := newServer(t)
	dev, cld := session.Pipe()
	done := make(chan error, 1)
	go func() { done <- s.Session(stream{PipeEnd: cld}) }()
	hello := session.NewHello(fake.New(fake.Config{Vocab: 400}).Info(), aggregator.Device, profiler.DecodeFit{})
	_, err := session.Handshake(context.Background(), dev, hello)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Equal(t, codes.FailedPrecondition, status.Code(<-done))
	dev.Close()
}
