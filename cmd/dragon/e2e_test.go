package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/netsim"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// The test binary doubles as the dragon binary: with DRAGON_CHILD_ARGS set
// it runs the command line they hold, so the end-to-end tests start real
// daemon processes without a separate build.
func TestMain(m *testing.M) {
	if args := os.Getenv("DRAGON_CHILD_ARGS"); args != "" {
		os.Args = append([]string{"dragon"}, strings.Split(args, "\n")...)
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "dragon:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startDaemon runs `dragon args...` from this test binary and waits until
// it serves; it is stopped (and must stop cleanly) when the test ends.
func startDaemon(t *testing.T, name string, args ...string) *aggbench.Daemon {
	t.Helper()
	d, err := aggbench.StartDaemon(name, "", []string{"DRAGON_CHILD_ARGS=" + strings.Join(args, "\n")}, os.Args[0])
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Stop(30*time.Second), "%s stops cleanly on SIGTERM", name) })
	return d
}

// pair starts a cloud and a device on loopback, one thread each; with
// latency > 0 the device reaches the cloud through a netsim proxy.
func pair(t *testing.T, latency time.Duration) (dragonv1.DeviceServiceClient, *aggbench.Daemon, *aggbench.Daemon) {
	return pairWith(t, latency, nil, nil, nil)
}

// pairWith is pair with more flags for each daemon; link, when not nil,
// stands between the device and the cloud (after netsim) and returns the
// address the device dials.
func pairWith(t *testing.T, latency time.Duration, cloudArgs, deviceArgs []string, link func(cloudAddr string) string) (dragonv1.DeviceServiceClient, *aggbench.Daemon, *aggbench.Daemon) {
	model := testmodel.Path(t)
	return pairOfModels(t, latency, model, model, cloudArgs, deviceArgs, link)
}

// pairOfModels is pairWith with each side's model file.
func pairOfModels(t *testing.T, latency time.Duration, cloudModel, deviceModel string, cloudArgs, deviceArgs []string, link func(cloudAddr string) string) (dragonv1.DeviceServiceClient, *aggbench.Daemon, *aggbench.Daemon) {
	cld := startDaemon(t, "cloud", append([]string{"cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", cloudModel, "--threads", "1",
		"--index", testmodel.IndexDir(t, "cloud"), "--profile", "", "--rerank-model", ""}, cloudArgs...)...)
	cloudAddr := cld.Addr
	if latency > 0 {
		cloudAddr = shapedLink(t, cld.Addr, netsim.Shape{Latency: latency, Jitter: latency / 5})
	}
	if link != nil {
		cloudAddr = link(cloudAddr)
	}
	dev := startDaemon(t, "device", append([]string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", deviceModel, "--threads", "1",
		"--index", testmodel.IndexCopy(t, "device"), "--cloud", cloudAddr, "--profile", "", "--rerank-model", ""}, deviceArgs...)...)
	conn, err := grpc.NewClient(dev.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return dragonv1.NewDeviceServiceClient(conn), dev, cld
}

