// Package aggbench measures the two live sides (`dragon bench agg`): a
// cloud and a device daemon as two processes pinned to their own cores
// with one thread each, the device reaching the cloud through a netsim
// link of one-way latency L and jitter L/5, and the per-token latency of
// each mode at each L, medians over a set of questions.
package aggbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/internal/timing"
	"github.com/dragon-rag/dragon/netsim"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// Mode is a mode to measure, as the command line names it, with the
// aggregator placement strategy of dragon mode (0: the daemon's default,
// greedy) and whether its drafts ignore the peer's (Blind).
type Mode struct {
	Name     string
	Mode     dragonv1.Mode
	Strategy dragonv1.Strategy
	Blind    bool
	// Hedges and HedgeDepth, when Hedges > 0, let both sides hedge their
	// drafts (GenerateRequest.max_hedges, hedge_depth).
	Hedges, HedgeDepth int
	// NoSources leaves the answer's sources out (GenerateRequest.
	// omit_sources): what keeping them costs.
	NoSources bool
	// PosteriorEvery, when not nil, is GenerateRequest.posterior_every.
	PosteriorEvery *uint32
}

// Options of a run.
type Options struct {
	// Binary is the dragon binary; Env extra environment for it.
	Binary string
	Env    []string
	// Model is the device's model and, unless CloudModel is set, the
	// cloud's (the two must share a tokenizer).
	Model, CloudModel string
	// DeviceProfile and CloudProfile are the daemons' dragon profile fits
	// (default data/profile-device.json and data/profile-cloud.json, make
	// profile's, fitted to the default model).
	DeviceProfile, CloudProfile string
	// Cloud and device index folders.
	CloudIndex, DeviceIndex string
	Questions               []string
	LatencyMS               []float64
	Modes                   []Mode
	MaxTokens               int
	Passages                int
	// Temperature > 0 samples every answer (seed: the question's index
	// + 1, so that each mode draws the same uniforms); 0 is greedy.
	Temperature float64
	// Extra flags for both daemons.
	DaemonFlags []string
	Log         func(format string, args ...any)
}

// Result is the JSON `dragon bench agg` prints.
type Result struct {
	// PerTokenMS by mode, then by one-way latency: the median over the
	// questions of the time per token after the first.
	PerTokenMS map[string]map[string]float64 `json:"per_token_ms"`
	// TTFTMS likewise.
	TTFTMS map[string]map[string]float64 `json:"ttft_ms"`
	// PerQuestionMS is each question's time per token, by mode and
	// latency, in question order: for ratios of modes paired by question.
	PerQuestionMS map[string]map[string][]float64 `json:"per_question_ms"`
	// PerQuestionTTFTMS likewise for the time to first token.
	PerQuestionTTFTMS map[string]map[string][]float64 `json:"per_question_ttft_ms"`
	// Answers are the answers themselves, likewise (for callers that
	// compare them).
	Answers map[string]map[string][]Answer `json:"-"`
	// Acceptance is the median acceptance rate of each side's drafts in
	// dragon runs.
	Acceptance map[string]float64 `json:"acceptance"`
	// Switches is the median number of aggregator moves per dragon answer.
	Switches float64 `json:"switches"`
	// SecondChoice is, for each side, the share of its rejected drafts (in
	// dragon runs, decided on the device) whose target was the side's
	// second most probable token: what a one-token hedge would catch.
	SecondChoice map[string]float64 `json:"second_choice"`
	// RejectionsPerToken is, for each side, the median over dragon answers
	// of its rejected drafts per answer token: each costs the link a round
	// trip unless it was hedged.
	RejectionsPerToken map[string]float64 `json:"rejections_per_token"`
	// BytesPerToken is the median over dragon answers of the peer stream's
	// bytes per answer token, "up" (device to cloud) and "down".
	BytesPerToken map[string]float64 `json:"bytes_per_token"`
	// HedgeCurve is, for each side and each of aggregator.HedgeThresholds,
	// over the dragon answers' steps decided on the device: the share of
	// the side's drafts whose own probability was below the threshold
	// (the steps a hedge there would cost) and the share of its rejections
	// whose target was the runner-up at such a step (those it would catch).
	HedgeCurve map[string][]HedgePoint `json:"hedge_curve,omitempty"`
	// Counters are, by speculative-aggregation mode, medians over its
	// answers of what each answer token cost the link and how often
	// hedges covered a rejection.
	Counters map[string]Counters `json:"counters,omitempty"`
	// GreedyIdentical counts the answers of speculative-aggregation modes
	// (dragon, dragon-blind, each strategy) that equal tw's for the same
	// question and latency, out of GreedyPrompts: greedy, or sampled with
	// the same seed (the answer depends on the seed only).
	GreedyIdentical int      `json:"greedy_identical"`
	GreedyPrompts   int      `json:"greedy_prompts"`
	Tokens          float64  `json:"median_tokens"`
	Questions       int      `json:"questions"`
	Mismatches      []string `json:"mismatches,omitempty"`
}

