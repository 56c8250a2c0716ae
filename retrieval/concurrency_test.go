package retrieval

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentSearchWhileWriting runs searches from many goroutines while
// one goroutine adds and deletes files. Run it with -race.
func TestConcurrentSearchWhileWriting(t *testing.T) {
	// 24: the index grows from 8 passages to 32, past it (the graph is
	// built), shrinks to 20 (dropped) and grows again (built again).
	paths := append(densePaths, struct {
		name     string
		exactMax int
	}{"graph built and dropped", 24})
	for _, dp := range paths {
		t.Run(dp.name, func(t *testing.T) { testConcurrentSearchWhileWriting(t, dp.exactMax) })
	}
}

func testConcurrentSearchWhileWriting(t *testing.T, exactMax int) {
	ix, _, _ := buildTestIndex(t, Options{CommitEvery: 3, EmbedBatch: 2, ExactDenseMax: exactMax})
	extra := filepath.Join(t.TempDir(), "extra")
	files := map[string]string{}
	for i := range 12 {
		files[fmt.Sprintf("f%02d.txt", i)] = fmt.Sprintf("Document %d tells of lighthouse number %d, its keeper and the stormy sea around it. ", i, i) +
			"The keeper rows to town for bread and cash every week."
	}
	writeFiles(t, extra, files)

	var (
		wg       sync.WaitGroup
		stop     = make(chan struct{})
		searches atomic.Int64
	)
	queries := []string{"lighthouse keeper", "bread oven", "sea whales", "rapid automobile", "physician"}
	modes := []Mode{ModeBM25, ModeDense, ModeHybrid}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				q, m := queries[(g+i)%len(queries)], modes[(g+i)%len(modes)]
				hits, err := ix.Search(t.Context(), q, 5, m)
				if !assert.NoError(t, err) {
					return
				}
				for _, h := range hits {
					assert.NotEmpty(t, h.Passage.Text)
					assert.NotEmpty(t, h.Passage.Source)
				}
				_ = ix.Stats()
				_ = Weights(hits)
				searches.Add(1)
			}
		}()
	}

	for name := range files {
		_, err := ix.Add(t.Context(), filepath.Join(extra, name))
		require.NoError(t, err)
	}
	for i := 0; i < 12; i += 2 {
		_, err := ix.Delete(filepath.Join(extra, fmt.Sprintf("f%02d.txt", i)))
		require.NoError(t, err)
	}
	rep, err := ix.Add(t.Context(), extra)
	require.NoError(t, err)
	assert.Equal(t, 6, rep.Files, "deleted files come back, the others are unchanged")
	assert.Equal(t, 6, rep.Unchanged)
	close(stop)
	wg.Wait()
	assert.Positive(t, searches.Load())

	hits, err := ix.Search(t.Context(), "lighthouse number 7", 3, ModeHybrid)
	require.NoError(t, err)
	require.NotEmpty(t, hits)
	assert.Equal(t, len(testCorpus)+12, ix.Stats().Manifest.Files)
}

func TestProgressIsReported(t *testing.T) {
	var mu sync.Mutex
	last := map[Phase]Progress{}
	var order []Phase
	opts := Options{CommitEvery: 2, Progress: func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		if len(order) == 0 || order[len(order)-1] != p.Phase {
			order = append(order, p.Phase)
		}
		if prev, ok := last[p.Phase]; ok && prev.Total == p.Total {
			assert.GreaterOrEqual(t, p.Done, prev.Done, "progress must not go back")
		}
		last[p.Phase] = p
	}}
	ix, _, _ := buildTestIndex(t, opts)
	n := ix.Stats().Manifest.Passages
	assert.Equal(t, Progress{Phase: PhaseScan, Done: len(testCorpus), Total: len(testCorpus)}, last[PhaseScan])
	assert.Equal(t, Progress{Phase: PhaseRead, Done: len(testCorpus), Total: len(testCorpus)}, last[PhaseRead])
	assert.Equal(t, Progress{Phase: PhaseEmbed, Done: n, Total: n}, last[PhaseEmbed])
	assert.Equal(t, Progress{Phase: PhaseIndex, Done: n, Total: n}, last[PhaseIndex])
	assert.Equal(t, []Phase{PhaseScan, PhaseRead}, order[:2])
}
