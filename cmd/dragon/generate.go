package main

import (
	"encoding/json"
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
		raw, asJSON                bool
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
			enc := json.NewEncoder(out)
			decodeStart := time.Now()
			for ; n < maxTokens; n++ {
				if logits, err = c.Logits(row, logits); err != nil {
					return err
				}
				probs = sp.Dist(logits, history, probs)
				t := sampling.Draw(probs, rng)
				eog := m.IsEOG(t)
				if asJSON {
					// The end-of-generation token is written too: which
					// step a build stops at is part of what it decided.
					g := newGeneratedToken(t, logits)
					if g.EOG = eog; !eog {
						g.Text = detok.Add(t)
					}
					if err := enc.Encode(g); err != nil {
						return fmt.Errorf("write token: %w", err)
					}
				} else if !eog {
					fmt.Fprint(out, detok.Add(t))
				}
				if eog {
					break
				}
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
			if !asJSON {
				fmt.Fprintln(out, detok.Flush())
			}
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
	f.BoolVar(&asJSON, "json", false, "write one JSON object per token, the end-of-generation one included (id, text, logit, the runner-up and its logit), instead of the text, to compare builds")
	f.IntVar(&threads, "threads", 2, "compute threads")
	f.IntVar(&maxTokens, "max-tokens", 128, "most tokens to generate")
	f.IntVar(&ctxLen, "ctx", 2048, "context length")
	addSamplingFlags(f, &sp)
	return cmd
}

// generatedToken is one token of `dragon generate --json`. With the
// runner-up's logit beside its own, two builds whose kernels round
// differently (x86 and arm64) can be compared step by step: where they pick
// different tokens, a margin (Logit - RunnerUpLogit) within the logits'
// drift between the builds says why.
type generatedToken struct {
	ID            engine.Token `json:"id"`
	Text          string       `json:"text"`
	EOG           bool         `json:"eog,omitempty"` // the end of generation (no text)
	Logit         float32      `json:"logit"`
	RunnerUp      engine.Token `json:"runner_up"`
	RunnerUpLogit float32      `json:"runner_up_logit"`
}

// newGeneratedToken describes t from the raw logits it was drawn from.
func newGeneratedToken(t engine.Token, logits []float32) generatedToken {
	g := generatedToken{ID: t, Logit: logits[t], RunnerUp: -1}
	for i, l := range logits {
		if engine.Token(i) != t && (g.RunnerUp < 0 || l > g.RunnerUpLogit) {
			g.RunnerUp, g.RunnerUpLogit = engine.Token(i), l
		}
	}
	return g
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