// Counters are per-answer-token figures of one mode (medians over its
// answers at every latency).
type Counters struct {
	// RejectionsPerToken by side ("device", "cloud").
	RejectionsPerToken map[string]float64 `json:"rejections_per_token"`
	// HedgesPerToken: hedges each side declared; HedgeHitsPerToken: its
	// rejections that adopted a hedge's branch (no round trip).
	HedgesPerToken    map[string]float64 `json:"hedges_per_token"`
	HedgeHitsPerToken map[string]float64 `json:"hedge_hits_per_token"`
	// HedgeHits is the total over the answers, by side.
	HedgeHits map[string]uint64 `json:"hedge_hits"`
	// BytesPerToken on the peer stream, "up" (device to cloud) and "down".
	BytesPerToken map[string]float64 `json:"bytes_per_token"`
}

type answer struct {
	tokens   []int32
	summary  *dragonv1.GenerateSummary
	perToken float64
}

// Run starts the two daemons, measures, and stops them.
func Run(ctx context.Context, o Options) (Result, error) {
	if len(o.Questions) == 0 || len(o.LatencyMS) == 0 || len(o.Modes) == 0 {
		return Result{}, errors.New("aggbench: need questions, latencies and modes")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	// Relevance is the first stage's unless DaemonFlags ask for a
	// re-ranker (the daemons' default has one).
	common := append([]string{"--threads", "1", "--listen", "127.0.0.1:0", "--http", "", "--passages", strconv.Itoa(o.Passages), "--rerank-model", ""}, o.DaemonFlags...)
	cloudModel := cmp.Or(o.CloudModel, o.Model)
	cloud, err := StartDaemon("cloud", "0", o.Env, append([]string{o.Binary, "cloud", "--model", cloudModel, "--index", o.CloudIndex,
		"--profile", cmp.Or(o.CloudProfile, "data/profile-cloud.json")}, common...)...)
	if err != nil {
		return Result{}, err
	}
	defer cloud.Stop(10 * time.Second)
	link, err := netsim.NewLink(netsim.Shape{}, 1)
	if err != nil {
		return Result{}, err
	}
	proxy, err := netsim.NewProxy("127.0.0.1:0", cloud.Addr, link, nil)
	if err != nil {
		return Result{}, err
	}
	pctx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	go proxy.Serve(pctx)
	device, err := StartDaemon("device", "1", o.Env, append([]string{o.Binary, "device", "--model", o.Model, "--index", o.DeviceIndex,
		"--profile", cmp.Or(o.DeviceProfile, "data/profile-device.json"),
		"--cloud", proxy.Addr(), "--cloud-passages", strconv.Itoa(o.Passages)}, common...)...)
	if err != nil {
		return Result{}, err
	}
	defer device.Stop(10 * time.Second)
	conn, err := grpc.NewClient(device.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	client := dragonv1.NewDeviceServiceClient(conn)

	res := Result{
		PerTokenMS: map[string]map[string]float64{}, TTFTMS: map[string]map[string]float64{}, PerQuestionMS: map[string]map[string][]float64{},
		PerQuestionTTFTMS: map[string]map[string][]float64{}, Answers: map[string]map[string][]Answer{},
		Acceptance: map[string]float64{}, Questions: len(o.Questions),
	}
	var accDev, accCloud, switches, tokens []float64
	var rejDev, rejCloud, bytesUp, bytesDown []float64
	var low, caught [2][len(aggregator.HedgeThresholds)]uint64
	var deviceSteps uint64
	var second, rejected [2]uint64
	perAnswer := map[string]map[string][]float64{} // mode, counter: per-token values
	hits := map[string][2]uint64{}
	for _, lat := range o.LatencyMS {
		key := strconv.FormatFloat(lat, 'f', -1, 64)
		shape := netsim.Shape{Latency: time.Duration(lat * float64(time.Millisecond)), Jitter: time.Duration(lat / 5 * float64(time.Millisecond))}
		if err := link.Up.SetShape(shape); err != nil {
			return res, err
		}
		if err := link.Down.SetShape(shape); err != nil {
			return res, err
		}
		per := map[string][]float64{}
		ttft := map[string][]float64{}
		answers := map[string][]Answer{}
		for qi, q := range o.Questions {
			byMode := map[string]answer{}
			for _, m := range o.Modes {
				a, err := ask(ctx, client, q, m, sampling(o, qi))
				if err != nil {
					return res, fmt.Errorf("aggbench: %s at %v ms, question %d: %w\ndevice:\n%s\ncloud:\n%s", m.Name, lat, qi, err, device.Logs(), cloud.Logs())
				}
				byMode[m.Name] = a
				answers[m.Name] = append(answers[m.Name], Answer{Tokens: a.tokens, Summary: a.summary})
				per[m.Name] = append(per[m.Name], a.perToken)
				ttft[m.Name] = append(ttft[m.Name], timing.MS(a.summary.GetTtft().AsDuration()))
				if m.Mode == dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION && len(a.tokens) > 0 {
					n, s := float64(len(a.tokens)), a.summary
					if perAnswer[m.Name] == nil {
						perAnswer[m.Name] = map[string][]float64{}
					}
					for k, v := range map[string]float64{
						"rej_device": float64(s.GetRejectedDevice()) / n, "rej_cloud": float64(s.GetRejectedCloud()) / n,
						"hedges_device": float64(s.GetHedgesDevice()) / n, "hedges_cloud": float64(s.GetHedgesCloud()) / n,
						"hits_device": float64(s.GetHedgeHitsDevice()) / n, "hits_cloud": float64(s.GetHedgeHitsCloud()) / n,
						"up": float64(s.GetBytesSent()) / n, "down": float64(s.GetBytesReceived()) / n,
					} {
						perAnswer[m.Name][k] = append(perAnswer[m.Name][k], v)
					}
					h := hits[m.Name]
					h[0], h[1] = h[0]+s.GetHedgeHitsDevice(), h[1]+s.GetHedgeHitsCloud()
					hits[m.Name] = h
				}
				if m.Name == "dragon" {
					accDev = append(accDev, a.summary.GetAcceptanceRateDevice())
					accCloud = append(accCloud, a.summary.GetAcceptanceRateCloud())
					switches = append(switches, float64(a.summary.GetAggregatorSwitches()))
					second[0] += a.summary.GetSecondChoiceDevice()
					second[1] += a.summary.GetSecondChoiceCloud()
					rejected[0] += a.summary.GetRejectedDevice()
					rejected[1] += a.summary.GetRejectedCloud()
					tokens = append(tokens, float64(len(a.tokens)))
					deviceSteps += a.summary.GetStepsAggregatedDevice()
					for k := range aggregator.HedgeThresholds {
						low[0][k] += at(a.summary.GetLowProbDraftsDevice(), k)
						low[1][k] += at(a.summary.GetLowProbDraftsCloud(), k)
						caught[0][k] += at(a.summary.GetLowProbCaughtDevice(), k)
						caught[1][k] += at(a.summary.GetLowProbCaughtCloud(), k)
					}
					if n := float64(len(a.tokens)); n > 0 {
						rejDev = append(rejDev, float64(a.summary.GetRejectedDevice())/n)
						rejCloud = append(rejCloud, float64(a.summary.GetRejectedCloud())/n)
						bytesUp = append(bytesUp, float64(a.summary.GetBytesSent())/n)
						bytesDown = append(bytesDown, float64(a.summary.GetBytesReceived())/n)
					}
				}
				o.Log("L=%v %-12s q%-2d %3d tokens  %6.1f ms/token  ttft %6.0f ms  rejected %d/%d  moves %d  hedged %d/%d adopted %d/%d", lat, m.Name, qi, len(a.tokens), a.perToken,
					timing.MS(a.summary.GetTtft().AsDuration()), a.summary.GetRejectedDevice(), a.summary.GetRejectedCloud(), a.summary.GetAggregatorSwitches(),
					a.summary.GetHedgesDevice(), a.summary.GetHedgesCloud(), a.summary.GetHedgeHitsDevice(), a.summary.GetHedgeHitsCloud())
			}
			if tw, ok := byMode["tw"]; ok {
				for _, m := range o.Modes {
					if m.Mode != dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION {
						continue
					}
					res.GreedyPrompts++
					if slices.Equal(byMode[m.Name].tokens, tw.tokens) {
						res.GreedyIdentical++
					} else {
						res.Mismatches = append(res.Mismatches, fmt.Sprintf("%s L=%v q%d: %q", m.Name, lat, qi, q))
					}
				}
			}
		}
		for _, m := range o.Modes {
			if res.PerTokenMS[m.Name] == nil {
				res.PerTokenMS[m.Name] = map[string]float64{}
				res.TTFTMS[m.Name] = map[string]float64{}
				res.PerQuestionMS[m.Name] = map[string][]float64{}
				res.PerQuestionTTFTMS[m.Name] = map[string][]float64{}
				res.Answers[m.Name] = map[string][]Answer{}
			}
			res.PerQuestionMS[m.Name][key] = per[m.Name]
			res.PerQuestionTTFTMS[m.Name][key] = ttft[m.Name]
			res.Answers[m.Name][key] = answers[m.Name]
			res.PerTokenMS[m.Name][key] = timing.Median(per[m.Name])
			res.TTFTMS[m.Name][key] = timing.Median(ttft[m.Name])
		}
	}
	res.Counters = map[string]Counters{}
	for name, c := range perAnswer {
		med := func(k string) float64 { return timing.Median(c[k]) }
		res.Counters[name] = Counters{
			RejectionsPerToken: map[string]float64{"device": med("rej_device"), "cloud": med("rej_cloud")},
			HedgesPerToken:     map[string]float64{"device": med("hedges_device"), "cloud": med("hedges_cloud")},
			HedgeHitsPerToken:  map[string]float64{"device": med("hits_device"), "cloud": med("hits_cloud")},
			HedgeHits:          map[string]uint64{"device": hits[name][0], "cloud": hits[name][1]},
			BytesPerToken:      map[string]float64{"up": med("up"), "down": med("down")},
		}
	}
	res.Acceptance["device"] = timing.Median(accDev)
	res.Acceptance["cloud"] = timing.Median(accCloud)
	res.Switches = timing.Median(switches)
	res.SecondChoice = map[string]float64{}
	for i, side := range []string{"device", "cloud"} {
		if rejected[i] > 0 {
			res.SecondChoice[side] = float64(second[i]) / float64(rejected[i])
		}
	}
	res.Tokens = timing.Median(tokens)
	if deviceSteps > 0 {
		res.HedgeCurve = map[string][]HedgePoint{}
		for i, side := range []string{"device", "cloud"} {
			for k, t := range aggregator.HedgeThresholds {
				pt := HedgePoint{Threshold: math.Round(float64(t)*100) / 100, Hedged: float64(low[i][k]) / float64(deviceSteps)}
				if rejected[i] > 0 {
					pt.Caught = float64(caught[i][k]) / float64(rejected[i])
				}
				res.HedgeCurve[side] = append(res.HedgeCurve[side], pt)
			}
		}
	}
	if len(rejDev) > 0 {
		res.RejectionsPerToken = map[string]float64{"device": timing.Median(rejDev), "cloud": timing.Median(rejCloud)}
		res.BytesPerToken = map[string]float64{"up": timing.Median(bytesUp), "down": timing.Median(bytesDown)}
	}
	return res, errors.Join(device.Stop(10*time.Second), cloud.Stop(10*time.Second))
}

// HedgePoint is one threshold of Result.HedgeCurve.
type HedgePoint struct {
	Threshold float64 `json:"threshold"`
	Hedged    float64 `json:"hedged"`
	Caught    float64 `json:"caught"`
}

// Answer is one streamed generation.
type Answer struct {
	Tokens  []int32
	Text    string
	Summary *dragonv1.GenerateSummary
}

// Ask runs one generation through a device daemon and collects the chunks
// and the summary; chunks out of order or a missing summary are errors.
func Ask(ctx context.Context, c dragonv1.DeviceServiceClient, req *dragonv1.GenerateRequest) (Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	stream, err := c.Generate(ctx, req)
	if err != nil {
		return Answer{}, err
	}
	var a Answer
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return a, err
		}
		if ch := m.GetChunk(); ch != nil {
			if ch.GetStep() != uint64(len(a.Tokens)) {
				return a, fmt.Errorf("chunk of step %d after %d tokens", ch.GetStep(), len(a.Tokens))
			}
			a.Tokens = append(a.Tokens, ch.GetTokens()...)
			a.Text += ch.GetText()
		}
		if s := m.GetSummary(); s != nil {
			a.Summary = s
		}
	}
	if a.Summary == nil {
		return a, errors.New("the device ended the answer without a summary")
	}
	return a, nil
}

