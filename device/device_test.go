package device

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/cloud"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// No test may leave a goroutine behind: a client gone mid-stream, a cloud
// that cannot be reached and fallbacks all end everything they started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

// recorder is a DeviceService_GenerateServer that keeps what is sent.
type recorder struct {
	grpc.ServerStream
	ctx  context.Context
	sent []*dragonv1.GenerateResponse
}

func (r *recorder) Send(m *dragonv1.GenerateResponse) error { r.sent = append(r.sent, m); return nil }
func (r *recorder) Context() context.Context                { return r.ctx }

// syncRecorder records a stream that another goroutine reads while it
// runs; first gets the first message.
type syncRecorder struct {
	grpc.ServerStream
	ctx   context.Context
	mu    sync.Mutex
	sent  []*dragonv1.GenerateResponse
	first chan *dragonv1.GenerateResponse
}

func (r *syncRecorder) Send(m *dragonv1.GenerateResponse) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) == 0 {
		r.first <- m
	}
	r.sent = append(r.sent, m)
	return nil
}

func (r *syncRecorder) Context() context.Context { return r.ctx }

func (r *syncRecorder) all() []*dragonv1.GenerateResponse {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

func (r *recorder) text() string {
	s := ""
	for _, m := range r.sent {
		s += m.GetChunk().GetText()
	}
	return s
}

func toks(t *testing.T, m engine.Model, s string) []engine.Token {
	out, err := m.Tokenize(s, false, false)
	require.NoError(t, err)
	return out
}

// TestChunkerStopStrings: text that may begin a stop string is held back
// until it cannot, and the answer ends where the stop string starts.
func TestChunkerStopStrings(t *testing.T) {
	m := fake.New(fake.Config{Vocab: 300})
	cases := []struct {
		name, text string
		stop       []string
		want       string
		stopped    bool
	}{
		{"no stop", "hello world", nil, "hello world", false},
		{"stop in the middle", "hello END world", []string{"END"}, "hello ", true},
		{"near miss is released", "hello ENx world", []string{"END"}, "hello ENx world", false},
		{"earliest of two", "a.b;c", []string{";", "."}, "a", true},
		{"multi-byte text", "héllo wörld", nil, "héllo wörld", false},
	}
	for _, c := range cases {
		rec := &recorder{ctx: context.Background()}
		ch := newChunker(m, c.stop, rec.Send)
		stopped := false
		for i, tok := range toks(t, m, c.text) {
			s, err := ch.emit(i, tok)
			require.NoError(t, err)
			if s {
				stopped = true
				break
			}
			// Nothing sent may run into a stop string.
			for _, stop := range c.stop {
				assert.NotContains(t, rec.text(), stop, c.name)
			}
		}
		require.NoError(t, ch.flush())
		assert.Equal(t, c.want, rec.text(), c.name)
		assert.Equal(t, c.want, ch.text.String(), c.name)
		assert.Equal(t, c.stopped, stopped, c.name)
	}
}

// TestGenerateDeviceOnlyAndRefusals: a device without a cloud answers
// device-only requests, streams chunks and a summary, and refuses what it
// cannot serve with the right status.
func TestGenerateDeviceOnlyAndRefusals(t *testing.T) {
	m := fake.New(fake.Config{Seed: 3, Vocab: 300})
	srv, err := New(Config{SideConfig: session.SideConfig{
		Model: m, Decoder: decoder.Options{MaxPassages: 2, CtxPerSeq: 256},
		Limits:   session.Limits{MaxTokens: 64, MaxPassages: 2, MaxPrompt: 100},
		Defaults: session.Defaults{MaxTokens: 16, Mode: dragonv1.Mode_MODE_DEVICE_ONLY},
	}})
	require.NoError(t, err)
	defer srv.Close()
	rec := &recorder{ctx: context.Background()}
	require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?"}, rec))
	last := rec.sent[len(rec.sent)-1].GetSummary()
	require.NotNil(t, last)
	assert.Equal(t, dragonv1.Mode_MODE_DEVICE_ONLY, last.GetMode())
	assert.Equal(t, rec.text(), last.GetText())
	assert.LessOrEqual(t, last.GetTokens(), uint32(16))
	assert.Positive(t, last.GetTokens())

	for name, c := range map[string]struct {
		req  *dragonv1.GenerateRequest
		code codes.Code
	}{
		"needs the cloud":      {&dragonv1.GenerateRequest{Prompt: "hi", Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}, codes.FailedPrecondition},
		"empty prompt":         {&dragonv1.GenerateRequest{}, codes.InvalidArgument},
		"oversized prompt":     {&dragonv1.GenerateRequest{Prompt: string(make([]byte, 101))}, codes.InvalidArgument},
		"too many tokens":      {&dragonv1.GenerateRequest{Prompt: "hi", Sampling: &dragonv1.SamplingParams{MaxTokens: 65}}, codes.InvalidArgument},
		"too many passages":    {&dragonv1.GenerateRequest{Prompt: "hi", PassagesDevice: 3}, codes.InvalidArgument},
		"negative temperature": {&dragonv1.GenerateRequest{Prompt: "hi", Sampling: &dragonv1.SamplingParams{Temperature: -1}}, codes.InvalidArgument},
		"empty stop string":    {&dragonv1.GenerateRequest{Prompt: "hi", Sampling: &dragonv1.SamplingParams{Stop: []string{""}}}, codes.InvalidArgument},
		"unknown strategy":     {&dragonv1.GenerateRequest{Prompt: "hi", Strategy: 9}, codes.InvalidArgument},
	} {
		err := srv.Generate(c.req, &recorder{ctx: context.Background()})
		assert.Equal(t, c.code, status.Code(err), "%s: %v", name, err)
	}

	// One generation at a time; the next waits in a short queue, and one
	// past its end is refused with a time to retry after.
	srv.busy <- struct{}{}
	srv.cfg.MaxQueue = 1
	queued := &syncRecorder{ctx: context.Background(), first: make(chan *dragonv1.GenerateResponse, 1)}
	done := make(chan error, 1)
	go func() { done <- srv.Generate(&dragonv1.GenerateRequest{Prompt: "hi", Progress: true}, queued) }()
	first := <-queued.first
	assert.Equal(t, dragonv1.ProgressPhase_PROGRESS_PHASE_QUEUED, first.GetProgress().GetPhase())
	assert.Equal(t, uint32(1), first.GetProgress().GetQueuePosition())
	err = srv.Generate(&dragonv1.GenerateRequest{Prompt: "hi"}, &recorder{ctx: context.Background()})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "past the queue: %v", err)
	_, ok := wire.RetryAfter(err)
	assert.True(t, ok, "with a time to retry after")
	<-srv.busy
	require.NoError(t, <-done, "the queued one ran once the slot was free")
	var phases []dragonv1.ProgressPhase
	for _, m := range queued.all() {
		if p := m.GetProgress(); p != nil {
			phases = append(phases, p.GetPhase())
		}
	}
	assert.Equal(t, []dragonv1.ProgressPhase{dragonv1.ProgressPhase_PROGRESS_PHASE_QUEUED,
		dragonv1.ProgressPhase_PROGRESS_PHASE_RETRIEVING, dragonv1.ProgressPhase_PROGRESS_PHASE_PREFILLING}, phases)
	assert.NotNil(t, queued.all()[len(queued.all())-1].GetSummary())

	// A wait in the queue is bounded.
	srv.busy <- struct{}{}
	srv.cfg.QueueTimeout = 50 * time.Millisecond
	err = srv.Generate(&dragonv1.GenerateRequest{Prompt: "hi"}, &recorder{ctx: context.Background()})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	<-srv.busy
	// Without asking, no progress.
	rec = &recorder{ctx: context.Background()}
	require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?"}, rec))
	for _, m := range rec.sent {
		assert.Nil(t, m.GetProgress())
	}

	h, err := srv.Health(context.Background(), &dragonv1.HealthRequest{})
	require.NoError(t, err)
	assert.False(t, h.GetCloudConnected())
	st, err := srv.Stats(context.Background(), &dragonv1.StatsRequest{})
	require.NoError(t, err)
	assert.Equal(t, uint64(3), st.GetGenerations(), "the first, the queued one and the last")
}

