package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/rerank"
)

func init() { benchCommands = append(benchCommands, newBenchAggCmd) }

// blindMode is dragon mode with Blind drafts, to measure what drafting
// beside the peer's drafts is worth; hedgedMode dragon mode with hedged
// drafts; noSourcesMode dragon mode without the answer's sources, to
// measure what they cost; posteriorMode dragon mode with posterior
// weights.
const (
	blindMode     = "dragon-blind"
	hedgedMode    = "dragon-hedged"
	noSourcesMode = "dragon-nosources"
	posteriorMode = "dragon-posterior"
)

func newBenchAggCmd() *cobra.Command {
	var (
		o                 aggbench.Options
		latencies, modes  string
		questions         int
		asJSON, noSpec    bool
		noCache           bool
		cloudIx, deviceIx string
		rerankModel       string
		rerankCandidates  int
		rescoreEvery      int
		hedges, depth     int
		hedgeBelow        float64
		posteriorEvery    int
	)
	cmd := &cobra.Command{
		Use:   "agg",
		Short: "Per-token latency of each mode with two live daemons behind an emulated link (one core and one thread each)",
		Long: `Starts a cloud and a device daemon from this binary, pinned to cores 0 and 1
with one thread each, the device reaching the cloud through a netsim link of
one-way latency L (jitter L/5, normal), and asks each question in each mode
at each L (greedy unless --temperature, 2 passages per side by default).
Prints median per-token latency by mode and L, the acceptance of each side's
drafts, aggregator moves, and how many dragon answers equal tw answers
(greedy, or sampled with the same seed). Needs
make model, make index and (optionally) make profile first.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.LatencyMS, err = parseFloats(latencies); err != nil {
				return fmt.Errorf("--latencies: %w", err)
			}
			for _, name := range strings.Split(modes, ",") {
				name = strings.TrimSpace(name)
				blind, hedged, bare, posterior, base := name == blindMode, name == hedgedMode, name == noSourcesMode, name == posteriorMode, name
				if blind || hedged || bare || posterior {
					base = "dragon"
				}
				m, err := parseModeName(base)
				if err != nil {
					return fmt.Errorf("--modes: %w", err)
				}
				mode := aggbench.Mode{Name: name, Mode: m, Blind: blind, NoSources: bare}
				if posterior {
					if posteriorEvery < 1 {
						return fmt.Errorf("--modes %s needs --posterior-every of at least 1", posteriorMode)
					}
					mode.PosteriorEvery = proto.Uint32(uint32(posteriorEvery))
				}
				if hedged {
					if hedges < 1 {
						return fmt.Errorf("--modes %s needs --hedges of at least 1", hedgedMode)
					}
					mode.Hedges, mode.HedgeDepth = hedges, depth
				}
				o.Modes = append(o.Modes, mode)
			}
			if slices.ContainsFunc(o.Modes, func(m aggbench.Mode) bool { return m.Hedges > 0 }) {
				o.DaemonFlags = append(o.DaemonFlags, "--hedges", strconv.Itoa(hedges), "--hedge-below", strconv.FormatFloat(hedgeBelow, 'g', -1, 64))
			}
			if o.Temperature < 0 || math.IsNaN(o.Temperature) {
				return fmt.Errorf("--temperature %v: must be 0 (greedy) or positive", o.Temperature)
			}
			if questions < 1 || questions > len(promptset.Questions) {
				return fmt.Errorf("--questions %d: between 1 and %d", questions, len(promptset.Questions))
			}
			o.Questions = promptset.Questions[:questions]
			if o.Binary, err = os.Executable(); err != nil {
				return err
			}
			o.CloudIndex, o.DeviceIndex = cloudIx, deviceIx
			if noSpec {
				o.DaemonFlags = append(o.DaemonFlags, "--no-spec")
			}
			if noCache {
				o.DaemonFlags = append(o.DaemonFlags, "--kv-cache-mb", "0")
			}
			if rerankModel != "" {
				o.DaemonFlags = append(o.DaemonFlags, "--rerank-model", rerankModel,
					"--rerank-candidates", strconv.Itoa(rerankCandidates), "--rescore-every", strconv.Itoa(rescoreEvery))
			}
			o.Log = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...) }
			res, err := aggbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Model, "model", defaultModel(), "GGUF model file (the device's, and the cloud's unless --cloud-model)")
	f.StringVar(&o.CloudModel, "cloud-model", "", "the cloud's GGUF model, of the device's tokenizer (default: --model)")
	f.StringVar(&o.DeviceProfile, "device-profile", "data/profile-device.json", "the device's dragon profile fit")
	f.StringVar(&o.CloudProfile, "cloud-profile", "data/profile-cloud.json", "the cloud's dragon profile fit")
	f.StringVar(&cloudIx, "cloud-index", "data/index/cloud", "the cloud's index")
	f.StringVar(&deviceIx, "device-index", "data/index/device", "the device's index")
	f.StringVar(&latencies, "latencies", "0,50,150", "one-way latencies in ms")
	f.StringVar(&modes, "modes", "dragon,tw,sw,device-only", "modes to measure ("+blindMode+": dragon whose greedy drafts ignore the peer's; "+hedgedMode+": dragon with hedged drafts; "+noSourcesMode+": dragon without the answer's sources; "+posteriorMode+": dragon with posterior weights)")
	f.IntVar(&hedges, "hedges", 2, "with "+hedgedMode+": hedges each side may have open (both daemons reserve as many branches)")
	f.IntVar(&posteriorEvery, "posterior-every", 1, "with "+posteriorMode+": answer tokens between posterior weightings")
	f.IntVar(&depth, "hedge-depth", 256, "with "+hedgedMode+": drafts of each hedge's branch")
	f.Float64Var(&hedgeBelow, "hedge-below", 0, "with "+hedgedMode+": hedge every draft of probability below this instead of where the measured rule says it pays (0: the rule)")
	f.IntVar(&questions, "questions", 8, "questions of the built-in set")
	f.IntVar(&o.MaxTokens, "max-tokens", 32, "tokens per answer")
	f.IntVar(&o.Passages, "passages", 2, "passages per side")
	f.Float64Var(&o.Temperature, "temperature", 0, "sample every answer at this temperature (seed: the question's number), 0: greedy")
	f.BoolVar(&noSpec, "no-spec", false, "turn local speculative decoding off on both daemons")
	f.BoolVar(&noCache, "no-cache", false, "turn both daemons' KV prefix caches off, so that every mode prefills its passages (as E1 and E2 do)")
	f.BoolVar(&asJSON, "json", true, "print one JSON object (always)")
	f.StringVar(&rerankModel, "rerank-model", "", "both daemons re-rank their candidates with this cross-encoder (make rerank-model)")
	f.IntVar(&rerankCandidates, "rerank-candidates", rerank.DefaultCandidates, "with --rerank-model: first-stage passages re-ranked")
	f.IntVar(&rescoreEvery, "rescore-every", 0, "with --rerank-model: dynamic weights, re-scored every this many answer tokens (0: off)")
	return cmd
}
