package retrieval

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math/rand"
	"os"
	"slices"

	"github.com/coder/hnsw"
)

// HNSW parameters: M and Ml are the library's defaults; efSearch is raised
// from 20 because search results are re-ranked exactly and a wider beam
// costs little next to embedding the query.
const (
	hnswM        = 16
	hnswMl       = 0.25
	hnswEf       = 96
	hnswSeed     = 1
	denseMinPool = 32 // the fewest candidates asked of the graph
)

// newGraph returns an empty graph with a fixed seed, so that building the
// same corpus twice gives the same graph.
func newGraph() *hnsw.Graph[uint64] {
	g := hnsw.NewGraph[uint64]()
	g.M = hnswM
	g.Ml = hnswMl
	g.EfSearch = hnswEf
	g.Distance = hnsw.CosineDistance
	g.Rng = rand.New(rand.NewSource(hnswSeed))
	return g
}

func readGraph(path string) (*hnsw.Graph[uint64], error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g := newGraph()
	if err := g.Import(bufio.NewReaderSize(f, 1<<20)); err != nil {
		return nil, fmt.Errorf("import %s: %w", graphFile, err)
	}
	// Import takes the parameters from the file; keep ours.
	g.EfSearch = hnswEf
	g.Rng = rand.New(rand.NewSource(hnswSeed))
	return g, nil
}

func writeGraph(path string, g *hnsw.Graph[uint64]) error {
	return writeFileAtomic(path, func(w io.Writer) error { return g.Export(w) })
}

// graphSearch returns up to n live passages nearest to the unit vector q,
// by exact cosine, best first. The graph may still hold deleted passages
// (live reports which are not), so it is asked for extra candidates.
// The caller holds the lock that excludes graph writers.
func graphSearch(g *hnsw.Graph[uint64], q []float32, n, dead int, live func(uint64) bool) []scored {
	if g.Len() == 0 {
		return nil
	}
	nodes := g.Search(q, max(n, denseMinPool)+dead)
	out := make([]scored, 0, len(nodes))
	for _, nd := range nodes {
		if live(nd.Key) {
			out = append(out, scored{nd.Key, float64(dot(q, nd.Value))})
		}
	}
	// HNSW's order is approximate and its entry point varies; an exact
	// re-rank with a stable tie-break makes results reproducible.
	slices.SortFunc(out, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out[:min(n, len(out))]
}

// rebuildGraph builds a fresh graph of the live passages' vectors, taken
// from g. coder/hnsw's own Delete can leave dangling entry points (issues
// #10 and #13 of coder/hnsw), so deleted nodes are only ever dropped by a
// rebuild.
func rebuildGraph(g *hnsw.Graph[uint64], ids []uint64) (*hnsw.Graph[uint64], error) {
	slices.Sort(ids)
	ng := newGraph()
	for _, id := range ids {
		v, ok := g.Lookup(id)
		if !ok {
			return nil, fmt.Errorf("passage %d has no vector in the graph", id)
		}
		ng.Add(hnsw.MakeNode(id, v))
	}
	return ng, nil
}

func dot(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// unit returns v scaled to length 1, or an error for a zero or non-finite
// vector (which would make every cosine NaN).
func unit(v []float32) ([]float32, error) {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return normalize(f)
}
