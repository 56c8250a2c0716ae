package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/nodebench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
)

func init() { benchCommands = append(benchCommands, newBenchNodeCmd) }

func newBenchNodeCmd() *cobra.Command {
	var (
		bf      benchFlags
		windows int
	)
	cmd := &cobra.Command{
		Use:   "node",
		Short: "One side's RAG node: retrieval vs TTFT, decode cost by passages, perplexity with and without retrieval",
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := llamacpp.Load(bf.model, llamacpp.Options{Threads: bf.threads})
			if err != nil {
				return err
			}
			defer m.Close()
			ix, closeIx, err := openIndex(bf.cloudIndex, m, bf.threads)
			if err != nil {
				return fmt.Errorf("%w (build it with `make index`)", err)
			}
			defer closeIx()
			queries := promptset.Questions
			if bf.prompts != "" {
				ps, err := promptset.LoadJSONL(bf.prompts)
				if err != nil {
					return err
				}
				queries = queries[:0:0]
				for _, p := range ps {
					q := p.Search
					if q == "" {
						q = p.Query
					}
					queries = append(queries, q)
				}
			}
			texts, sources, err := promptset.Windows(filepath.Join(bf.corpus, "sotu"), windows, 96)
			if err != nil {
				return err
			}
			var ws []nodebench.Window
			for i := range texts {
				ws = append(ws, nodebench.Window{Source: sources[i], Text: texts[i]})
			}
			res, err := nodebench.Run(cmd.Context(), m, nodebench.Options{
				Threads: bf.threads, Queries: queries, Index: basenameSources{ix}, Windows: ws,
			})
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), res)
		},
	}
	bf.register(cmd)
	cmd.Flags().IntVar(&windows, "windows", 16, "held-out perplexity windows")
	return cmd
}

// basenameSources reports passage sources by file name, so held-out
// windows can exclude their own document however the index was built.
type basenameSources struct{ retrieval.Searcher }

func (b basenameSources) Search(ctx context.Context, q string, k int, mode retrieval.Mode) ([]retrieval.Hit, error) {
	hits, err := b.Searcher.Search(ctx, q, k, mode)
	for i := range hits {
		hits[i].Passage.Source = filepath.Base(hits[i].Passage.Source)
	}
	return hits, err
}