// sampling is question qi's sampling parameters.
func sampling(o Options, qi int) *dragonv1.SamplingParams {
	p := &dragonv1.SamplingParams{MaxTokens: uint32(o.MaxTokens)}
	if o.Temperature > 0 {
		p.Temperature, p.Seed = float32(o.Temperature), uint64(qi)+1
	}
	return p
}

// ask runs one generation and its per-token latency: the device's mean
// time per token after the first.
func ask(ctx context.Context, c dragonv1.DeviceServiceClient, q string, m Mode, p *dragonv1.SamplingParams) (answer, error) {
	a, err := Ask(ctx, c, &dragonv1.GenerateRequest{Prompt: q, Mode: m.Mode, Strategy: m.Strategy, BlindDrafts: m.Blind, Sampling: p,
		MaxHedges: uint32(m.Hedges), HedgeDepth: uint32(m.HedgeDepth), OmitSources: m.NoSources, PosteriorEvery: m.PosteriorEvery})
	if err != nil {
		return answer{}, err
	}
	return answer{tokens: a.Tokens, summary: a.Summary, perToken: timing.MS(a.Summary.GetTokenLatencyMean().AsDuration())}, nil
}

// at is xs[i], or 0 past its end (a device too old to count these).
func at(xs []uint64, i int) uint64 {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}
