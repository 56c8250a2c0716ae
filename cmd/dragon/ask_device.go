package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/device"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// remoteAsk is `dragon ask --device ADDR`: a client of the device daemon.
type remoteAsk struct {
	device, mode, strategy, first, trace, system string
	cloudPassages, switchEvery                   int
	hedges, hedgeDepth                           int
	codecTopP                                    float64
	asJSON, noSources                            bool
	posteriorEvery                               int
	stop                                         []string
	filter, cloudFilter                          map[string]string
	grpc                                         wire.Config
	// From the shared ask flags.
	sampling     sampling.Params
	maxTokens, k int
}

func (r *remoteAsk) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&r.device, "device", "", "ask the device daemon at this address (e.g. "+defaultDeviceAddr+")")
	f.StringVar(&r.mode, "mode", "", "with --device: dragon, tw, sw, device-only, cloud-only or context (default the daemon's)")
	f.IntVar(&r.cloudPassages, "cloud-passages", 0, "with --device: passages the cloud retrieves (default the daemon's)")
	f.StringVar(&r.strategy, "strategy", "greedy", "with --device: aggregator placement: greedy, device, cloud or random")
	f.StringVar(&r.first, "first", "device", "with --device: the side that aggregates first")
	f.IntVar(&r.switchEvery, "switch-every", 0, "with --device: move the aggregator every N steps whatever the strategy says")
	f.IntVar(&r.hedges, "hedges", 0, "with --device: hedged drafts, at most this many open a side (the daemons decode branches only with their own --hedges; 0: none)")
	f.IntVar(&r.hedgeDepth, "hedge-depth", 256, "with --device and --hedges: drafts of each hedge's branch")
	f.Float64Var(&r.codecTopP, "codec-top-p", 0, "with --device: probability mass the distribution codec keeps (default 0.8)")
	f.StringVar(&r.system, "system", "", "with --device: system message")
	f.StringArrayVar(&r.stop, "stop", nil, "with --device: stop string (repeatable)")
	f.StringVar(&r.trace, "trace", "", "with --device: write the decoding/acceptance trace here (for dragon bench sched --trace)")
	f.BoolVar(&r.asJSON, "json", false, "with --device: print the answer's summary and sources as one JSON object on stdout (the answer streams to stderr)")
	f.BoolVar(&r.noSources, "no-sources", false, "with --device: leave the answer's sources out (the sides then keep no evidence of it)")
	f.IntVar(&r.posteriorEvery, "posterior-every", -1, "with --device: posterior weights every this many answer tokens (0: off; default the daemon's)")
	f.StringToStringVar(&r.filter, "filter", nil, "with --device: narrow the device's retrieval: source=PREFIX,from=TEXT,after=DAY,before=DAY (it stays on the device)")
	f.StringToStringVar(&r.cloudFilter, "cloud-filter", nil, "with --device: narrow the cloud's retrieval, as --filter")
	r.grpc.RegisterFlags(f, "device-")
}

// filterFlag reads --filter's keys into a RetrievalFilter.
func filterFlag(name string, kv map[string]string) (*dragonv1.RetrievalFilter, error) {
	if len(kv) == 0 {
		return nil, nil
	}
	f := &dragonv1.RetrievalFilter{}
	for k, v := range kv {
		switch k {
		case "source":
			f.SourcePrefix = v
		case "from":
			f.From = v
		case "after", "before":
			ts, err := session.FilterTime(v)
			if err != nil {
				return nil, fmt.Errorf("--%s %s=%w", name, k, err)
			}
			if k == "after" {
				f.After = ts
			} else {
				f.Before = ts
			}
		default:
			return nil, fmt.Errorf("--%s: unknown key %q (source, from, after, before)", name, k)
		}
	}
	return f, nil
}

// askSummary is what --json prints: the answer, the device's summary of
// it as the OpenAI front end's "dragon" object has it, and its sources as
// the OpenAI front end's "sources".
type askSummary struct {
	Text string `json:"text"`
	device.SummaryJSON
	Sources []device.SourceJSON `json:"sources"`
}

func (r *remoteAsk) request(question string) (*dragonv1.GenerateRequest, error) {
	req := &dragonv1.GenerateRequest{
		Prompt: question, System: r.system, PassagesDevice: uint32(max(r.k, 0)), PassagesCloud: uint32(max(r.cloudPassages, 0)),
		CodecTopP: float32(r.codecTopP), SwitchEvery: uint32(max(r.switchEvery, 0)), RecordTrace: r.trace != "",
		MaxHedges: uint32(max(r.hedges, 0)), HedgeDepth: uint32(max(r.hedgeDepth, 0)), OmitSources: r.noSources,
		Sampling: &dragonv1.SamplingParams{
			Temperature: float32(r.sampling.Temperature), TopK: uint32(max(r.sampling.TopK, 0)), TopP: float32(r.sampling.TopP),
			MinP: float32(r.sampling.MinP), RepetitionPenalty: float32(r.sampling.RepeatPenalty), Seed: r.sampling.Seed,
			MaxTokens: uint32(max(r.maxTokens, 0)), Stop: r.stop,
		},
	}
	if r.posteriorEvery >= 0 {
		req.PosteriorEvery = proto.Uint32(uint32(r.posteriorEvery))
	}
	var err error
	if req.Filter, err = filterFlag("filter", r.filter); err != nil {
		return nil, err
	}
	if req.CloudFilter, err = filterFlag("cloud-filter", r.cloudFilter); err != nil {
		return nil, err
	}
	if r.mode != "" {
		m, err := parseModeName(r.mode)
		if err != nil {
			return nil, fmt.Errorf("--mode: %w", err)
		}
		req.Mode = m
	}
	st, err := aggregator.ParseStrategy(r.strategy)
	if err != nil {
		return nil, fmt.Errorf("--strategy: %w", err)
	}
	req.Strategy = session.StrategyToProto(st)
	first, err := aggregator.ParseSide(r.first)
	if err != nil {
		return nil, fmt.Errorf("--first: %w", err)
	}
	req.Aggregator = session.ToSide(first)
	return req, nil
}