// shapedLink is a netsim proxy to addr with the shape's delays, stopped
// with the test; it returns the proxy's address.
func shapedLink(t *testing.T, addr string, shape netsim.Shape) string {
	t.Helper()
	link, err := netsim.NewLink(shape, 1)
	require.NoError(t, err)
	p, err := netsim.NewProxy("127.0.0.1:0", addr, link, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return p.Addr()
}

func ask(t *testing.T, c dragonv1.DeviceServiceClient, req *dragonv1.GenerateRequest) (aggbench.Answer, error) {
	t.Helper()
	return aggbench.Ask(context.Background(), c, req)
}

// TestTwoDaemonsAnswer: a cloud and a device process answer a question
// that needs both corpora, over real gRPC on loopback.
func TestTwoDaemonsAnswer(t *testing.T) {
	client, dev, cld := pair(t, 0)
	a, err := ask(t, client, &dragonv1.GenerateRequest{Prompt: promptset.DemoQuestion, Sampling: &dragonv1.SamplingParams{MaxTokens: 32}})
	require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
	s := a.Summary
	require.NotNil(t, s)
	t.Logf("%q\n%v", a.Text, s)
	assert.NotEmpty(t, strings.TrimSpace(a.Text))
	assert.Equal(t, s.GetText(), a.Text)
	assert.Equal(t, dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, s.GetMode())
	assert.Equal(t, uint32(len(a.Tokens)), s.GetTokens())
	assert.Equal(t, uint32(2), s.GetPassagesDevice())
	assert.Equal(t, uint32(2), s.GetPassagesCloud())
	assert.Positive(t, s.GetBytesSent())
	assert.Positive(t, s.GetBytesReceived())
	assert.Positive(t, s.GetAcceptanceRateDevice()+s.GetAcceptanceRateCloud(), "drafts were accepted")
	assert.Positive(t, s.GetTtft().AsDuration())
	decided := s.GetStepsAggregatedDevice() + s.GetStepsAggregatedCloud()
	assert.GreaterOrEqual(t, decided, uint64(len(a.Tokens)), "every token was decided by an aggregator")

	// Bad input is refused with the right status, and the daemon serves on.
	for name, req := range map[string]*dragonv1.GenerateRequest{
		"empty prompt": {Prompt: ""},
		"unknown mode": {Prompt: "hi", Mode: 99},
		"bad sampling": {Prompt: "hi", Sampling: &dragonv1.SamplingParams{TopP: 3}},
		"too long":     {Prompt: "hi", Sampling: &dragonv1.SamplingParams{MaxTokens: 100000}},
		"codec top-p":  {Prompt: "hi", CodecTopP: 1.5},
	} {
		_, err := ask(t, client, req)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
	a, err = ask(t, client, &dragonv1.GenerateRequest{Prompt: "Say hello.", Mode: dragonv1.Mode_MODE_TOKEN_WISE_SYNC, Sampling: &dragonv1.SamplingParams{MaxTokens: 4}})
	require.NoError(t, err)
	assert.NotEmpty(t, a.Tokens, "still serving")
}

// TestRealGreedyDragonEqualsTokenWise: on the real model, over a link of
// 15 ms each way with jitter, greedy DRAGON with the aggregator forced to
// switch sides every 3 steps emits exactly the tokens greedy token-wise
// synchronisation does, for 10 questions.
func TestRealGreedyDragonEqualsTokenWise(t *testing.T) {
	client, dev, cld := pair(t, 15*time.Millisecond)
	var switches uint32
	var stale uint64
	for i, q := range promptset.Questions[:10] {
		dr := greedyDragonEqualsTW(t, client, dev, cld, i, q, 24)
		switches += dr.Summary.GetAggregatorSwitches()
		stale += dr.Summary.GetStaleDrafts()
		t.Logf("%d: %d tokens, %d switches, %d stale drafts, acceptance %.2f/%.2f: %q", i, len(dr.Tokens),
			dr.Summary.GetAggregatorSwitches(), dr.Summary.GetStaleDrafts(), dr.Summary.GetAcceptanceRateDevice(), dr.Summary.GetAcceptanceRateCloud(), dr.Text)
	}
	assert.Greater(t, switches, uint32(10), "the aggregator moved")
}

// TestRealHedgedDragonEqualsTokenWise: on the real model, with both
// daemons hedging every draft below probability 0.9 (two branches each)
// and the cloud aggregating, so that the device, whose drafts the mixture
// rejects more often, hedges, greedy dragon emits exactly greedy
// token-wise's tokens over a link of 0 and 150 ms each way with jitter.
// Token-wise waits for both sides at every token, so its answer does not
// depend on the link: it is asked over the 0 ms link only (at 150 ms it
// would wait 6 s an answer for the same tokens).
// Whether a rejection lands on a hedge here depends on timing (2 of 3 in
// one run, 0 of 4 in another), so adoptions are only logged; the session
// tests assert them.
func TestRealHedgedDragonEqualsTokenWise(t *testing.T) {
	hedge := []string{"--hedges", "2", "--hedge-below", "0.9"}
	questions := promptset.Questions[:4]
	tws := make([]aggbench.Answer, len(questions))
	var hits, rejected uint64
	for _, latency := range []time.Duration{0, 150 * time.Millisecond} {
		client, dev, cld := pairWith(t, latency, hedge, hedge, nil)
		var hedges uint64
		for i, q := range questions {
			req := func(mode dragonv1.Mode, n uint32) *dragonv1.GenerateRequest {
				return &dragonv1.GenerateRequest{Prompt: q, Mode: mode, MaxHedges: n, HedgeDepth: 128, Strategy: dragonv1.Strategy_STRATEGY_CLOUD,
					Aggregator: dragonv1.Side_SIDE_CLOUD, Sampling: &dragonv1.SamplingParams{MaxTokens: 20}}
			}
			if latency == 0 {
				var err error
				tws[i], err = ask(t, client, req(dragonv1.Mode_MODE_TOKEN_WISE_SYNC, 0))
				require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
				require.NotEmpty(t, tws[i].Tokens, "question %d", i)
			}
			tw := tws[i]
			dr, err := ask(t, client, req(dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, 2))
			require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
			require.False(t, dr.Summary.GetFallback(), "question %d: %s", i, dr.Summary.GetFallbackReason())
			assert.Equal(t, tw.Tokens, dr.Tokens, "%v, question %d: %q\ntw:     %q\ndragon: %q", latency, i, q, tw.Text, dr.Text)
			s := dr.Summary
			hedges += s.GetHedgesDevice() + s.GetHedgesCloud()
			hits += s.GetHedgeHitsDevice() + s.GetHedgeHitsCloud()
			rejected += s.GetRejectedDevice() + s.GetRejectedCloud()
			t.Logf("%v, %d: hedged %d/%d, adopted %d/%d, rejected %d/%d", latency, i, s.GetHedgesDevice(), s.GetHedgesCloud(),
				s.GetHedgeHitsDevice(), s.GetHedgeHitsCloud(), s.GetRejectedDevice(), s.GetRejectedCloud())
		}
		assert.Positive(t, hedges, "%v: drafts were hedged", latency)
	}
	t.Logf("%d of %d rejections adopted a hedge", hits, rejected)
}

// greedyDragonEqualsTW asks question i (q) greedily in token-wise
// synchronisation and in dragon with the aggregator moved every 3 steps,
// checks that both emit the same tokens, and returns dragon's answer.
func greedyDragonEqualsTW(t *testing.T, client dragonv1.DeviceServiceClient, dev, cld *aggbench.Daemon, i int, q string, maxTokens uint32) aggbench.Answer {
	t.Helper()
	req := func(mode dragonv1.Mode, every uint32) *dragonv1.GenerateRequest {
		return &dragonv1.GenerateRequest{Prompt: q, Mode: mode, SwitchEvery: every, Sampling: &dragonv1.SamplingParams{MaxTokens: maxTokens}}
	}
	tw, err := ask(t, client, req(dragonv1.Mode_MODE_TOKEN_WISE_SYNC, 0))
	require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
	// An answer the device finished alone (the cloud stalled past
	// --cloud-timeout, as on a loaded machine) is not the pair's.
	require.False(t, tw.Summary.GetFallback(), "question %d, token-wise: %s", i, tw.Summary.GetFallbackReason())
	dr, err := ask(t, client, req(dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, 3))
	require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
	require.False(t, dr.Summary.GetFallback(), "question %d: %s", i, dr.Summary.GetFallbackReason())
	require.NotEmpty(t, tw.Tokens, "question %d", i)
	assert.Equal(t, tw.Tokens, dr.Tokens, "question %d: %q\ntw:     %q\ndragon: %q", i, q, tw.Text, dr.Text)
	return dr
}

// TestCloudKilledMidAnswer: the cloud process is killed while an answer
// streams; the device finishes it alone and says so; a cloud restarted on
// the same address is used again for the next request.
func TestCloudKilledMidAnswer(t *testing.T) {
	client, dev, cld := pair(t, 0)
	var announced bool
	tokens, sum := demoAnswer(t, client, dev, 160, func(tokens int, c *dragonv1.TokenChunk) {
		announced = announced || c.GetFallback()
		if tokens >= 16 && !cld.Killed() {
			require.NoError(t, cld.Kill())
		}
	})
	require.NotNil(t, sum)
	t.Logf("%d tokens, fell back at %d: %s", sum.GetTokens(), sum.GetFallbackStep(), sum.GetFallbackReason())
	assert.True(t, sum.GetFallback(), "device log:\n%s", dev.Logs())
	assert.True(t, announced, "a chunk says the device goes on alone")
	assert.GreaterOrEqual(t, sum.GetFallbackStep(), uint32(16))
	assert.Equal(t, uint32(tokens), sum.GetTokens(), "no token lost or repeated")
	assert.True(t, sum.GetTokens() == 160 || sum.GetFinishReason() == dragonv1.FinishReason_FINISH_REASON_STOP, "the answer was finished")

	// The cloud comes back on the same address.
	startDaemon(t, "cloud2", "cloud", "--listen", cld.Addr, "--http", "127.0.0.1:0", "--model", testmodel.Path(t), "--threads", "1",
		"--index", testmodel.IndexDir(t, "cloud"), "--profile", "", "--rerank-model", "")
	require.Eventually(t, func() bool {
		a, err := ask(t, client, &dragonv1.GenerateRequest{Prompt: "Say hello.", Sampling: &dragonv1.SamplingParams{MaxTokens: 4}})
		return err == nil && !a.Summary.GetFallback() && a.Summary.GetBytesReceived() > 0
	}, time.Minute, time.Second, "the restarted cloud is used again")
}

// demoAnswer streams the answer to the demo question, calling chunk with
// the tokens so far after each chunk, and returns their count and the
// summary.
func demoAnswer(t *testing.T, client dragonv1.DeviceServiceClient, dev *aggbench.Daemon, maxTokens uint32, chunk func(tokens int, c *dragonv1.TokenChunk)) (int, *dragonv1.GenerateSummary) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, err := client.Generate(ctx, &dragonv1.GenerateRequest{Prompt: promptset.DemoQuestion, Sampling: &dragonv1.SamplingParams{MaxTokens: maxTokens}})
	require.NoError(t, err)
	var tokens int
	var sum *dragonv1.GenerateSummary
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return tokens, sum
		}
		require.NoError(t, err, "device log:\n%s", dev.Logs())
		if c := m.GetChunk(); c != nil {
			tokens += len(c.GetTokens())
			chunk(tokens, c)
		}
		if s := m.GetSummary(); s != nil {
			sum = s
		}
	}
}

