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
		to               string
		shards, replicas int
		batch, searchEf  int
		quantizer        string
		graphM, graphEfc int
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
			failed, err := retrieval.Push(cmd.Context(), ix, store, weaviate.Layout{Shards: shards, Replicas: replicas, SearchEf: searchEf, Quantizer: quantizer, GraphConnections: graphM, GraphEfConstruction: graphEfc}, batch, bar.update)
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
	cmd.Flags().IntVar(&shards, "shards", 1, "shards of a new collection")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas of each shard of a new collection")
	cmd.Flags().IntVar(&batch, "batch", 256, "passages per request")
	cmd.Flags().IntVar(&searchEf, "search-ef", 0, "the collection's query-time HNSW candidate list (0: 256 for a new collection, an existing one's kept); longer finds more true nearest vectors, slower")
	cmd.Flags().IntVar(&graphM, "graph-connections", 0, "the HNSW graph of a new collection: links per node (0: 32); more find more true nearest vectors at a given search ef, for a slower ingest")
	cmd.Flags().IntVar(&graphEfc, "graph-ef-construction", 0, "the HNSW graph of a new collection: candidate list while linking (0: 128); longer builds a better graph, for a slower ingest")
	cmd.Flags().StringVar(&quantizer, "quantizer", "", "the collection's vector quantizer: empty for float32 vectors (an existing collection keeps its own) or rq (8-bit rotational quantization: about 30% less engine memory at 10^6 passages, searches no faster there; cannot be turned off)")
	cobra.MarkFlagRequired(cmd.Flags(), "to")
	return cmd
}