// dragonDevice is a device (fake model, dragon mode by default) whose
// cloud is at addr; the test closes it.
func dragonDevice(t *testing.T, addr string, stall time.Duration) *Server {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	srv, err := New(Config{SideConfig: session.SideConfig{
		Model: fake.New(fake.Config{Seed: 3, Vocab: 300}), Decoder: decoder.Options{MaxPassages: 2, CtxPerSeq: 256},
		Limits: session.Limits{MaxTokens: 64, MaxPassages: 2, MaxPrompt: 100}, Defaults: session.Defaults{MaxTokens: 12, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION},
	}, Peer: dragonv1.NewPeerServiceClient(conn), StallTimeout: stall})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// TestUnreachableCloudAnswersAlone: with the cloud away, a dragon request
// is answered from the device's passages, flagged as a fallback in the
// first chunk and in the summary.
func TestUnreachableCloudAnswersAlone(t *testing.T) {
	srv := dragonDevice(t, "127.0.0.1:1", 0)
	rec := &recorder{ctx: context.Background()}
	require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?"}, rec))
	require.Greater(t, len(rec.sent), 1)
	assert.True(t, rec.sent[0].GetChunk().GetFallback(), "the first chunk says the device answers alone")
	sum := rec.sent[len(rec.sent)-1].GetSummary()
	assert.True(t, sum.GetFallback())
	assert.Zero(t, sum.GetFallbackStep())
	assert.Contains(t, sum.GetFallbackReason(), "cloud")
	assert.Equal(t, dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, sum.GetMode(), "the mode asked for")
	assert.Positive(t, sum.GetTokens())
}

// otherModelCloud answers every session with the Hello of another model,
// but only after the device's Begin has arrived: it records whether the
// device sent its Begin without waiting for the cloud's Hello.
type otherModelCloud struct {
	dragonv1.UnimplementedPeerServiceServer
	beganFirst chan bool
}

func (c *otherModelCloud) Session(stream grpc.BidiStreamingServer[dragonv1.PeerMessage, dragonv1.PeerMessage]) error {
	hello, err := stream.Recv()
	if err != nil {
		return err
	}
	got := make(chan *dragonv1.PeerMessage, 1)
	go func() {
		m, _ := stream.Recv()
		got <- m
	}()
	select {
	case m := <-got:
		c.beganFirst <- m.GetBegin() != nil
	case <-time.After(5 * time.Second):
		c.beganFirst <- false
	}
	other := proto.Clone(hello.GetHello()).(*dragonv1.Hello)
	other.ModelFingerprint, other.Side = "another-model", dragonv1.Side_SIDE_CLOUD
	return stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Hello{Hello: other}})
}

