package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
)

func newIndexPushCmd(fl *indexFlags) *cobra.Command {
	var (
		to     string
		batch  int
		layout weaviate.Layout
	)
	cmd := &cobra.Command{
		Use:   "push --dir DIR --to weaviate://HOST:PORT/COLLECTION",
		Short: "Copy an index's passages, terms and vectors into a Weaviate collection (idempotent)",
		Long: `Creates the collection for the index's embedder and chunking if it is absent
(--shards, --replicas place it on the cluster; 2 replicas survive losing a
node) and writes every passage in batches. Passages are keyed by source and
span, so pushing again, or pushing a rebuilt index, replaces rather than
duplicates; an interrupted push is finished by running it again. A cloud
then serves the collection with --index weaviate://HOST:PORT/COLLECTION.
The API key comes from $DRAGON_WEAVIATE_API_KEY.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := weaviate.Open(to)
			if err != nil {
				return err
			}
			defer store.Close()
			ix, err := retrieval.Open(fl.dir, retrieval.Options{ReadOnly: true})
			if err != nil {
				return err
			}
			defer ix.Close()
			start := time.Now()
			bar := newProgressBar(os.Stderr, fl.quiet)
			failed, err := retrieval.Push(cmd.Context(), ix, store, layout, batch, bar.update)
			bar.done()
			printNotStored(os.Stderr, failed, fl.maxErrors)
			if err != nil {
				return err
			}
			n, err := store.Count(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s to %s in %v: %d failed; the collection holds %d passages\n",
				fl.dir, store, time.Since(start).Round(time.Millisecond), len(failed), n)
			if len(failed) > 0 {
				return fmt.Errorf("%d passages not stored", len(failed))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "collection URL: weaviate://HOST:PORT/COLLECTION or weaviate+https://...")
	cmd.Flags().IntVar(&batch, "batch", 256, "passages per request")
	layoutFlags(cmd.Flags(), &layout, "")
	cobra.MarkFlagRequired(cmd.Flags(), "to")
	return cmd
}
