package retrievalbench

import (
	"context"
	"fmt"
	"time"

	"github.com/dragon-rag/dragon/retrieval"
)

// EmbedRate is how many of texts e embeds per second, after one warm-up
// call on the first few (context creation and first-touch of the weights
// are not what a long ingest pays per passage).
func EmbedRate(ctx context.Context, e retrieval.Embedder, texts []string) (float64, error) {
	if len(texts) < 2 {
		return 0, fmt.Errorf("retrievalbench: embed rate needs texts")
	}
	if _, err := e.Embed(ctx, texts[:min(4, len(texts))]); err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := e.Embed(ctx, texts); err != nil {
		return 0, err
	}
	return float64(len(texts)) / time.Since(start).Seconds(), nil
}