func (r *remoteAsk) ask(cmd *cobra.Command, question string) error {
	req, err := r.request(question)
	if err != nil {
		return err
	}
	autoInsecure(&r.grpc, r.device)
	opts, err := r.grpc.DialOptions()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(r.device, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := dragonv1.NewDeviceServiceClient(conn).Generate(cmd.Context(), req)
	if err != nil {
		return fmt.Errorf("device %s: %w", r.device, err)
	}
	answer := io.Writer(cmd.OutOrStdout())
	if r.asJSON {
		answer = cmd.ErrOrStderr()
	}
	var sum *dragonv1.GenerateSummary
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			st := status.Convert(err)
			return fmt.Errorf("device %s: %s: %s", r.device, st.Code(), st.Message())
		}
		if c := m.GetChunk(); c != nil {
			fmt.Fprint(answer, c.GetText())
		}
		if s := m.GetSummary(); s != nil {
			sum = s
		}
	}
	fmt.Fprintln(answer)
	if sum == nil {
		return errors.New("the device ended the answer without a summary")
	}
	if r.trace != "" {
		if err := writeTrace(r.trace, sum.GetTrace()); err != nil {
			return err
		}
	}
	out := summaryJSON(sum)
	if r.asJSON {
		return writeJSON(cmd.OutOrStdout(), out)
	}
	if !r.noSources {
		fmt.Fprint(cmd.OutOrStdout(), sourcesList(out.Sources, out.SourcesPartial))
	}
	fmt.Fprintln(cmd.ErrOrStderr(), summaryLine(out.SummaryJSON))
	return nil
}

func summaryJSON(s *dragonv1.GenerateSummary) askSummary {
	return askSummary{Text: s.GetText(), SummaryJSON: device.NewSummaryJSON(s), Sources: device.NewSourcesJSON(s)}
}

// sourcesList is the numbered list of an answer's sources people read
// after it: largest share first, each with its side, share, title, where
// it is, and the start of its text.
func sourcesList(list []device.SourceJSON, partial bool) string {
	if len(list) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nSources (share of the answer):\n")
	for i, e := range list {
		fmt.Fprintf(&b, "%2d. [%s %4.1f%%] %s", i+1, e.Side, 100*e.Share, e.Title)
		if !e.ClosedBook {
			fmt.Fprintf(&b, " — %s", e.Source)
		}
		var about []string
		for _, k := range []string{"from", "date", "page"} {
			if v := e.Metadata[k]; v != "" {
				about = append(about, k+" "+v)
			}
		}
		if len(about) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(about, ", "))
		}
		b.WriteString("\n")
		if e.Excerpt != "" {
			fmt.Fprintf(&b, "    “%s”\n", e.Excerpt)
		}
	}
	if partial {
		b.WriteString("    (the cloud's passages are missing: it failed or did not send them)\n")
	}
	return b.String()
}

// summaryLine is the summary people read after the answer.
func summaryLine(s device.SummaryJSON) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s: %d tokens (%s), ttft %.0f ms, %.1f ms/token (%.1f tok/s); acceptance device %.2f cloud %.2f; %d aggregator switches (steps decided: device %d, cloud %d); %d stale drafts; %d bytes sent, %d received",
		s.Mode, s.Tokens, s.Finish, s.TTFTMS, s.TokenMS, s.TokensPerSecond, s.AcceptanceDevice, s.AcceptanceCloud,
		s.Switches, s.StepsDevice, s.StepsCloud, s.StaleDrafts, s.BytesSent, s.BytesReceived)
	if s.Fallback {
		fmt.Fprintf(&b, ", answered alone from step %d: %s", s.FallbackStep, s.FallbackReason)
	}
	if s.PassagesRestoredDevice != 0 || s.PassagesRestoredCloud != 0 {
		fmt.Fprintf(&b, "; restored passages device %d cloud %d", s.PassagesRestoredDevice, s.PassagesRestoredCloud)
	}
	b.WriteString("]")
	return b.String()
}

// writeTrace saves a summary's trace in the format dragon bench sched
// reads.
func writeTrace(path string, t *dragonv1.Trace) error {
	if t == nil {
		return errors.New("the device sent no trace")
	}
	out := map[string]map[string]any{
		"decode_ms": {"device": t.GetDecodeMsDevice(), "cloud": t.GetDecodeMsCloud()},
		"accept":    {"device": t.GetAcceptDevice(), "cloud": t.GetAcceptCloud()},
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