// TestBeginTravelsWithHelloAndRefusalFallsBack: the device sends its Begin
// right behind its Hello (the cloud starts half a round trip after the
// question), prefills meanwhile, and when the cloud turns out to run
// another model answers alone, saying why.
func TestBeginTravelsWithHelloAndRefusalFallsBack(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cloud := &otherModelCloud{beganFirst: make(chan bool, 1)}
	gs := grpc.NewServer()
	dragonv1.RegisterPeerServiceServer(gs, cloud)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	srv := dragonDevice(t, lis.Addr().String(), 0)
	rec := &recorder{ctx: context.Background()}
	require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?"}, rec))
	assert.True(t, <-cloud.beganFirst, "the Begin arrived before the cloud's Hello was sent")
	sum := rec.sent[len(rec.sent)-1].GetSummary()
	assert.True(t, sum.GetFallback())
	assert.Contains(t, sum.GetFallbackReason(), "fingerprint")
	assert.Positive(t, sum.GetTokens())
	assert.Equal(t, rec.text(), sum.GetText())
}

// silentCloud accepts sessions and never says a word.
type silentCloud struct {
	dragonv1.UnimplementedPeerServiceServer
}

func (silentCloud) Session(stream grpc.BidiStreamingServer[dragonv1.PeerMessage, dragonv1.PeerMessage]) error {
	<-stream.Context().Done()
	return nil
}

// TestSilentCloudAtHandshakeFallsBack: a cloud that takes the stream but
// never answers the Hello holds the answer up for the stall timeout only.
func TestSilentCloudAtHandshakeFallsBack(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	dragonv1.RegisterPeerServiceServer(gs, silentCloud{})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	srv := dragonDevice(t, lis.Addr().String(), 300*time.Millisecond)
	rec := &recorder{ctx: context.Background()}
	start := time.Now()
	require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?"}, rec))
	assert.Less(t, time.Since(start), 5*time.Second)
	sum := rec.sent[len(rec.sent)-1].GetSummary()
	assert.True(t, sum.GetFallback())
	assert.Contains(t, sum.GetFallbackReason(), "handshake")
	assert.Positive(t, sum.GetTokens())
}

