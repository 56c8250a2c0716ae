package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/sampling"
)

func init() { commands = append(commands, newGenerateCmd) }

func newGenerateCmd() *cobra.Command {
	var (
		modelPath, prompt, system  string
		threads, maxTokens, ctxLen int
		raw                        bool
		sp                         sampling.Params
	)
	cmd := &cobra.Command{
		Use:   "generate --prompt TEXT",
		Short: "Generate an answer with the model alone (no retrieval), streaming tokens",
		RunE: func(cmd *cobra.Command, args []string) error {
			if prompt == "" {
				return errors.New("--prompt is empty")
			}
			if err := sp.Validate(); err != nil {
				return err
			}
			m, err := llamacpp.Load(modelPath, llamacpp.Options{Threads: threads})
			if err != nil {
				return err
			}
			defer m.Close()
			text := prompt
			if !raw {
				var msgs []engine.Message
				if system != "" {
					msgs = append(msgs, engine.Message{Role: engine.RoleSystem, Content: system})
				}
				msgs = append(msgs, engine.Message{Role: engine.RoleUser, Content: prompt})
				if text, err = m.ChatPrompt(msgs, true); err != nil {
					return err
				}
			}
			toks, err := m.Tokenize(text, true, true)
			if err != nil {
				return err
			}
			c, err := m.NewContext(engine.ContextOptions{CtxPerSeq: ctxLen, MaxSeqs: 1, BatchSize: 512, Threads: threads})
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			start := time.Now()
			b, err := engine.Prefill(ctx, c, 0, toks, nil)
			if err != nil {
				return err
			}
			ttft := time.Since(start)
			out := cmd.OutOrStdout()
			detok := engine.NewDetokenizer(m)
			rng := sp.NewRand()
			var logits, probs []float32
			history := append([]engine.Token(nil), toks...)
			row := b.Len() - 1
			n := 0
			decodeStart := time.Now()
			for ; n < maxTokens; n++ {
				if logits, err = c.Logits(row, logits); err != nil {
					return err
				}
				probs = sp.Dist(logits, history, probs)
				t := sampling.Draw(probs, rng)
				if m.IsEOG(t) {
					break
				}
				fmt.Fprint(out, detok.Add(t))
				history = append(history, t)
				if c.SeqLen(0) >= ctxLen {
					break
				}
				b.Reset()
				b.Add(t, c.SeqLen(0), true, 0)
				if err := c.Decode(ctx, b); err != nil {
					return err
				}
				row = 0
			}
			fmt.Fprintln(out, detok.Flush())
			if n > 0 {
				fmt.Fprintf(os.Stderr, "[%d prompt tokens, ttft %v, %d tokens at %.1f tok/s]\n", len(toks),
					ttft.Round(time.Millisecond), n, float64(n)/time.Since(decodeStart).Seconds())
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", defaultModel(), "GGUF model file")
	f.StringVar(&prompt, "prompt", "", "the question")
	f.StringVar(&system, "system", "", "optional system message")
	f.BoolVar(&raw, "raw", false, "send the prompt as is, without the chat template")
	f.IntVar(&threads, "threads", 2, "compute threads")
	f.IntVar(&maxTokens, "max-tokens", 128, "most tokens to generate")
	f.IntVar(&ctxLen, "ctx", 2048, "context length")
	addSamplingFlags(f, &sp)
	return cmd
}

// addSamplingFlags registers the sampling parameters on a command.
func addSamplingFlags(f *pflag.FlagSet, sp *sampling.Params) {
	f.Float64Var(&sp.Temperature, "temperature", 0, "sampling temperature (0: greedy)")
	f.IntVar(&sp.TopK, "top-k", 0, "top-k (0: off)")
	f.Float64Var(&sp.TopP, "top-p", 0, "top-p (0: off)")
	f.Float64Var(&sp.MinP, "min-p", 0, "min-p (0: off)")
	f.Float64Var(&sp.RepeatPenalty, "repeat-penalty", 0, "repetition penalty (0 or 1: off)")
	f.Uint64Var(&sp.Seed, "seed", 0, "sampling seed")
}
