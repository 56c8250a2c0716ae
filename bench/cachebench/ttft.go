package cachebench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/internal/timing"
	"github.com/dragon-rag/dragon/netsim"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// Config is a configuration of the TTFT part: a mode and the link's
// one-way latency and jitter (the standard deviation of a normal delay).
type Config struct {
	Name      string
	Mode      dragonv1.Mode
	LatencyMS float64
	JitterMS  float64
}

// Configs are device-only, then dragon at each one-way latency
// ("dragon@0", "dragon@100") with jitter jitterFrac × latency. The
// targets subtract 2L from a time to first token, which is exact only on a
// link without jitter: on a jittery one each message is delayed by its own
// draw, and the first token waits for the latest of several.
func Configs(latencies []float64, jitterFrac float64) []Config {
	out := []Config{{Name: "device-only", Mode: dragonv1.Mode_MODE_DEVICE_ONLY}}
	for _, l := range latencies {
		out = append(out, Config{Name: "dragon@" + strconv.FormatFloat(l, 'f', -1, 64), Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION,
			LatencyMS: l, JitterMS: l * jitterFrac})
	}
	return out
}

// Asked is one answer of the TTFT part.
type Asked struct {
	Tokens []int32
	Text   string
	TTFTMS float64
	// Passages and Restored of the sides that decode the mode, device
	// then cloud (a side that does not decode counts 0 of 0).
	Passages, Restored [2]int
}

// Pass is one configuration's answers: each question cold, then warm.
type Pass struct {
	Cold, Warm []Asked
}

// TTFTOptions of the TTFT part.
type TTFTOptions struct {
	// Binary is the dragon binary; Env extra environment for it.
	Binary string
	Env    []string
	Model  string
	// Index folders and decoding profiles of the two daemons.
	CloudIndex, DeviceIndex     string
	CloudProfile, DeviceProfile string
	// CloudCores and DeviceCores pin the daemons (taskset lists).
	CloudCores, DeviceCores string
	Questions               []string
	Configs                 []Config
	MaxTokens               int
	Passages                int
	// DaemonFlags are more flags for both daemons.
	DaemonFlags []string
	Log         func(format string, args ...any)
}

// TTFTResult is the TTFT part, by configuration name.
type TTFTResult struct {
	// TTFTMS by configuration, then "cold" or "warm": medians over the
	// questions; PerQuestionTTFTMS the values, in question order.
	TTFTMS            map[string]map[string]float64   `json:"ttft_ms"`
	PerQuestionTTFTMS map[string]map[string][]float64 `json:"per_question_ttft_ms"`
	// RestoredFraction is the share of the passages of the sides that
	// decode which their KV caches restored, by configuration, then
	// "cold" or "warm"; PerQuestionRestored the passages restored and in
	// all ("2/2"), in question order.
	RestoredFraction    map[string]map[string]float64  `json:"restored_fraction"`
	PerQuestionRestored map[string]map[string][]string `json:"per_question_restored"`
	// Tokens is each cold answer's length, by configuration.
	Tokens map[string][]int `json:"tokens"`
	// GreedyIdentical counts warm answers equal, token for token, to the
	// cold answer of the same question and configuration, of
	// GreedyPrompts.
	GreedyIdentical int      `json:"greedy_identical"`
	GreedyPrompts   int      `json:"greedy_prompts"`
	Mismatches      []string `json:"mismatches,omitempty"`
}

