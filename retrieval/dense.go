package retrieval

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"slices"

	"github.com/coder/hnsw"
	"github.com/viterin/vek/vek32"
)

// DefaultExactDenseMax is the largest index whose dense search scores
// every vector, reading them all from the vectors file (15 MB and about
// 5 ms at 384 dimensions); larger ones score those nearest by their codes
// (see vectorStore), which finds 99.5% of the exact top 8 on MiniLM.
const DefaultExactDenseMax = 10_000

// readGraph reads the HNSW graph file of an index of format 1, or of a
// later one that kept a graph: its nodes hold the index's vectors, which
// the next checkpoint writes to a vectors file.
func readGraph(path string) (*hnsw.Graph[uint64], error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g := hnsw.NewGraph[uint64]()
	if err := g.Import(bufio.NewReaderSize(f, 1<<20)); err != nil {
		return nil, fmt.Errorf("import %s: %w", graphFile, err)
	}
	return g, nil
}

// better orders by score, best first, then by id.
func better(a, b scored) bool {
	return a.score > b.score || a.score == b.score && a.id < b.id
}

// topScored sorts by score, best first, ties by id (map order must not
// leak into results), and keeps n.
func topScored(s []scored, n int) []scored {
	slices.SortFunc(s, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return s[:min(n, len(s))]
}

// dot uses vek's SIMD kernels: five times faster than a plain loop for
// the exact scan.
func dot(a, b []float32) float32 { return vek32.Dot(a, b) }

// unit returns v scaled to length 1, or an error for a zero or non-finite
// vector (which would make every cosine NaN).
func unit(v []float32) ([]float32, error) {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return normalize(f)
}