// TestCloudDrainsOnSIGTERM: a cloud told to stop mid-answer finishes the
// generations it serves before it exits; the device notices nothing.
func TestCloudDrainsOnSIGTERM(t *testing.T) {
	client, dev, cld := pair(t, 0)
	stopped := make(chan error, 1)
	asked := false
	tokens, sum := demoAnswer(t, client, dev, 48, func(tokens int, _ *dragonv1.TokenChunk) {
		if tokens >= 8 && !asked {
			asked = true
			go func() { stopped <- cld.Stop(time.Minute) }()
		}
	})
	require.True(t, asked, "the answer was long enough to stop the cloud in the middle")
	require.NotNil(t, sum)
	assert.False(t, sum.GetFallback(), "the cloud finished its part: %s\ndevice log:\n%s", sum.GetFallbackReason(), dev.Logs())
	assert.Equal(t, uint32(tokens), sum.GetTokens())
	assert.Positive(t, sum.GetStepsAggregatedCloud()+sum.GetBytesReceived(), "the cloud took part")
	require.NoError(t, <-stopped, "the cloud exits cleanly after draining")
}

// TestConcurrentDevicesShareTheCloud: two device processes ask one cloud at
// the same time; the cloud decodes both sessions' rows in shared passes,
// and each answer is the one it gets alone (greedy).
func TestConcurrentDevicesShareTheCloud(t *testing.T) {
	model := testmodel.Path(t)
	cld := startDaemon(t, "cloud", "cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", testmodel.IndexDir(t, "cloud"), "--profile", "", "--rerank-model", "", "--max-sessions", "2")
	var clients []dragonv1.DeviceServiceClient
	for i := range 2 {
		dev := startDaemon(t, fmt.Sprintf("device%d", i), "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model,
			"--threads", "1", "--index", testmodel.IndexCopy(t, "device"), "--cloud", cld.Addr, "--profile", "", "--rerank-model", "")
		conn, err := grpc.NewClient(dev.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, dragonv1.NewDeviceServiceClient(conn))
	}
	questions := promptset.Questions[:4]
	req := func(q string) *dragonv1.GenerateRequest {
		return &dragonv1.GenerateRequest{Prompt: q, Sampling: &dragonv1.SamplingParams{MaxTokens: 24}}
	}
	alone := make([][]int32, len(questions))
	for i, q := range questions {
		a, err := ask(t, clients[0], req(q))
		require.NoError(t, err)
		alone[i] = a.Tokens
	}
	for i := 0; i < len(questions); i += 2 {
		var wg sync.WaitGroup
		got := make([]aggbench.Answer, 2)
		errs := make([]error, 2)
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[k], errs[k] = aggbench.Ask(context.Background(), clients[k], req(questions[i+k]))
			}()
		}
		wg.Wait()
		for k := range 2 {
			require.NoError(t, errs[k], "cloud log:\n%s", cld.Logs())
			assert.False(t, got[k].Summary.GetFallback())
			assert.Equal(t, alone[i+k], got[k].Tokens, "question %d together and alone", i+k)
		}
	}
	require.Eventually(t, func() bool { return cld.HTTPAddr() != "" }, 10*time.Second, 50*time.Millisecond)
	resp, err := http.Get("http://" + cld.HTTPAddr() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	one := regexp.MustCompile(`dragon_batch_sessions_bucket\{le="1"\} (\d+)`).FindSubmatch(body)
	all := regexp.MustCompile(`dragon_batch_sessions_count (\d+)`).FindSubmatch(body)
	require.NotNil(t, one)
	require.NotNil(t, all)
	t.Logf("passes with one session: %s of %s", one[1], all[1])
	assert.NotEqual(t, string(one[1]), string(all[1]), "some passes carried both sessions' rows")
}
