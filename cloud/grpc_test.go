package cloud

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

// serve runs s behind a real gRPC server on loopback and returns its
// address.
func serve(t *testing.T, s *Server, cfg wire.Config) string {
	cfg.Insecure = true
	opts, err := cfg.ServerOptions()
	require.NoError(t, err)
	g := grpc.NewServer(opts...)
	dragonv1.RegisterPeerServiceServer(g, s)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, cfg wire.Config) *grpc.ClientConn {
	cfg.Insecure = true
	opts, err := cfg.DialOptions()
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

var deviceHello = session.NewHello(fake.New(fake.Config{Vocab: 300}).Info(), aggregator.Device, profiler.DecodeFit{})

// cloudOnly asks for one cloud-only answer over conn, as a device does.
func cloudOnly(ctx context.Context, conn *grpc.ClientConn, id uint64, query string) ([]int32, error) {
	stream, err := dragonv1.NewPeerServiceClient(conn).Session(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.CloseSend() }()
	if _, err := session.Handshake(ctx, stream, deviceHello); err != nil {
		return nil, err
	}
	b := &dragonv1.Begin{SessionId: id, Query: query, Mode: dragonv1.Mode_MODE_CLOUD_ONLY, Sampling: &dragonv1.SamplingParams{MaxTokens: 16}}
	if err := stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: b}}); err != nil {
		return nil, err
	}
	sum, err := session.ReceiveSolo(ctx, session.Options{Self: aggregator.Device, SessionID: id, MaxTokens: 16}, stream, nil)
	return sum.Tokens, err
}

// slotFree reports whether a session slot can be had right now.
func slotFree(s *Server) bool {
	slot, ok := s.exec.TryAcquire()
	if ok {
		s.exec.Release(slot)
	}
	return ok
}

// blackhole is a TCP proxy that can stop delivering bytes either way
// without closing anything: what a peer that vanished (a phone out of
// coverage, a pulled cable) looks like from the other end.
type blackhole struct {
	lis    net.Listener
	dead   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	copies sync.WaitGroup
}

