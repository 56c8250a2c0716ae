package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/profiler"
)

func init() { commands = append(commands, newProfileCmd) }

func newProfileCmd() *cobra.Command {
	var (
		modelPath, out                        string
		threads, passages, words, steps, runs int
		ctxPerSeq                             int
	)
	cmd := &cobra.Command{
		Use:   "profile --out FILE",
		Short: "Fit this machine's decoding latency against context length (DRAGON §5.2) for the scheduler",
		Long: `Decodes with dummy passages (random words, --passages sequences of about
--words words each, prefilled first), as a generation over that many
passages would, until the context reaches --steps tokens past the passages;
records each step's median time over --runs runs against the context length
and fits c_dec(t) = k_a·t/k_b + k_c by least squares. The daemons load the
result with --profile and send it to their peer at handshake.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if passages < 1 || words < 1 || steps < 2 || runs < 1 || threads < 1 {
				return fmt.Errorf("need --passages, --words, --runs, --threads ≥ 1 and --steps ≥ 2")
			}
			m, err := llamacpp.Load(modelPath, llamacpp.Options{Threads: threads})
			if err != nil {
				return err
			}
			defer m.Close()
			d, err := decoder.New(m, decoder.Options{MaxPassages: passages, CtxPerSeq: ctxPerSeq, Threads: threads})
			if err != nil {
				return err
			}
			defer d.Close()
			ts, ms, err := decoder.ProfileDecode(cmd.Context(), d, dummyPassages(passages, words), steps, runs)
			if err != nil {
				return err
			}
			fit, err := profiler.Fit(ts, ms)
			if err != nil {
				return err
			}
			var se float64
			for i, t := range ts {
				e := fit.At(t) - ms[i]
				se += e * e
			}
			p := profiler.Profile{Fit: fit, Passages: passages, Threads: threads, Model: m.Info().Name, Samples: len(ts), RMSE: math.Sqrt(se / float64(len(ts)))}
			if err := p.Save(out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "c_dec(t) = %.5f·t + %.2f ms (t = %.0f…%.0f, RMSE %.2f ms over %d steps) → %s\n",
				fit.Slope(), fit.Kc, ts[0], ts[len(ts)-1], p.RMSE, len(ts), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", defaultModel(), "GGUF model file")
	f.StringVar(&out, "out", "", "file to write the fit to (JSON)")
	f.IntVar(&threads, "threads", 1, "compute threads (as the daemon will run)")
	f.IntVar(&passages, "passages", 2, "passages (sequences) per generation, as the daemon will decode")
	f.IntVar(&words, "words", 48, "words per dummy passage (about a passage of the index)")
	f.IntVar(&steps, "steps", 160, "decoding steps per run")
	f.IntVar(&runs, "runs", 3, "runs; each step's time is the median")
	f.IntVar(&ctxPerSeq, "ctx", 1024, "KV positions per passage sequence")
	return cmd
}

// dummyPassages are n texts of random common words, seeded.
func dummyPassages(n, words int) []string {
	vocab := strings.Fields("the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people mr how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three")
	r := rand.New(rand.NewPCG(7, 7))
	out := make([]string, n)
	for i := range out {
		ws := make([]string, words)
		for j := range ws {
			ws[j] = vocab[r.IntN(len(vocab))]
		}
		out[i] = strings.Join(ws, " ")
	}
	return out
}
