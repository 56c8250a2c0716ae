package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/retrievalbench"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
)

func newIndexSynthCmd(fl *indexFlags) *cobra.Command {
	var (
		from, out string
		passages  int
		seed      uint64
	)
	cmd := &cobra.Command{
		Use:   "synth --passages N --from CORPUS --out DIR",
		Short: "Write a clearly labelled synthetic corpus of about N passages, from a real corpus's word statistics",
		Long: `No Wikipedia-scale corpus can be fetched here, so latency and recall at scale
are measured on synthetic text: words drawn from the real corpus's
frequencies (its vocabulary, so BM25's document frequencies look real) in
sentences of its lengths, about N passages of --chunk-tokens once chunked.
Every file starts with a line saying it is synthetic. Index it like any
folder, with random vectors (no embedding model could embed millions of
passages here):

  dragon index build --dir DIR/index --embed-model random DIR
  dragon index build --retrieval weaviate://HOST:PORT/Synth --embed-model random DIR

No quality figure may come from it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if passages <= 0 || out == "" {
				return fmt.Errorf("give --passages N > 0 and --out DIR")
			}
			var texts []string
			err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(p, ".txt") {
					return err
				}
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				texts = append(texts, string(b))
				return nil
			})
			if err != nil {
				return fmt.Errorf("%w (make wiki fetches the default corpus)", err)
			}
			model, err := retrievalbench.LearnText(texts)
			if err != nil {
				return fmt.Errorf("%s: %w", from, err)
			}
			// Tokens per synthetic word, by the chunker's tokenizer.
			m, err := llamacpp.Load(fl.model, llamacpp.Options{Threads: 1})
			if err != nil {
				return err
			}
			defer m.Close()
			perWord, err := model.TokensPerWord(m)
			if err != nil {
				return err
			}
			words := retrievalbench.SynthWords(passages, fl.chunkTokens, perWord)
			files, err := retrievalbench.WriteSynthCorpus(out, model, words, 0, seed)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d files of synthetic text into %s: %d words (%.2f tokens a word), about %d passages of %d tokens, from the %d-word vocabulary of %s\n",
				files, out, words, perWord, passages, fl.chunkTokens, model.Vocabulary(), from)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "data/corpus/wiki", "real corpus whose word statistics the text follows (make wiki)")
	cmd.Flags().StringVar(&out, "out", "", "folder to write the synthetic files into")
	cmd.Flags().IntVar(&passages, "passages", 0, "about how many passages the text makes")
	cmd.Flags().IntVar(&fl.chunkTokens, "chunk-tokens", retrieval.DefaultChunkTokens, "tokens per passage the count is for")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed")
	return cmd
}