func newBlackhole(t *testing.T, upstream string) *blackhole {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &blackhole{lis: lis}
	go func() {
		for {
			down, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, down, up)
			b.mu.Unlock()
			b.copies.Add(2)
			go b.pump(up, down)
			go b.pump(down, up)
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) pump(dst, src net.Conn) {
	defer b.copies.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if b.dead.Load() {
			continue // swallowed
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (b *blackhole) close() {
	b.lis.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.copies.Wait()
}

// TestVanishedDeviceFreesItsSession: a device that stops answering mid
// session, its connection still open, loses its slot to the server's
// keepalive within Time + Timeout.
func TestVanishedDeviceFreesItsSession(t *testing.T) {
	s := newServer(t) // one slot, no queue
	ka := wire.Keepalive{Time: time.Second, Timeout: 500 * time.Millisecond}
	hole := newBlackhole(t, serve(t, s, wire.Config{Keepalive: ka}))
	// The device's own keepalive is slow so that the server finds out first.
	conn := dial(t, hole.lis.Addr().String(), wire.Config{Keepalive: wire.Keepalive{Time: time.Minute}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := dragonv1.NewPeerServiceClient(conn).Session(ctx)
	require.NoError(t, err)
	_, err = session.Handshake(ctx, stream, deviceHello)
	require.NoError(t, err)
	// Context mode holds the session open until the device says it is done.
	require.NoError(t, stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: &dragonv1.Begin{SessionId: 7, Query: "q", Mode: dragonv1.Mode_MODE_CONTEXT}}}))
	m, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetPassages())
	require.False(t, slotFree(s), "the session holds the only slot")

	hole.dead.Store(true)
	gone := time.Now()
	require.Eventually(t, func() bool { return slotFree(s) }, 10*time.Second, 20*time.Millisecond,
		"the slot of a vanished device is freed by keepalive")
	assert.Less(t, time.Since(gone), ka.Time+ka.Timeout+2*time.Second)
	cancel()
}

// TestHostilePeersHarmNoOtherSession: while one device is being answered,
// others send bytes that are no message at all, messages out of place and
// drafts for a session they do not have; each of those streams ends with
// an error, and the honest answer is the one it gets alone.
func TestHostilePeersHarmNoOtherSession(t *testing.T) {
	s := newServerWith(t, Config{MaxSessions: 3, MaxQueue: -1})
	addr := serve(t, s, wire.Config{})
	conn := dial(t, addr, wire.Config{})
	ctx := context.Background()
	alone, err := cloudOnly(ctx, conn, 1, "what is in the passage?")
	require.NoError(t, err)
	require.NotEmpty(t, alone)

	hostile := map[string]func() error{
		"bytes that are no message": func() error {
			st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
				dragonv1.PeerService_Session_FullMethodName, grpc.ForceCodec(rawCodec{}))
			if err != nil {
				return err
			}
			if err := st.SendMsg([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}); err != nil {
				return err
			}
			var out []byte
			for {
				if err := st.RecvMsg(&out); err != nil {
					return err
				}
			}
		},
		"drafts instead of a hello": func() error {
			st, err := dragonv1.NewPeerServiceClient(conn).Session(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Drafts{Drafts: &dragonv1.Drafts{SessionId: 1}}}); err != nil {
				return err
			}
			return drain(st)
		},
		"verdicts for a session it does not have": func() error {
			st, err := dragonv1.NewPeerServiceClient(conn).Session(ctx)
			if err != nil {
				return err
			}
			if _, err := session.Handshake(ctx, st, deviceHello); err != nil {
				return err
			}
			b := &dragonv1.Begin{SessionId: 9, Query: "q", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}
			if err := st.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: b}}); err != nil {
				return err
			}
			v := &dragonv1.Verdicts{SessionId: 10, Verdicts: []*dragonv1.Verdict{{Step: 1 << 40, TargetToken: 1 << 30, EpochCloud: 99}}}
			if err := st.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Verdicts{Verdicts: v}}); err != nil {
				return err
			}
			return drain(st)
		},
	}

	stream, err := dragonv1.NewPeerServiceClient(conn).Session(ctx)
	require.NoError(t, err)
	_, err = session.Handshake(ctx, stream, deviceHello)
	require.NoError(t, err)
	b := &dragonv1.Begin{SessionId: 2, Query: "what is in the passage?", Mode: dragonv1.Mode_MODE_CLOUD_ONLY, Sampling: &dragonv1.SamplingParams{MaxTokens: 16}}
	require.NoError(t, stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: b}}))
	for name, attack := range hostile {
		err := attack()
		code := status.Code(err)
		assert.Contains(t, []codes.Code{codes.InvalidArgument, codes.Internal, codes.FailedPrecondition}, code, "%s: %v", name, err)
	}
	sum, err := session.ReceiveSolo(ctx, session.Options{Self: aggregator.Device, SessionID: 2, MaxTokens: 16}, stream, nil)
	require.NoError(t, err)
	assert.Equal(t, alone, sum.Tokens, "the honest session is untouched")
	require.NoError(t, stream.CloseSend())

	again, err := cloudOnly(ctx, conn, 3, "what is in the passage?")
	require.NoError(t, err)
	assert.Equal(t, alone, again, "the cloud still serves")
	require.Eventually(t, func() bool { return slotFree(s) && s.waiting.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
}

// drain reads a stream until it ends and returns how.
func drain(st dragonv1.PeerService_SessionClient) error {
	for {
		if _, err := st.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// rawCodec sends bytes as they are, to put a broken message on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = data
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestPeerTokens: with a token set, streams without it or with another
// one are refused as unauthenticated and the right one is served.
func TestPeerTokens(t *testing.T) {
	s := newServer(t)
	addr := serve(t, s, wire.Config{Token: "s3cret"})
	for name, c := range map[string]struct {
		token string
		code  codes.Code
	}{
		"missing": {"", codes.Unauthenticated},
		"wrong":   {"guess", codes.Unauthenticated},
		"right":   {"s3cret", codes.OK},
	} {
		conn := dial(t, addr, wire.Config{Token: c.token})
		toks, err := cloudOnly(context.Background(), conn, 1, "q")
		assert.Equal(t, c.code, status.Code(err), name)
		if c.code == codes.OK {
			assert.NotEmpty(t, toks, name)
		}
		conn.Close()
	}
}
