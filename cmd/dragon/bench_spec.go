package main

import (
	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/bench/specbench"
	"github.com/dragon-rag/dragon/engine/llamacpp"
)

func init() { benchCommands = append(benchCommands, newBenchSpecCmd) }

// hardPrompts ask for text that is in no passage: context drafts fail.
var hardPrompts = []promptset.Prompt{
	{Query: "Write a short poem about a cat who learns to fly."},
	{Query: "Invent a name for a new color and describe it."},
	{Query: "List five unusual uses for a paperclip."},
	{Query: "Describe the taste of an imaginary fruit from another planet."},
	{Query: "Tell a two-sentence story about a lighthouse keeper and a whale."},
	{Query: "Give three tips for learning to juggle."},
	{Query: "Write a haiku about autumn rain."},
	{Query: "Explain why the sky looks blue, in simple words."},
}

func newBenchSpecCmd() *cobra.Command {
	var (
		bf        benchFlags
		maxTokens int
		heldOut   bool
	)
	cmd := &cobra.Command{
		Use:   "spec",
		Short: "Local speculative decoding against plain decoding on a RAG prompt set, with an ablation",
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := llamacpp.Load(bf.model, llamacpp.Options{Threads: bf.threads})
			if err != nil {
				return err
			}
			defer m.Close()
			load := bf.loadPrompts
			if heldOut {
				load = func(passages int) ([]promptset.Prompt, error) { return promptset.HeldOut(bf.corpus, bf.n, passages) }
			}
			p1, err := load(1)
			if err != nil {
				return err
			}
			p4, err := load(4)
			if err != nil {
				return err
			}
			res, err := specbench.Run(cmd.Context(), m, specbench.Options{
				Threads: bf.threads, MaxTokens: maxTokens, Prompts1: p1, Prompts4: p4, Hard: hardPrompts,
			})
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), res)
		},
	}
	bf.register(cmd)
	cmd.Flags().IntVar(&maxTokens, "max-tokens", 64, "tokens generated per prompt")
	cmd.Flags().BoolVar(&heldOut, "held-out", false, "the held-out prompt set (promptset.HeldOut: questions and documents no benchmark was tuned on) instead of the built-in one")
	return cmd
}
