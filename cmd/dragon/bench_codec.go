package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/codec"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/sampling"
)

func init() { benchCommands = append(benchCommands, newBenchCodecCmd) }

// benchFlags are shared by the bench subcommands.
type benchFlags struct {
	model, prompts, corpus string
	cloudIndex, deviceIx   string
	threads, n             int
	asJSON                 bool
}

func (b *benchFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&b.model, "model", defaultModel(), "GGUF model file")
	f.IntVar(&b.threads, "threads", 2, "compute threads")
	f.StringVar(&b.prompts, "prompts", "", "JSON lines of prompts ({\"prompt\": ..., \"passages\": [...]} or {\"prompt\": ..., \"search\": ...}); default: the built-in set")
	f.StringVar(&b.corpus, "corpus", "data/corpus", "corpus folder of the built-in prompt set (make corpus)")
	f.StringVar(&b.cloudIndex, "cloud-corpus", "data/index/cloud", "index folder of the public corpus (make index)")
	f.StringVar(&b.deviceIx, "device-corpus", "data/index/device", "index folder of the private corpus (make index)")
	f.IntVar(&b.n, "n", 20, "prompts of the built-in set")
	f.BoolVar(&b.asJSON, "json", false, "print one JSON object (node and spec always do)")
}

// loadPrompts is the user's set or the built-in one with passages per prompt.
func (b *benchFlags) loadPrompts(passages int) ([]promptset.Prompt, error) {
	if b.prompts != "" {
		return promptset.LoadJSONL(b.prompts)
	}
	return promptset.BuiltIn(b.corpus, b.n, passages)
}

func newBenchCodecCmd() *cobra.Command {
	var (
		bf        benchFlags
		maxTokens int
	)
	cmd := &cobra.Command{
		Use:   "codec",
		Short: "Size, speed and distortion of the distribution codec on real next-token distributions",
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := llamacpp.Load(bf.model, llamacpp.Options{Threads: bf.threads})
			if err != nil {
				return err
			}
			defer m.Close()
			prompts, err := bf.loadPrompts(1)
			if err != nil {
				return err
			}
			d, err := decoder.New(m, decoder.Options{MaxPassages: 8, CtxPerSeq: 1024, Threads: bf.threads})
			if err != nil {
				return err
			}
			defer d.Close()
			// The distributions a side sends: its aggregated p^s at each
			// step of a sampled generation (temperature 1, as drafts are).
			var dists [][]float32
			var drafted []int32
			sp := sampling.Params{Temperature: 1, Seed: 1}
			for _, p := range prompts {
				rng := sp.NewRand()
				if err := d.Begin(cmd.Context(), p.Query, p.Passages, nil); err != nil {
					return err
				}
				for range maxTokens {
					mix, err := d.Next(cmd.Context())
					if err != nil {
						return err
					}
					tok := sampling.Draw(mix, rng)
					dists = append(dists, append([]float32(nil), mix...))
					drafted = append(drafted, tok)
					if m.IsEOG(engine.Token(tok)) {
						break
					}
					d.Push(tok)
				}
			}
			res, err := codec.Bench(dists, drafted)
			if err != nil {
				return err
			}
			if bf.asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d tokens, vocab %d, top-p %.2f: %.1f bytes/token, %.0f× smaller than fp32, %.0f× than JSON, %.1f µs encode+decode, TVD %v\n",
				res.Tokens, res.Vocab, res.TopP, res.BytesPerToken, res.RatioVsFP32, res.RatioVsJSON, res.EncDecUS, res.TVD)
			return nil
		},
	}
	bf.register(cmd)
	cmd.Flags().IntVar(&maxTokens, "max-tokens", 32, "tokens generated per prompt")
	return cmd
}