// RunTTFT measures each configuration on a fresh pair of daemons: every
// question asked once (cold), then every question again (warm, each after
// the others).
func RunTTFT(ctx context.Context, o TTFTOptions) (TTFTResult, error) {
	if len(o.Questions) == 0 || len(o.Configs) == 0 {
		return TTFTResult{}, errors.New("cachebench: need questions and configurations")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	passes := map[string]Pass{}
	for _, cfg := range o.Configs {
		p, err := runConfig(ctx, o, cfg)
		if err != nil {
			return TTFTResult{}, err
		}
		passes[cfg.Name] = p
	}
	return Summarize(o.Configs, o.Questions, passes), nil
}

// runConfig starts a cloud and a device daemon as bench agg does (one
// thread each, pinned, the device reaching the cloud through a netsim
// link), with their KV caches at the defaults, and asks the questions
// cold and warm.
func runConfig(ctx context.Context, o TTFTOptions, cfg Config) (p Pass, err error) {
	common := append([]string{"--model", o.Model, "--threads", "1", "--listen", "127.0.0.1:0", "--http", "", "--passages", strconv.Itoa(o.Passages), "--rerank-model", ""}, o.DaemonFlags...)
	cloud, err := aggbench.StartDaemon("cloud", o.CloudCores, o.Env, append([]string{o.Binary, "cloud", "--index", o.CloudIndex, "--profile", o.CloudProfile}, common...)...)
	if err != nil {
		return p, err
	}
	defer func() { err = errors.Join(err, cloud.Stop(10*time.Second)) }()
	shape := netsim.Shape{Latency: time.Duration(cfg.LatencyMS * float64(time.Millisecond)), Jitter: time.Duration(cfg.JitterMS * float64(time.Millisecond))}
	link, err := netsim.NewLink(shape, 1)
	if err != nil {
		return p, err
	}
	proxy, err := netsim.NewProxy("127.0.0.1:0", cloud.Addr, link, nil)
	if err != nil {
		return p, err
	}
	pctx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	go proxy.Serve(pctx)
	device, err := aggbench.StartDaemon("device", o.DeviceCores, o.Env, append([]string{o.Binary, "device", "--index", o.DeviceIndex, "--profile", o.DeviceProfile,
		"--cloud", proxy.Addr(), "--cloud-passages", strconv.Itoa(o.Passages)}, common...)...)
	if err != nil {
		return p, err
	}
	defer func() { err = errors.Join(err, device.Stop(10*time.Second)) }()
	conn, err := grpc.NewClient(device.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return p, err
	}
	defer conn.Close()
	client := dragonv1.NewDeviceServiceClient(conn)
	for _, state := range []string{"cold", "warm"} {
		for qi, q := range o.Questions {
			a, err := aggbench.Ask(ctx, client, &dragonv1.GenerateRequest{Prompt: q, Mode: cfg.Mode, Sampling: &dragonv1.SamplingParams{MaxTokens: uint32(o.MaxTokens)}})
			if err != nil {
				return p, fmt.Errorf("cachebench: %s, %s, question %d: %w\ndevice:\n%s\ncloud:\n%s", cfg.Name, state, qi, err, device.Logs(), cloud.Logs())
			}
			as := asked(cfg.Mode, a)
			if state == "cold" {
				p.Cold = append(p.Cold, as)
			} else {
				p.Warm = append(p.Warm, as)
			}
			o.Log("%-12s %-4s q%-2d %3d tokens  ttft %7.1f ms  restored %d/%d device, %d/%d cloud", cfg.Name, state, qi, len(a.Tokens), as.TTFTMS,
				as.Restored[0], as.Passages[0], as.Restored[1], as.Passages[1])
		}
	}
	return p, nil
}

// asked reads an answer of mode m.
func asked(m dragonv1.Mode, a aggbench.Answer) Asked {
	s := a.Summary
	out := Asked{Tokens: a.Tokens, Text: a.Text, TTFTMS: timing.MS(s.GetTtft().AsDuration())}
	if m != dragonv1.Mode_MODE_CLOUD_ONLY {
		out.Passages[0], out.Restored[0] = int(s.GetPassagesDevice()), int(s.GetPassagesRestoredDevice())
	}
	if m != dragonv1.Mode_MODE_DEVICE_ONLY {
		out.Passages[1], out.Restored[1] = int(s.GetPassagesCloud()), int(s.GetPassagesRestoredCloud())
	}
	return out
}

// Summarize computes the TTFT part's result from each configuration's
// answers.
func Summarize(configs []Config, questions []string, passes map[string]Pass) TTFTResult {
	res := TTFTResult{
		TTFTMS: map[string]map[string]float64{}, PerQuestionTTFTMS: map[string]map[string][]float64{},
		RestoredFraction: map[string]map[string]float64{}, PerQuestionRestored: map[string]map[string][]string{},
		Tokens: map[string][]int{},
	}
	for _, cfg := range configs {
		p, ok := passes[cfg.Name]
		if !ok {
			continue
		}
		res.TTFTMS[cfg.Name] = map[string]float64{}
		res.PerQuestionTTFTMS[cfg.Name] = map[string][]float64{}
		res.RestoredFraction[cfg.Name] = map[string]float64{}
		res.PerQuestionRestored[cfg.Name] = map[string][]string{}
		for state, as := range map[string][]Asked{"cold": p.Cold, "warm": p.Warm} {
			ttft := make([]float64, len(as))
			per := make([]string, len(as))
			restored, passages := 0, 0
			for i, a := range as {
				ttft[i] = a.TTFTMS
				r, n := a.Restored[0]+a.Restored[1], a.Passages[0]+a.Passages[1]
				per[i] = fmt.Sprintf("%d/%d", r, n)
				restored += r
				passages += n
			}
			res.TTFTMS[cfg.Name][state] = timing.Median(ttft)
			res.PerQuestionTTFTMS[cfg.Name][state] = ttft
			res.PerQuestionRestored[cfg.Name][state] = per
			if passages > 0 {
				res.RestoredFraction[cfg.Name][state] = float64(restored) / float64(passages)
			}
		}
		for i, cold := range p.Cold {
			res.Tokens[cfg.Name] = append(res.Tokens[cfg.Name], len(cold.Tokens))
			if i >= len(p.Warm) {
				continue
			}
			res.GreedyPrompts++
			if slices.Equal(cold.Tokens, p.Warm[i].Tokens) {
				res.GreedyIdentical++
			} else {
				q := ""
				if i < len(questions) {
					q = questions[i]
				}
				res.Mismatches = append(res.Mismatches, fmt.Sprintf("%s q%d %q: cold %q, warm %q", cfg.Name, i, q, cold.Text, p.Warm[i].Text))
			}
		}
	}
	return res
}