// fullCloud is a cloud (fake model) of one session slot, a queue of one
// and the given queue timeout, with its slot taken by a session that
// never ends; it returns the cloud's address.
func fullCloud(t *testing.T, queue time.Duration) string {
	t.Helper()
	addr := oneSlotCloud(t, fake.Config{Seed: 5, Vocab: 300}, func(c *cloud.Config) { c.QueueTimeout = queue })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	hog, err := dragonv1.NewPeerServiceClient(conn).Session(ctx)
	require.NoError(t, err)
	hello := session.NewHello(fake.New(fake.Config{Vocab: 300}).Info(), aggregator.Device, profiler.DecodeFit{})
	_, err = session.Handshake(ctx, hog, hello)
	require.NoError(t, err)
	// A context-mode session holds its slot until it is cancelled.
	require.NoError(t, hog.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: &dragonv1.Begin{
		SessionId: 1, Query: "q", Mode: dragonv1.Mode_MODE_CONTEXT}}}))
	m, err := hog.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetPassages(), "the first session has the slot")
	return addr
}

// oneSlotCloud serves a real cloud.Server of one session slot on the fake
// model, its config changed by set, on loopback, and returns its address.
func oneSlotCloud(t *testing.T, model fake.Config, set func(*cloud.Config)) string {
	t.Helper()
	cfg := cloud.Config{SideConfig: session.SideConfig{
		Model: fake.New(model), Decoder: decoder.Options{MaxPassages: 2, CtxPerSeq: 256},
		Limits: session.Limits{MaxTokens: 64, MaxPassages: 2, MaxPrompt: 100}, Defaults: session.Defaults{MaxTokens: 12},
	}, MaxSessions: 1, MaxQueue: 1}
	set(&cfg)
	srv, err := cloud.New(cfg)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	dragonv1.RegisterPeerServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); srv.Close() })
	return lis.Addr().String()
}

// TestCloudSessionTimeoutEndsWithTheDeviceAlone: a generation that
// outlasts the cloud's SessionTimeout is ended by the cloud; the device
// keeps the tokens decided together, finishes alone and says why, and the
// cloud's one slot is free again for the next question.
func TestCloudSessionTimeoutEndsWithTheDeviceAlone(t *testing.T) {
	addr := oneSlotCloud(t, fake.Config{Seed: 5, Vocab: 300, CallLatency: 20 * time.Millisecond}, func(c *cloud.Config) {
		c.SessionTimeout = 400 * time.Millisecond
	})
	srv := dragonDevice(t, addr, 5*time.Second)
	for try := range 2 {
		rec := &recorder{ctx: context.Background()}
		start := time.Now()
		require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?", Sampling: &dragonv1.SamplingParams{MaxTokens: 64}}, rec))
		sum := rec.sent[len(rec.sent)-1].GetSummary()
		assert.True(t, sum.GetFallback(), "try %d", try)
		assert.Positive(t, sum.GetFallbackStep(), "try %d: tokens decided with the cloud before its timeout (the slot was free)", try)
		assert.Contains(t, sum.GetFallbackReason(), "outlasted the session timeout (400ms)", "try %d", try)
		assert.Less(t, time.Since(start), 4*time.Second, "try %d: ended by the cloud's timeout, not the device's stall timeout", try)
	}
}

// TestFullCloudRefusesBeforeTheDeviceGivesUp: at a full cloud a device's
// session waits in the cloud's queue. With the defaults' order (the
// queue's wait half the device's stall timeout) the cloud refuses first,
// and the answer, given alone, says the cloud was full; the other way
// round the device gives up on the silence and can say only that.
func TestFullCloudRefusesBeforeTheDeviceGivesUp(t *testing.T) {
	assert.LessOrEqual(t, 2*cloud.DefaultQueueTimeout, defaultStallTimeout, "the defaults' order")
	stall := defaultStallTimeout / 10
	for name, c := range map[string]struct {
		queue  time.Duration
		reason string
	}{
		"the defaults' order": {cloud.DefaultQueueTimeout / 10, "cloud sessions exhausted"},
		"reversed":            {3 * stall, "decided no step in time"},
	} {
		t.Run(name, func(t *testing.T) {
			srv := dragonDevice(t, fullCloud(t, c.queue), stall)
			rec := &recorder{ctx: context.Background()}
			require.NoError(t, srv.Generate(&dragonv1.GenerateRequest{Prompt: "hello?"}, rec))
			sum := rec.sent[len(rec.sent)-1].GetSummary()
			assert.True(t, sum.GetFallback())
			assert.Contains(t, sum.GetFallbackReason(), c.reason)
			assert.Positive(t, sum.GetTokens())
		})
	}
}
