package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/experiments"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/engine/llamacpp"
)

func init() { benchCommands = append(benchCommands, newBenchExpCmd) }

// passagesPerSide parses a flag's list of passages per side.
func passagesPerSide(flag, list string) ([]int, error) {
	ks, err := parseFloats(list)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	var out []int
	for _, k := range ks {
		if k < 0 || k > 16 || k != float64(int(k)) {
			return nil, fmt.Errorf("%s: %v: whole numbers from 0 to 16", flag, k)
		}
		out = append(out, int(k))
	}
	return out, nil
}

func newBenchExpCmd() *cobra.Command {
	var (
		o         experiments.Options
		latencies string
		passages  string
		only      string
		// E4 as Fig. 5
		familyModel, familyPassages string
		specFamilyModels            string
		familyRerank, familyMethods string
		questions                   int
		threads                     int
	)
	cmd := &cobra.Command{
		Use:   "exp",
		Short: "The published evaluation: E1 time per token and E2 TTFT of each mode over added latency, E3 placement strategies, E4 perplexity, E5 local speculation ablation (CSV, plots, docs/EXPERIMENTS.md)",
		Long: `Starts a cloud and a device daemon as dragon bench agg does (pinned to cores 0
and 1, one thread each, the link through netsim with one-way latency L and
jitter L/5) and asks each question in every mode (dragon, tw, sw,
device-only, cloud-only, context, kv) and in dragon mode with each placement
strategy, at each L, with the KV caches off; then replays the placement
strategies in the simulator (latency). E2 with the KV cache (cache) runs the
E2 modes at each L on fresh daemons with their caches on, each question
cold and then again warm. E4 (quality) holds windows of the State of the Union
corpus out, splits the rest between a device and a cloud BM25 index, and
measures the perplexity of each window's second half given its first for
each method and passages per side, in this process. E5 (spec) answers
held-out RAG prompts greedily with plain decoding and each configuration
of local speculative decoding in turn, counting drafts, accepted tokens
and forward passes, in this process. Writes docs/experiments/e1.csv …
e5.csv, their plots and results.json, and regenerates docs/EXPERIMENTS.md;
--only runs some parts and keeps the others' last results. Needs make model, make corpus, make index and make profile
first (make experiments does all of it).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, e := range strings.Split(only, ",") {
				switch strings.TrimSpace(e) {
				case "latency":
					o.Latency = true
				case "cache":
					o.Cache = true
				case "quality":
					o.Quality = true
				case "spec":
					o.Spec = true
				case "family":
					o.Family = true
				case "spec-family":
					o.SpecFamily = true
				case "report": // run nothing: regenerate the report from results.json
				default:
					return fmt.Errorf("--only %q: latency, cache, quality, spec, family, spec-family, a comma-separated list of them, or report", e)
				}
			}
			var err error
			if o.LatencyMS, err = parseFloats(latencies); err != nil {
				return fmt.Errorf("--latencies: %w", err)
			}
			if questions < 1 || questions > len(promptset.Questions) {
				return fmt.Errorf("--questions %d: between 1 and %d", questions, len(promptset.Questions))
			}
			if o.Agg.MaxTokens < 2 || o.Agg.Passages < 1 || o.SimRuns < 1 || o.SimSteps < 2 {
				return fmt.Errorf("--max-tokens ≥ 2, --passages ≥ 1, --sim-runs ≥ 1 and --sim-steps ≥ 2")
			}
			o.Agg.Questions = promptset.Questions[:questions]
			if o.Agg.Binary, err = os.Executable(); err != nil {
				return err
			}
			if o.QualityOpts.Passages, err = passagesPerSide("--quality-passages", passages); err != nil {
				return err
			}
			if o.FamilyOpts.Passages, err = passagesPerSide("--family-passages", familyPassages); err != nil {
				return err
			}
			if o.QualityOpts.Windows < 1 || o.QualityOpts.Words < 8 || o.FamilyOpts.Windows < 1 || o.FamilyOpts.Words < 8 || threads < 1 {
				return fmt.Errorf("--windows and --family-windows ≥ 1, --window-words and --family-window-words ≥ 8, --threads ≥ 1")
			}
			if o.SpecOpts.Prompts < 1 || o.SpecOpts.MaxTokens < 2 || o.SpecOpts.Repeats < 1 {
				return fmt.Errorf("--spec-prompts ≥ 1, --spec-tokens ≥ 2 and --spec-repeats ≥ 1")
			}
			if o.Quality || o.Spec {
				m, err := llamacpp.Load(o.Agg.Model, llamacpp.Options{Threads: threads})
				if err != nil {
					return err
				}
				defer m.Close()
				o.QualityOpts.Model, o.QualityOpts.Threads = m, threads
				o.SpecOpts.Model, o.SpecOpts.Threads = m, threads
			}
			if o.SpecFamily {
				for _, path := range strings.Split(specFamilyModels, ",") {
					m, err := llamacpp.Load(strings.TrimSpace(path), llamacpp.Options{Threads: threads})
					if err != nil {
						return fmt.Errorf("--spec-family-models: %w (make qwen fetches them)", err)
					}
					defer m.Close()
					s := o.SpecOpts
					s.Model, s.Threads, s.FollowUps, s.CostModelOnly = m, threads, true, true
					o.SpecFamilyOpts = append(o.SpecFamilyOpts, s)
				}
			}
			if o.Family {
				m, err := llamacpp.Load(familyModel, llamacpp.Options{Threads: threads})
				if err != nil {
					return fmt.Errorf("--family-model: %w (make qwen fetches it)", err)
				}
				defer m.Close()
				o.FamilyOpts.Model, o.FamilyOpts.Threads = m, threads
				if familyMethods != "" {
					o.FamilyOpts.Methods = strings.Split(familyMethods, ",")
				}
				if familyRerank != "" {
					rr, closeRR, err := openReranker(familyRerank, threads)
					if err != nil {
						return err
					}
					defer closeRR()
					o.FamilyOpts.Reranker = rr
				}
			}
			o.Command = "dragon " + strings.Join(os.Args[1:], " ")
			o.Log = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...) }
			if _, err := experiments.Run(cmd.Context(), o); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/EXPERIMENTS.md and %s/experiments/\n", o.Dir, o.Dir)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Agg.Model, "model", defaultModel(), "GGUF model file (E1–E3: the device's, and the cloud's unless --cloud-model; E4, E5: the model)")
	f.StringVar(&o.Agg.CloudModel, "cloud-model", "", "E1–E3: the cloud's GGUF model, of the device's tokenizer (default: --model); with --out elsewhere, to keep the default model's figures")
	f.StringVar(&o.Agg.DeviceProfile, "device-profile", "data/profile-device.json", "E1–E3: the device's dragon profile fit (make profile-qwen writes the Qwen files')")
	f.StringVar(&o.Agg.CloudProfile, "cloud-profile", "data/profile-cloud.json", "E1–E3: the cloud's dragon profile fit")
	f.StringVar(&o.Agg.CloudIndex, "cloud-index", "data/index/cloud", "the cloud's index")
	f.StringVar(&o.Agg.DeviceIndex, "device-index", "data/index/device", "the device's index")
	f.StringVar(&latencies, "latencies", "0,50,100,200,300", "added one-way latencies in ms")
	f.IntVar(&questions, "questions", 8, "questions of the built-in set")
	f.IntVar(&o.Agg.MaxTokens, "max-tokens", 32, "tokens per answer")
	f.IntVar(&o.Agg.Passages, "passages", 2, "passages per side")
	f.IntVar(&o.SimRuns, "sim-runs", 200, "simulator runs per strategy and latency")
	f.IntVar(&o.SimSteps, "sim-steps", 128, "tokens per simulator run")
	f.StringVar(&o.Dir, "out", "docs", "folder of EXPERIMENTS.md and experiments/")
	f.StringVar(&only, "only", "latency,cache,quality,spec", "parts to run: latency (E1–E3), cache (E2 with the KV cache, cold and warm), quality (E4), spec (E5), family (E4 as DRAGON's Fig. 5 on its model family: hours on 2 cores), spec-family (E5 on the Qwen pair, with follow-up prompts); the others keep their last results (report: run none, regenerate the report)")
	f.StringVar(&o.QualityOpts.Corpus, "corpus", "data/corpus/sotu", "E4: folder of .txt documents, held-out windows and the two sides' indexes")
	f.IntVar(&o.QualityOpts.Windows, "windows", 16, "E4: held-out windows")
	f.IntVar(&o.QualityOpts.Words, "window-words", 96, "E4: words per window (the first half given, the second scored)")
	f.StringVar(&passages, "quality-passages", "0,1,2,4,8", "E4: passages per side")
	f.IntVar(&threads, "threads", 2, "E4, E5: compute threads")
	f.StringVar(&familyModel, "family-model", "models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "E4 as Fig. 5 (family): the model of both sides (make qwen)")
	f.StringVar(&o.FamilyOpts.Corpus, "family-corpus", "data/corpus/wiki/articles", "E4 as Fig. 5: folder of .txt documents (make wiki's Wikipedia articles)")
	f.StringVar(&familyPassages, "family-passages", "0,1,2,4,8,16", "E4 as Fig. 5: passages per side")
	f.IntVar(&o.FamilyOpts.Windows, "family-windows", 16, "E4 as Fig. 5: held-out windows")
	f.StringVar(&o.FamilyOpts.Split, "family-split", experiments.SplitRank, "E4 as Fig. 5: the sides' passages: rank (the paper's: of one index's top 2k the cloud gets the first k, the device the next k) or files (each side an index of alternate documents)")
	f.StringVar(&familyRerank, "family-rerank-model", "", "E4 as Fig. 5: also measure dragon with each side's candidates re-ranked by this cross-encoder (dragon-rerank) and with dynamic weights (dragon-dynamic)")
	f.StringVar(&familyMethods, "family-methods", "", "E4 as Fig. 5: methods besides none, comma-separated (default cloud-context,context,dragon,dragon-posterior, and dragon-rerank,dragon-dynamic,dragon-rerank-posterior with --family-rerank-model)")
	f.IntVar(&o.FamilyOpts.RerankCandidates, "family-rerank-candidates", 16, "E4 as Fig. 5, re-ranked methods: first-stage (BM25) candidates per side")
	f.IntVar(&o.FamilyOpts.RescoreEvery, "family-rescore-every", 16, "E4 as Fig. 5, dragon-dynamic: continuation tokens between re-scorings")
	f.IntVar(&o.FamilyOpts.PosteriorEvery, "family-posterior-every", 1, "E4 as Fig. 5, dragon-posterior and dragon-rerank-posterior: continuation tokens between posterior weightings")
	f.IntVar(&o.FamilyOpts.Words, "family-window-words", 96, "E4 as Fig. 5: words per window")
	f.BoolVar(&o.FamilyOpts.OwnArticle, "family-own-article", false, "E4 as Fig. 5: keep the rest of each window's article (before and after the window) in the corpus, as the paper's WikiText articles are in the Wikipedia it retrieves from")
	f.StringVar(&o.SpecOpts.Corpus, "spec-corpus", "data/corpus", "E5: folder of the two demo corpora (sotu/, mail/) the held-out prompts come from")
	f.IntVar(&o.SpecOpts.Prompts, "spec-prompts", 16, "E5: held-out prompts (one passage each)")
	f.IntVar(&o.SpecOpts.MaxTokens, "spec-tokens", 64, "E5: tokens per answer")
	f.IntVar(&o.SpecOpts.Repeats, "spec-repeats", 2, "E5: repeats of the prompt set (tok/s and speedup are medians over them)")
	f.IntVar(&o.SpecOpts.HistoryTokens, "spec-history-tokens", experiments.DefaultSpecHistoryTokens, "E5: the history row's store of earlier answers, in tokens")
	f.StringVar(&specFamilyModels, "spec-family-models", "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf,models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
		"E5 on the family (spec-family): the models, comma-separated, each run with --spec-prompts held-out prompts and as many follow-ups, the cost model's configurations only (make qwen)")
	return cmd
}
