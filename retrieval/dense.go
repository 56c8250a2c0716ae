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
	"github.com/viterin/vek/vek32"

	"github.com/dragon-rag/dragon/internal/atomicfile"
)

// HNSW parameters: M and Ml are the library's defaults; efSearch is raised
// from 20 because candidates are re-ranked exactly and a wider beam costs
// little next to embedding the query.
const (
	hnswM       = 16
	hnswMl      = 0.25
	hnswEf      = 96
	hnswSeed    = 1
	hnswMinPool = 256 // the fewest candidates asked of the graph
	// DefaultExactDenseMax is the largest index searched by scanning every
	// vector instead of through the graph (about 50 ms at 576 dimensions).
	DefaultExactDenseMax = 100_000
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
	return atomicfile.Write(path, func(w io.Writer) error { return g.Export(w) })
}

// graphSearch returns up to n live passages nearest to the unit vector q,
// by exact cosine, best first. coder/hnsw's beam search stops as soon as a
// step fails to improve the best candidate, so its recall is low (0.3 for
// the top 8 out of 32 candidates on 1,100 SmolLM2 passage vectors, 0.6 out
// of 128): it is asked for many candidates, plus one per deleted node
// still in the graph, and they are re-ranked exactly. The caller holds the
// lock that excludes graph writers.
func graphSearch(g *hnsw.Graph[uint64], q []float32, n, dead int, live func(uint64) bool) []scored {
	if g.Len() == 0 {
		return nil
	}
	nodes := g.Search(q, max(8*n, hnswMinPool)+dead)
	out := make([]scored, 0, len(nodes))
	for _, nd := range nodes {
		if live(nd.Key) {
			out = append(out, scored{nd.Key, float64(dot(q, nd.Value))})
		}
	}
	return topScored(out, n)
}

// exactSearch scores every vector: for indexes up to a few hundred
// thousand passages this costs less than embedding the query, and it is
// exact and reproducible.
func exactSearch(vecs map[uint64][]float32, q []float32, n int) []scored {
	// Keep the n best in order as we go; most vectors fail the first
	// comparison, so this beats sorting all of them.
	top := make([]scored, 0, n+1)
	for id, v := range vecs {
		s := scored{id, float64(dot(q, v))}
		if len(top) == n && !better(s, top[n-1]) {
			continue
		}
		i, _ := slices.BinarySearchFunc(top, s, func(a, b scored) int {
			if better(a, b) {
				return -1
			}
			return 1
		})
		top = slices.Insert(top, i, s)
		if len(top) > n {
			top = top[:n]
		}
	}
	return top
}

// exactSearchWhere is exactSearch among the vectors keep lets through.
func exactSearchWhere(vecs map[uint64][]float32, q []float32, n int, keep func(uint64) bool) []scored {
	var out []scored
	for id, v := range vecs {
		if keep(id) {
			out = append(out, scored{id, float64(dot(q, v))})
		}
	}
	return topScored(out, n)
}

// better orders by score, best first, then by id.
func better(a, b scored) bool {
	return a.score > b.score || a.score == b.score && a.id < b.id
}

// topScored sorts by score, best first, ties by id (map order and HNSW's
// random entry point must not leak into results), and keeps n.
func topScored(s []scored, n int) []scored {
	slices.SortFunc(s, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return s[:min(n, len(s))]
}

// rebuildGraph builds a fresh graph of the given vectors. coder/hnsw's own
// Delete can leave dangling entry points (issues #10 and #13 of
// coder/hnsw), so deleted nodes are only ever dropped by a rebuild.
func rebuildGraph(vecs map[uint64][]float32) *hnsw.Graph[uint64] {
	ids := make([]uint64, 0, len(vecs))
	for id := range vecs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	g := newGraph()
	for _, id := range ids {
		g.Add(hnsw.MakeNode(id, vecs[id]))
	}
	return g
}

// dot uses vek's SIMD kernels (already linked in by coder/hnsw): five
// times faster than a plain loop for the exact scan.
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
