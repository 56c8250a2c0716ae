package kvcache_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/kvcache"
)

const ns = "model=test;engine=test"

// Puts write outside the lock, and drops wait for them: none may be left
// running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seq is n tokens of family f; seq(f, m) is a prefix of seq(f, n) for m < n
// and two families share no token.
func seq(f, n int) []engine.Token {
	out := make([]engine.Token, n)
	for i := range out {
		out[i] = engine.Token(f*1_000_000 + i)
	}
	return out
}

// branch is seq(f, at) followed by tokens of branch b up to n tokens: two
// branches of one family share exactly at tokens.
func branch(f, at, b, n int) []engine.Token {
	out := seq(f, at)
	for i := at; i < n; i++ {
		out = append(out, engine.Token(-(f*1_000_000 + b*10_000 + i)))
	}
	return out
}

// cat concatenates token slices into a new one.
func cat(parts ...[]engine.Token) []engine.Token {
	var out []engine.Token
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// stateFor is the state of an n-token entry: n*10 bytes, each byte(n), so
// a hit's state says which entry length it came from.
func stateFor(n int) []byte { return bytes.Repeat([]byte{byte(n)}, n*10) }

// fill is a state of size bytes, each b: states of the same size that can
// be told apart.
func fill(size int, b byte) []byte { return bytes.Repeat([]byte{b}, size) }

// logitsFor are the logits after n tokens: 1+n%4 values that say n, so a
// hit's logits say which prefix they follow.
func logitsFor(n int) []float32 {
	v := make([]float32, 1+n%4)
	for i := range v {
		v[i] = float32(n) + 0.25*float32(i)
	}
	return v
}

// isLogitsFor reports whether v are logitsFor(n).
func isLogitsFor(v []float32, n int) bool {
	return slices.Equal(v, logitsFor(n))
}

// quiet is a logger that drops everything.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newCache(t *testing.T, cfg kvcache.Config) *kvcache.Cache {
	t.Helper()
	if cfg.Namespace == "" {
		cfg.Namespace = ns
	}
	if cfg.Log == nil {
		cfg.Log = quiet()
	}
	c, err := kvcache.New(cfg)
	require.NoError(t, err)
	return c
}

func memCache(t *testing.T, budget int64) *kvcache.Cache {
	return newCache(t, kvcache.Config{MemoryBytes: budget})
}

// look is Lookup counting every hit.
func look(c *kvcache.Cache, toks []engine.Token) (kvcache.Hit, bool) {
	return c.Lookup(toks, 0, 0)
}

func TestTierString(t *testing.T) {
	for tier, want := range map[kvcache.Tier]string{
		kvcache.Context: "context", kvcache.Memory: "memory", kvcache.Disk: "disk", kvcache.Tier(7): "tier(7)",
	} {
		assert.Equal(t, want, tier.String())
	}
}

func TestNamespace(t *testing.T) {
	assert.Equal(t, "model=abc;engine=b1", kvcache.Namespace("abc", "b1"))
	assert.Equal(t, "model=abc;engine=b1;ctx=4096;kv=f16", kvcache.Namespace("abc", "b1", "ctx=4096", "kv=f16"))
	assert.NotEqual(t, kvcache.Namespace("abc", "b1", "kv=f16"), kvcache.Namespace("abc", "b1", "kv=q8_0"))
}

func TestNewRejectsBadConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	for _, tc := range []struct {
		name string
		cfg  kvcache.Config
		want string
	}{
		{"no namespace", kvcache.Config{MemoryBytes: 1 << 20}, "namespace"},
		{"no namespace with dir", kvcache.Config{Dir: t.TempDir(), DiskBytes: 1 << 20}, "namespace"},
		{"negative memory", kvcache.Config{Namespace: ns, MemoryBytes: -1}, "negative"},
		{"negative disk", kvcache.Config{Namespace: ns, Dir: t.TempDir(), DiskBytes: -1}, "negative"},
		{"dir without disk budget", kvcache.Config{Namespace: ns, MemoryBytes: 1 << 20, Dir: t.TempDir()}, "disk budget"},
		{"dir is a file", kvcache.Config{Namespace: ns, Dir: filepath.Join(file, "sub"), DiskBytes: 1 << 20}, "directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kvcache.New(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, c)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestNewAcceptsMinimalConfigs(t *testing.T) {
	for _, cfg := range []kvcache.Config{
		{Namespace: ns},                                   // no budget at all: a cache that keeps nothing
		{Namespace: ns, MemoryBytes: 100},                 // memory only
		{Namespace: ns, Dir: t.TempDir(), DiskBytes: 100}, // disk only
	} {
		c, err := kvcache.New(cfg) // nil Log: slog.Default
		require.NoError(t, err)
		assert.Equal(t, kvcache.Stats{}, c.Stats())
	}
}

func TestLookupEmptyCache(t *testing.T) {
	c := memCache(t, 1<<20)
	for _, toks := range [][]engine.Token{nil, seq(0, 1), seq(0, 16), seq(0, 100)} {
		_, ok := look(c, toks)
		assert.False(t, ok)
	}
	assert.Equal(t, kvcache.Stats{}, c.Stats(), "a lookup without a hit counts nothing")
}

// TestLookupMatch: a hit shares at least one block, and Match is the whole
// common prefix, partial blocks included, except that without logits for
// the whole prompt its last token is left to decode (Match len-1).
func TestLookupMatch(t *testing.T) {
	entry := seq(1, 40) // two full blocks and 8 tokens
	for _, tc := range []struct {
		name  string
		query []engine.Token
		match int  // 0: no hit
		held  bool // the entry holds the whole query (Has)
	}{
		{"nothing shared", seq(2, 40), 0, false},
		{"one token shared", branch(1, 1, 1, 40), 0, false},
		{"15 shared", branch(1, 15, 1, 40), 0, false},
		{"query of 15 tokens", seq(1, 15), 0, false},
		{"16 shared", branch(1, 16, 1, 40), 16, false},
		{"query of exactly one block: one block shared, its last token to decode", seq(1, 16), 15, true},
		{"17 shared", branch(1, 17, 1, 40), 17, false},
		{"31 shared", branch(1, 31, 1, 64), 31, false},
		{"32 shared", branch(1, 32, 1, 64), 32, false},
		{"36 shared: partial block past the entry's last full one", branch(1, 36, 1, 64), 36, false},
		{"query a prefix of the entry, partial block", seq(1, 20), 19, true},
		{"query the entry", seq(1, 40), 39, true},
		{"query extends the entry", seq(1, 100), 40, false},
		{"query extends the entry's partial block", branch(1, 40, 9, 48), 40, false},
		{"query one past the entry", seq(1, 41), 40, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := memCache(t, 1<<20)
			state := stateFor(40)
			c.Put(entry, state)
			hit, ok := look(c, tc.query)
			if tc.match == 0 {
				assert.False(t, ok)
				assert.Equal(t, kvcache.Hit{}, hit)
				assert.Equal(t, kvcache.Stats{Entries: 1, MemoryBytes: 400}, c.Stats(), "nothing counted")
				assert.False(t, c.Has(tc.query))
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.match, hit.Match)
			assert.Equal(t, 40, hit.Positions)
			assert.Equal(t, kvcache.Memory, hit.Tier)
			assert.Equal(t, state, hit.State)
			assert.Nil(t, hit.Logits, "no logits stored")
			assert.Less(t, hit.Match, len(tc.query), "without logits the last token is decoded")
			assert.Equal(t, uint64(1), c.Stats().Hits[kvcache.Memory])
			assert.Equal(t, tc.held, c.Has(tc.query), "Has: an entry holds or extends the query")
		})
	}
}

// TestLookupLongestOfMany: among entries sharing blocks with the query,
// the one sharing the longest prefix wins, whatever the insertion order.
func TestLookupLongestOfMany(t *testing.T) {
	entries := [][]engine.Token{
		branch(1, 16, 1, 64), // shares 16 with the query
		branch(1, 40, 2, 64), // shares 40
		branch(1, 33, 3, 64), // shares 33
		seq(2, 64),           // another family
		branch(1, 41, 5, 64), // shares 41: one more than the runner-up
	}
	query := branch(1, 64, 4, 80) // seq(1, 64) + more
	for _, order := range [][]int{{0, 1, 2, 3, 4}, {4, 3, 2, 1, 0}, {1, 4, 0, 3, 2}} {
		c := memCache(t, 1<<20)
		for _, i := range order {
			c.Put(entries[i], fill(640, byte(i)))
		}
		require.Equal(t, 5, c.Stats().Entries)
		hit, ok := look(c, query)
		require.True(t, ok)
		assert.Equal(t, 41, hit.Match, "order %v", order)
		assert.Equal(t, fill(640, 4), hit.State, "order %v", order)
		hit, ok = look(c, branch(1, 40, 6, 64)) // shares 40 with entries 1 and 4
		require.True(t, ok)
		assert.Equal(t, 40, hit.Match, "order %v", order)
	}
}

// TestLookupBetter: no hit unless it shares more than what the caller has.
func TestLookupBetter(t *testing.T) {
	entry := seq(1, 48)
	query := branch(1, 20, 1, 48) // match 20
	for _, tc := range []struct {
		better int
		hit    bool
	}{{0, true}, {16, true}, {19, true}, {20, false}, {21, false}, {1000, false}} {
		t.Run(fmt.Sprint("better=", tc.better), func(t *testing.T) {
			c := memCache(t, 1<<20)
			c.Put(entry, stateFor(48))
			hit, ok := c.Lookup(query, tc.better, 0)
			assert.Equal(t, tc.hit, ok)
			st := c.Stats()
			if tc.hit {
				assert.Equal(t, 20, hit.Match)
				assert.Equal(t, uint64(1), st.Hits[kvcache.Memory])
			} else {
				assert.Equal(t, kvcache.Hit{}, hit)
				assert.Equal(t, [3]uint64{}, st.Hits, "no hit: the caller counts")
				assert.Equal(t, uint64(0), st.Misses, "no hit: the caller counts")
			}
		})
	}
}

// TestLookupCounts: a hit shorter than counts is a hit for the caller but
// a miss in the counters.
func TestLookupCounts(t *testing.T) {
	entry := seq(1, 48)
	query := branch(1, 20, 1, 48) // match 20
	for _, tc := range []struct {
		counts       int
		hits, misses uint64
	}{{0, 1, 0}, {16, 1, 0}, {20, 1, 0}, {21, 0, 1}, {48, 0, 1}} {
		t.Run(fmt.Sprint("counts=", tc.counts), func(t *testing.T) {
			c := memCache(t, 1<<20)
			c.Put(entry, stateFor(48))
			hit, ok := c.Lookup(query, 0, tc.counts)
			require.True(t, ok, "counts never refuses a hit")
			assert.Equal(t, 20, hit.Match)
			assert.Equal(t, kvcache.Memory, hit.Tier)
			st := c.Stats()
			assert.Equal(t, tc.hits, st.Hits[kvcache.Memory])
			assert.Equal(t, tc.misses, st.Misses)
			assert.Zero(t, st.Hits[kvcache.Context])
			assert.Zero(t, st.Hits[kvcache.Disk])
		})
	}
}

// TestLookupTieBreakPrefersShorter: of entries sharing as much with the
// query, the shorter one (fewer bytes to restore) wins, whatever the
// insertion order.
func TestLookupTieBreakPrefersShorter(t *testing.T) {
	short := branch(1, 32, 1, 48) // 32 shared with long, then its own 16
	long := branch(1, 32, 2, 96)
	query := branch(1, 32, 3, 64) // shares 32 with both
	for _, order := range []string{"short first", "long first"} {
		t.Run(order, func(t *testing.T) {
			c := memCache(t, 1<<20)
			if order == "short first" {
				c.Put(short, stateFor(48))
				c.Put(long, stateFor(96))
			} else {
				c.Put(long, stateFor(96))
				c.Put(short, stateFor(48))
			}
			require.Equal(t, 2, c.Stats().Entries)
			hit, ok := look(c, query)
			require.True(t, ok)
			assert.Equal(t, 32, hit.Match)
			assert.Equal(t, 48, hit.Positions)
			assert.Equal(t, stateFor(48), hit.State)
			// A query sharing more with the long one takes it (the last
			// of its 50 tokens left to decode).
			hit, ok = look(c, branch(1, 32, 2, 50))
			require.True(t, ok)
			assert.Equal(t, 49, hit.Match)
			assert.Equal(t, 96, hit.Positions)
			hit, ok = look(c, cat(branch(1, 32, 2, 50), seq(8, 10))) // 50 shared, then its own
			require.True(t, ok)
			assert.Equal(t, 50, hit.Match)
			assert.Equal(t, 96, hit.Positions)
		})
	}
}

func TestCountContextHitAndMiss(t *testing.T) {
	c := memCache(t, 1<<20)
	c.CountContextHit()
	c.CountContextHit()
	c.CountMiss()
	st := c.Stats()
	assert.Equal(t, [3]uint64{2, 0, 0}, st.Hits)
	assert.Equal(t, uint64(1), st.Misses)
	assert.Zero(t, st.Entries)
}

// TestPutReplacesPrefix: an entry that a new Put extends goes; the longer
// one serves its prompts.
func TestPutReplacesPrefix(t *testing.T) {
	c := memCache(t, 1<<20)
	c.Put(seq(1, 32), stateFor(32))
	c.Put(seq(1, 48), stateFor(48))
	st := c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(480), st.MemoryBytes, "the replaced entry's bytes are freed")
	assert.Zero(t, st.Evictions[kvcache.Memory], "a replacement is no eviction")
	for _, tc := range []struct {
		query []engine.Token
		match int
	}{{seq(1, 32), 31}, {seq(1, 20), 19}, {seq(1, 48), 47}, {seq(1, 64), 48}} {
		hit, ok := look(c, tc.query)
		require.True(t, ok)
		assert.Equal(t, 48, hit.Positions)
		assert.Equal(t, tc.match, hit.Match, "query of %d", len(tc.query))
		assert.Equal(t, stateFor(48), hit.State)
		assert.Nil(t, hit.Logits)
	}
	// A chain of extensions keeps one entry.
	c.Put(seq(1, 50), stateFor(50))
	c.Put(seq(1, 100), stateFor(100))
	st = c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(1000), st.MemoryBytes)
	// Of two branches, a Put extending one replaces that one only.
	x, y := branch(2, 16, 1, 40), branch(2, 16, 2, 40)
	c.Put(x, fill(100, 1))
	c.Put(y, fill(100, 2))
	require.Equal(t, 3, c.Stats().Entries)
	c.Put(cat(x, seq(7, 10)), fill(100, 3))
	assert.Equal(t, 3, c.Stats().Entries)
	hit, ok := look(c, x)
	require.True(t, ok)
	assert.Equal(t, fill(100, 3), hit.State, "x was replaced")
	hit, ok = look(c, y)
	require.True(t, ok)
	assert.Equal(t, fill(100, 2), hit.State, "y is no prefix of the new entry: it stays")
}

// TestPutOfPrefixAddsNothing: tokens that an entry already holds or
// extends add nothing (the first state stays).
func TestPutOfPrefixAddsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		toks []engine.Token
	}{
		{"same tokens", seq(1, 48)},
		{"a prefix, whole blocks", seq(1, 32)},
		{"a prefix, partial block", seq(1, 20)},
		{"one block", seq(1, 16)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := memCache(t, 1<<20)
			c.Put(seq(1, 48), stateFor(48))
			c.Put(tc.toks, fill(len(tc.toks)*10, 0xee))
			st := c.Stats()
			assert.Equal(t, 1, st.Entries)
			assert.Equal(t, int64(480), st.MemoryBytes)
			hit, ok := look(c, tc.toks)
			require.True(t, ok)
			assert.Equal(t, 48, hit.Positions)
			assert.Equal(t, len(tc.toks)-1, hit.Match, "held whole, its last token to decode")
			assert.Equal(t, stateFor(48), hit.State)
			assert.True(t, c.Has(tc.toks))
		})
	}
}

// TestPutOfHeldTokensCountsAUse: a Put that an entry already serves counts
// as a use of it.
func TestPutOfHeldTokensCountsAUse(t *testing.T) {
	c := memCache(t, 3*320)
	c.Put(seq(0, 32), stateFor(32))
	for range 10 {
		c.Put(seq(0, 20), stateFor(20))
	}
	for f := 1; f <= 10; f++ {
		c.Put(seq(f, 32), stateFor(32))
	}
	assert.True(t, c.Has(seq(0, 32)))
	assert.Equal(t, [3]uint64{}, c.Stats().Hits, "a Put is no hit")
}

func TestPutIgnoresShortOrEmpty(t *testing.T) {
	for _, tc := range []struct {
		name  string
		toks  []engine.Token
		state []byte
	}{
		{"no tokens", nil, stateFor(15)},
		{"15 tokens", seq(1, 15), stateFor(15)},
		{"nil state", seq(1, 32), nil},
		{"empty state", seq(1, 32), []byte{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := memCache(t, 1<<20)
			c.Put(tc.toks, tc.state)
			assert.Equal(t, kvcache.Stats{}, c.Stats())
			_, ok := look(c, seq(1, 64))
			assert.False(t, ok)
		})
	}
}

// TestPutKeepsTheStateAndCopiesTheTokens: Lookup returns the very slice
// put (no copy), and a caller reusing its token slice does not change the
// entry.
func TestPutCopiesTheStateAndTheTokens(t *testing.T) {
	c := memCache(t, 1<<20)
	toks := seq(1, 32)
	state := stateFor(32)
	c.Put(toks, state)
	for i := range toks {
		toks[i] = -1
	}
	clear(state)
	hit, ok := look(c, seq(1, 32))
	require.True(t, ok)
	assert.Equal(t, stateFor(32), hit.State, "the cache holds a copy of the state, out of the Go heap")
	hit.Done()
	assert.Nil(t, hit.State, "Done ends the hit's use of the state")
	_, ok = look(c, toks)
	assert.False(t, ok, "the entry kept its own copy of the tokens")
	assert.True(t, c.Has(seq(1, 32)))
	assert.True(t, c.Has(seq(1, 17)))
	assert.False(t, c.Has(seq(1, 33)))
	assert.False(t, c.Has(seq(1, 15)), "less than a block is never held")
}

// TestEvictsLeastValuable: under a budget of three states, the entries of
// lowest GDSF priority (fewest uses) go first.
func TestEvictsLeastValuable(t *testing.T) {
	const size = 320
	c := memCache(t, 3*size)
	a, b, cc, d, e := seq(1, 32), seq(2, 32), seq(3, 32), seq(4, 32), seq(5, 32)
	c.Put(a, stateFor(32))
	c.Put(b, stateFor(32))
	c.Put(cc, stateFor(32))
	for range 3 {
		_, ok := look(c, a)
		require.True(t, ok)
	}
	for range 2 {
		_, ok := look(c, b)
		require.True(t, ok)
	}
	// Priorities now: a 4, b 3, cc 1. d comes in at 1 and cc (1) goes.
	c.Put(d, stateFor(32))
	assert.False(t, c.Has(cc), "the entry used least goes")
	assert.True(t, c.Has(a))
	assert.True(t, c.Has(b))
	assert.True(t, c.Has(d), "the entry just put stays")
	st := c.Stats()
	assert.Equal(t, uint64(1), st.Evictions[kvcache.Memory])
	assert.Equal(t, 3, st.Entries)
	assert.Equal(t, int64(3*size), st.MemoryBytes)
	// The clock rose to 1: e comes in at 2, d (1) is the lowest now.
	c.Put(e, stateFor(32))
	assert.False(t, c.Has(d))
	assert.True(t, c.Has(a))
	assert.True(t, c.Has(b))
	assert.True(t, c.Has(e))
	st = c.Stats()
	assert.Equal(t, uint64(2), st.Evictions[kvcache.Memory])
	assert.Zero(t, st.Evictions[kvcache.Disk])
	assert.Equal(t, 3, st.Entries)
	assert.LessOrEqual(t, st.MemoryBytes, int64(3*size))
	_, ok := look(c, cc)
	assert.False(t, ok, "an evicted entry (no disk) is gone")
}

// TestEvictsSeveralForALargeState: one large state evicts as many small
// ones as it takes, least used first.
func TestEvictsSeveralForALargeState(t *testing.T) {
	c := memCache(t, 1000)
	for f := 1; f <= 5; f++ {
		c.Put(seq(f, 20), stateFor(20)) // 200 bytes each: 1000 in all
		for range f {                   // family f used f more times
			look(c, seq(f, 20))
		}
	}
	require.Equal(t, int64(1000), c.Stats().MemoryBytes)
	c.Put(seq(9, 50), stateFor(50)) // 500 bytes: three of the five go
	st := c.Stats()
	assert.Equal(t, uint64(3), st.Evictions[kvcache.Memory])
	assert.Equal(t, int64(900), st.MemoryBytes)
	for f := 1; f <= 3; f++ {
		assert.False(t, c.Has(seq(f, 20)), "family %d", f)
	}
	for f := 4; f <= 5; f++ {
		assert.True(t, c.Has(seq(f, 20)), "family %d", f)
	}
	assert.True(t, c.Has(seq(9, 50)))
}

// TestPopularEntrySurvivesOneOffs: a burst of entries used once cannot
// flush an entry used many times (an LRU cache would drop it after three).
func TestPopularEntrySurvivesOneOffs(t *testing.T) {
	const size = 320
	c := memCache(t, 3*size)
	popular := seq(0, 32)
	c.Put(popular, stateFor(32))
	for range 50 {
		_, ok := look(c, popular)
		require.True(t, ok)
	}
	for i := 1; i <= 40; i++ {
		c.Put(seq(i, 32), stateFor(32))
		require.LessOrEqual(t, c.Stats().MemoryBytes, int64(3*size))
		require.True(t, c.Has(seq(i, 32)), "a new entry is kept")
	}
	hit, ok := look(c, popular)
	require.True(t, ok, "the popular entry survives 40 one-off entries")
	assert.Equal(t, kvcache.Memory, hit.Tier)
	st := c.Stats()
	assert.Equal(t, uint64(41-3), st.Evictions[kvcache.Memory])
	assert.Equal(t, 3, st.Entries)
}

// TestPopularEntryAgesOut: an entry that stops being used goes once newer
// entries are used, even though each of them is used fewer times than it
// was (plain LFU would keep it forever).
func TestPopularEntryAgesOut(t *testing.T) {
	const size, uses = 320, 20
	c := memCache(t, 3*size)
	old := seq(0, 32)
	c.Put(old, stateFor(32))
	for range uses {
		look(c, old)
	}
	evictedAt := 0
	for i := 1; i <= 100 && evictedAt == 0; i++ {
		c.Put(seq(i, 32), stateFor(32))
		for range 5 { // fewer uses than the old entry had
			_, ok := look(c, seq(i, 32))
			require.True(t, ok)
		}
		require.LessOrEqual(t, c.Stats().MemoryBytes, int64(3*size))
		if !c.Has(old) {
			evictedAt = i
		}
	}
	require.NotZero(t, evictedAt, "the old popular entry never aged out")
	assert.Greater(t, evictedAt, 2, "ageing is gradual: the old entry outlives the first newcomers")
	_, ok := look(c, seq(evictedAt, 32))
	assert.True(t, ok, "the entry in use stays")
}

// TestReplacementInheritsUses: an entry that replaces a popular prefix is
// as popular as it.
func TestReplacementInheritsUses(t *testing.T) {
	c := memCache(t, 1300) // the long entry (480) and two to three one-offs (320)
	c.Put(seq(0, 32), stateFor(32))
	for range 30 {
		look(c, seq(0, 32))
	}
	c.Put(seq(0, 48), stateFor(48))
	for i := 1; i <= 20; i++ {
		c.Put(seq(i, 32), stateFor(32))
		require.LessOrEqual(t, c.Stats().MemoryBytes, int64(1300))
	}
	assert.True(t, c.Has(seq(0, 48)), "the replacement kept the prefix's uses")
	// A one-off put in place of the replacement would have gone long ago.
	c2 := memCache(t, 1300)
	c2.Put(seq(0, 48), stateFor(48))
	for i := 1; i <= 20; i++ {
		c2.Put(seq(i, 32), stateFor(32))
	}
	assert.False(t, c2.Has(seq(0, 48)))
}

// TestMemoryNeverOverBudget: after every Put the bytes held are within the
// budget, whatever the mix of sizes and uses.
func TestMemoryNeverOverBudget(t *testing.T) {
	const budget = 2000
	r := rand.New(rand.NewPCG(1, 2))
	c := memCache(t, budget)
	var evictions uint64
	for i := range 500 {
		n := 16 + r.IntN(150) // up to 1650 bytes
		f := r.IntN(30)
		c.Put(branch(f, 16+r.IntN(n-15), r.IntN(4), n), stateFor(n))
		st := c.Stats()
		require.LessOrEqual(t, st.MemoryBytes, int64(budget), "put %d", i)
		require.GreaterOrEqual(t, st.MemoryBytes, int64(0))
		require.GreaterOrEqual(t, st.Evictions[kvcache.Memory], evictions)
		evictions = st.Evictions[kvcache.Memory]
		if r.IntN(2) == 0 {
			if hit, ok := look(c, branch(f, 16, r.IntN(4), 200)); ok {
				require.Len(t, hit.State, hit.Positions*10)
			}
		}
	}
	assert.Positive(t, evictions)
}

// TestStateOverBudgetNotKept: a state larger than the memory budget (and
// no disk) is dropped without evicting anything.
func TestStateOverBudgetNotKept(t *testing.T) {
	c := memCache(t, 700)
	c.Put(seq(1, 32), stateFor(32)) // 320
	c.Put(seq(2, 80), stateFor(80)) // 800 > 700
	st := c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(320), st.MemoryBytes)
	assert.Zero(t, st.Evictions[kvcache.Memory], "a state that cannot fit evicts nothing")
	_, ok := look(c, seq(2, 80))
	assert.False(t, ok)
	assert.True(t, c.Has(seq(1, 32)))

	// Nor does it replace a prefix it extends.
	c.Put(seq(1, 80), stateFor(80))
	hit, ok := look(c, seq(1, 80))
	require.True(t, ok)
	assert.Equal(t, 32, hit.Positions, "the prefix entry stays")
	assert.Equal(t, int64(320), c.Stats().MemoryBytes)

	// A state exactly the budget fits.
	c.Put(seq(3, 70), stateFor(70))
	assert.True(t, c.Has(seq(3, 70)))
	assert.Equal(t, int64(700), c.Stats().MemoryBytes)

	// No memory budget at all: nothing is kept.
	none := memCache(t, 0)
	none.Put(seq(1, 32), stateFor(32))
	assert.Equal(t, kvcache.Stats{}, none.Stats())
}

// TestConcurrentUse: goroutines putting (with logits or without) and
// looking up overlapping prefixes under a small budget keep the cache
// consistent (run with -race).
func TestConcurrentUse(t *testing.T) {
	for _, tc := range []struct {
		name string
		disk bool
		ops  int
	}{{"memory", false, 600}, {"memory and disk", true, 250}} {
		t.Run(tc.name, func(t *testing.T) {
			const memBudget, diskBudget = 2500, 8000
			var logs bytes.Buffer
			cfg := kvcache.Config{MemoryBytes: memBudget, Log: slog.New(slog.NewTextHandler(&logs, nil))}
			if tc.disk {
				cfg.Dir, cfg.DiskBytes = t.TempDir(), diskBudget
			}
			c := newCache(t, cfg)
			lengths := []int{16, 20, 31, 32, 40, 48, 64, 80}
			query := func(r *rand.Rand) []engine.Token {
				n := lengths[r.IntN(len(lengths))]
				f := r.IntN(3)
				if r.IntN(3) == 0 { // a branch off the family after 16 or 32 tokens
					return branch(f, 16*(1+r.IntN(2)), r.IntN(2), max(n, 33))
				}
				return seq(f, n)
			}
			var wg sync.WaitGroup
			var withLogits atomic.Int64 // hits that came with logits
			errs := make(chan error, 8)
			for g := range 8 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 7))
					fail := func(format string, args ...any) {
						select {
						case errs <- fmt.Errorf("goroutine %d: "+format, append([]any{g}, args...)...):
						default:
						}
					}
					for range tc.ops {
						toks := query(r)
						switch r.IntN(4) {
						case 0:
							switch r.IntN(3) {
							case 0:
								c.Put(toks, stateFor(len(toks)))
							case 1:
								c.Put(toks, stateFor(len(toks)), kvcache.Logits{At: len(toks), Values: logitsFor(len(toks))})
							default: // logits after a prefix too
								at := 16 + r.IntN(len(toks)-15)
								c.Put(toks, stateFor(len(toks)), kvcache.Logits{At: at, Values: logitsFor(at)},
									kvcache.Logits{At: len(toks), Values: logitsFor(len(toks))})
							}
						case 1:
							st := c.Stats()
							if st.MemoryBytes < 0 || st.MemoryBytes > memBudget {
								fail("memory bytes %d", st.MemoryBytes)
							}
							if tc.disk && (st.DiskBytes < 0 || st.DiskBytes > diskBudget) {
								fail("disk bytes %d", st.DiskBytes)
							}
						default:
							better := r.IntN(3) * 10
							hit, ok := c.Lookup(toks, better, 32)
							if !ok {
								continue
							}
							switch {
							case hit.Positions*10 != len(hit.State):
								fail("a hit of %d positions with %d bytes", hit.Positions, len(hit.State))
							case hit.State[0] != byte(hit.Positions) || hit.State[len(hit.State)-1] != byte(hit.Positions):
								fail("a hit of %d positions with the state of another entry", hit.Positions)
							case hit.Match < min(kvcache.BlockTokens, len(toks)-1) || hit.Match <= better || hit.Match > len(toks) || hit.Match > hit.Positions:
								fail("match %d (query %d, better %d, positions %d)", hit.Match, len(toks), better, hit.Positions)
							case hit.Logits == nil && hit.Match == len(toks):
								fail("the whole query of %d matched without logits", len(toks))
							case hit.Logits != nil && (hit.Match != len(toks) || !isLogitsFor(hit.Logits, len(toks))):
								fail("logits %v with match %d (query %d)", hit.Logits, hit.Match, len(toks))
							case hit.Tier != kvcache.Memory && (hit.Tier != kvcache.Disk || !tc.disk):
								fail("tier %v", hit.Tier)
							}
							if hit.Logits != nil {
								withLogits.Add(1)
							}
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			st := c.Stats()
			assert.LessOrEqual(t, st.MemoryBytes, int64(memBudget))
			assert.Positive(t, st.Evictions[kvcache.Memory], "the budget was small enough to evict")
			assert.Positive(t, st.Hits[kvcache.Memory])
			assert.Positive(t, withLogits.Load(), "some hits came with logits")
			assert.Positive(t, st.Entries)
			// Every entry left is whole: looking each family up hits a
			// consistent state.
			for f := range 3 {
				if hit, ok := look(c, seq(f, 80)); ok {
					assert.Equal(t, hit.Positions*10, len(hit.State))
					if hit.Logits != nil {
						assert.True(t, isLogitsFor(hit.Logits, 80))
					}
				}
			}
			if tc.disk {
				assert.LessOrEqual(t, st.DiskBytes, int64(diskBudget))
				assert.Equal(t, st.DiskBytes, dirBytes(t, cfg.Dir), "the disk bytes counted are those in the directory")
				// The entries on disk are all valid: a restart reads them.
				var logs2 bytes.Buffer
				c2 := newCache(t, kvcache.Config{Dir: cfg.Dir, DiskBytes: diskBudget, Log: slog.New(slog.NewTextHandler(&logs2, nil))})
				assert.Zero(t, c2.Stats().Refused, logs2.String())
				assert.Equal(t, st.DiskBytes, c2.Stats().DiskBytes)
				// A lookup racing a Put that replaces (or an eviction that
				// drops) the disk entry it reads finds the file gone: a
				// miss, not a refusal.
				assert.Zero(t, st.Refused)
				assert.Empty(t, logs.String())
			} else {
				assert.Empty(t, logs.String())
			}
		})
	}
}

// TestLookupLogits: a prompt that an entry holds whole, with the logits
// after it, needs no forward pass (Match is its length, Logits the very
// values put); any other prompt leaves its last token to decode.
func TestLookupLogits(t *testing.T) {
	toks := seq(1, 40)
	values := []float32{0.5, -3.25, 7, 1e-3}
	state := stateFor(40)
	c := memCache(t, 1<<20)
	c.Put(toks, state, kvcache.Logits{At: 40, Values: values})

	hit, ok := look(c, toks)
	require.True(t, ok)
	assert.Equal(t, 40, hit.Match, "the whole prompt: its logits are cached")
	assert.Equal(t, 40, hit.Positions)
	assert.Equal(t, kvcache.Memory, hit.Tier)
	assert.Equal(t, state, hit.State)
	require.Equal(t, values, hit.Logits)
	assert.Same(t, &values[0], &hit.Logits[0], "the logits are shared, not copied")
	assert.True(t, c.Has(toks))

	for _, tc := range []struct {
		name  string
		query []engine.Token
		match int
	}{
		{"a longer prompt: the entry, then its own tokens to decode", seq(1, 50), 40},
		{"one token more", seq(1, 41), 40},
		{"a prompt branching off the entry", cat(toks, seq(5, 3)), 40},
		{"a prefix without logits at its end", seq(1, 30), 29},
		{"a prefix of one block", seq(1, 16), 15},
		{"a prompt sharing all but the entry's last token", branch(1, 39, 1, 40), 39},
	} {
		hit, ok := look(c, tc.query)
		require.True(t, ok, tc.name)
		assert.Equal(t, tc.match, hit.Match, tc.name)
		assert.Nil(t, hit.Logits, tc.name)
		assert.Equal(t, 40, hit.Positions, tc.name)
		assert.Equal(t, state, hit.State, tc.name)
	}

	// better: the caller has all but the last token; only the logits make
	// the hit better than that.
	hit, ok = c.Lookup(toks, 39, 0)
	require.True(t, ok, "40 > 39 with the logits")
	assert.Equal(t, 40, hit.Match)
	assert.Equal(t, values, hit.Logits)
	hit, ok = c.Lookup(toks, 40, 0)
	assert.False(t, ok)
	assert.Equal(t, kvcache.Hit{}, hit)
	hit, ok = c.Lookup(seq(1, 30), 29, 0)
	assert.False(t, ok, "no logits at 30: 29 is no better than 29")
	assert.Equal(t, kvcache.Hit{}, hit)
	assert.Equal(t, uint64(2+6), c.Stats().Hits[kvcache.Memory])

	// Without logits stored, the same prompt with better = len-1 is no hit
	// and counts nothing.
	bare := memCache(t, 1<<20)
	bare.Put(toks, state)
	hit, ok = look(bare, toks)
	require.True(t, ok)
	assert.Equal(t, 39, hit.Match)
	assert.Nil(t, hit.Logits)
	hit, ok = bare.Lookup(toks, 39, 0)
	assert.False(t, ok, "39 is no better than 39")
	assert.Equal(t, kvcache.Hit{}, hit)
	hit, ok = bare.Lookup(toks, 38, 0)
	require.True(t, ok)
	assert.Equal(t, 39, hit.Match)
	st := bare.Stats()
	assert.Equal(t, uint64(2), st.Hits[kvcache.Memory])
	assert.Zero(t, st.Misses)
}

// TestLookupLogitsCounts: counts compares with the Match given, the whole
// prompt only with its logits.
func TestLookupLogitsCounts(t *testing.T) {
	toks := seq(1, 40)
	for _, withLogits := range []bool{true, false} {
		t.Run(fmt.Sprint("logits=", withLogits), func(t *testing.T) {
			c := memCache(t, 1<<20)
			if withLogits {
				c.Put(toks, stateFor(40), kvcache.Logits{At: 40, Values: logitsFor(40)})
			} else {
				c.Put(toks, stateFor(40))
			}
			_, ok := c.Lookup(toks, 0, 40)
			require.True(t, ok, "counts never refuses a hit")
			st := c.Stats()
			if withLogits {
				assert.Equal(t, uint64(1), st.Hits[kvcache.Memory])
				assert.Zero(t, st.Misses)
			} else {
				assert.Zero(t, st.Hits[kvcache.Memory], "Match 39 < 40")
				assert.Equal(t, uint64(1), st.Misses)
			}
		})
	}
}

// TestLogitsAtEveryPrefix: an entry serves the logits after each prefix it
// has them for, and only there.
func TestLogitsAtEveryPrefix(t *testing.T) {
	c := memCache(t, 1<<20)
	toks := seq(1, 64)
	c.Put(toks, stateFor(64),
		kvcache.Logits{At: 64, Values: logitsFor(64)},
		kvcache.Logits{At: 16, Values: logitsFor(16)},
		kvcache.Logits{At: 33, Values: logitsFor(33)})
	for n := 16; n <= 70; n++ {
		hit, ok := look(c, seq(1, n))
		require.True(t, ok, n)
		assert.Equal(t, 64, hit.Positions, n)
		switch n {
		case 16, 33, 64:
			assert.Equal(t, n, hit.Match, n)
			assert.True(t, isLogitsFor(hit.Logits, n), "%d: %v", n, hit.Logits)
		default:
			assert.Equal(t, min(n-1, 64), hit.Match, n)
			assert.Nil(t, hit.Logits, n)
		}
	}
	// A one-block entry with its logits.
	c.Put(seq(2, 16), stateFor(16), kvcache.Logits{At: 16, Values: logitsFor(16)})
	hit, ok := look(c, seq(2, 16))
	require.True(t, ok)
	assert.Equal(t, 16, hit.Match)
	assert.True(t, isLogitsFor(hit.Logits, 16))
}

// TestPutDropsLogitsOutsideTheEntry: logits after no prefix of the tokens
// put (At 0, negative, past the end) are not kept, nor counted; of two at
// one position the first is.
func TestPutDropsLogitsOutsideTheEntry(t *testing.T) {
	c := memCache(t, 1<<20)
	toks := seq(1, 32)
	first, second := []float32{1, 2}, []float32{3, 4, 5}
	c.Put(toks, stateFor(32),
		kvcache.Logits{At: 0, Values: logitsFor(0)},
		kvcache.Logits{At: -1, Values: logitsFor(7)},
		kvcache.Logits{At: 33, Values: logitsFor(33)},
		kvcache.Logits{At: 32, Values: first},
		kvcache.Logits{At: 32, Values: second})
	assert.Equal(t, int64(320+4*len(first)), c.Stats().MemoryBytes)
	hit, ok := look(c, toks)
	require.True(t, ok)
	assert.Equal(t, 32, hit.Match)
	assert.Equal(t, first, hit.Logits)
	hit, ok = look(c, seq(1, 33))
	require.True(t, ok)
	assert.Equal(t, 32, hit.Match)
	assert.Nil(t, hit.Logits, "the logits after 33 tokens were not kept")
}

// TestPutReplacingAPrefixKeepsItsLogits: a prompt cached with its logits,
// then the same prompt and its answer (the next turn's prefix): the new
// entry serves the prompt still without a forward pass.
func TestPutReplacingAPrefixKeepsItsLogits(t *testing.T) {
	prompt := seq(1, 40)
	full := cat(prompt, seq(9, 20))
	promptLogits := []float32{0.25, -1, 8}
	s1, s2 := fill(400, 1), fill(600, 2)
	c := memCache(t, 1<<20)
	c.Put(prompt, s1, kvcache.Logits{At: 40, Values: promptLogits})
	c.Put(full, s2)
	st := c.Stats()
	assert.Equal(t, 1, st.Entries, "the prompt's entry was replaced")
	assert.Equal(t, int64(600+4*len(promptLogits)), st.MemoryBytes, "the carried logits are counted, the replaced state is not")

	hit, ok := look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, 40, hit.Match)
	assert.Equal(t, 60, hit.Positions)
	assert.Equal(t, s2, hit.State)
	require.Equal(t, promptLogits, hit.Logits)
	assert.Same(t, &promptLogits[0], &hit.Logits[0])
	hit, ok = look(c, full)
	require.True(t, ok)
	assert.Equal(t, 59, hit.Match)
	assert.Nil(t, hit.Logits)

	// A second turn replaces that entry in turn and keeps both: the first
	// prompt's logits and the ones the second turn brought.
	next := cat(full, seq(10, 20))
	fullLogits := logitsFor(60)
	c.Put(next, fill(800, 3), kvcache.Logits{At: 60, Values: fullLogits})
	st = c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(800+4*len(promptLogits)+4*len(fullLogits)), st.MemoryBytes)
	hit, ok = look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, 40, hit.Match)
	assert.Equal(t, 80, hit.Positions)
	assert.Equal(t, promptLogits, hit.Logits)
	hit, ok = look(c, full)
	require.True(t, ok)
	assert.Equal(t, 60, hit.Match)
	assert.Equal(t, fullLogits, hit.Logits)
	hit, ok = look(c, next)
	require.True(t, ok)
	assert.Equal(t, 79, hit.Match)
	assert.Nil(t, hit.Logits)

	// A branch that replaces nothing takes no logits from its sibling.
	other := cat(prompt, seq(11, 20))
	c.Put(other, fill(600, 4))
	assert.Equal(t, 2, c.Stats().Entries)
	hit, ok = look(c, cat(other, seq(12, 1)))
	require.True(t, ok)
	assert.Equal(t, 60, hit.Match)
	assert.Equal(t, fill(600, 4), hit.State)
	assert.Nil(t, hit.Logits)
}

// TestPutOfHeldTokensAddsLogits: a Put of tokens an entry in memory holds
// already keeps that entry's state and adds the logits it lacks.
func TestPutOfHeldTokensAddsLogits(t *testing.T) {
	prompt := seq(1, 40)
	full := cat(prompt, seq(9, 20))
	s2 := fill(600, 2)
	c := memCache(t, 1<<20)
	c.Put(full, s2)
	hit, ok := look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, 39, hit.Match)
	assert.Nil(t, hit.Logits)

	promptLogits := []float32{1, 2, 3}
	c.Put(prompt, fill(400, 0xee), kvcache.Logits{At: 40, Values: promptLogits})
	st := c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(600+4*3), st.MemoryBytes, "the logits are added; the state put is not")
	hit, ok = look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, 40, hit.Match)
	assert.Equal(t, 60, hit.Positions)
	assert.Equal(t, s2, hit.State)
	require.Equal(t, promptLogits, hit.Logits)
	assert.Same(t, &promptLogits[0], &hit.Logits[0])

	// The same tokens as the entry, with the logits at its end.
	fullLogits := logitsFor(60)
	c.Put(full, fill(600, 0xee), kvcache.Logits{At: 60, Values: fullLogits})
	assert.Equal(t, int64(600+4*3+4*len(fullLogits)), c.Stats().MemoryBytes)
	hit, ok = look(c, full)
	require.True(t, ok)
	assert.Equal(t, 60, hit.Match)
	assert.Equal(t, fullLogits, hit.Logits)
	assert.Equal(t, s2, hit.State)

	// Logits at a position the entry has them for already change nothing;
	// logits past the tokens put are dropped.
	c.Put(prompt, fill(400, 0xee), kvcache.Logits{At: 40, Values: []float32{9, 9, 9, 9}}, kvcache.Logits{At: 50, Values: []float32{9}})
	assert.Equal(t, int64(600+4*3+4*len(fullLogits)), c.Stats().MemoryBytes)
	hit, ok = look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, promptLogits, hit.Logits)
	hit, ok = look(c, full[:50])
	require.True(t, ok)
	assert.Equal(t, 49, hit.Match, "no logits after 50 tokens")
	assert.Nil(t, hit.Logits)
	assert.Equal(t, 1, c.Stats().Entries)
	assert.Zero(t, c.Stats().Evictions[kvcache.Memory])
}

// TestLogitsMemoryBytes: an entry's memory is its state plus 4 bytes per
// logit value, against the budget as for the state.
func TestLogitsMemoryBytes(t *testing.T) {
	toks := seq(1, 40)
	state := stateFor(40) // 400 bytes
	ends := []kvcache.Logits{{At: 40, Values: make([]float32, 60)}, {At: 20, Values: make([]float32, 40)}}
	const size = 400 + 4*(60+40)

	c := memCache(t, size)
	c.Put(toks, state, ends...)
	assert.Equal(t, kvcache.Stats{Entries: 1, MemoryBytes: size}, c.Stats())
	// Another entry of the same size evicts it, logits and all.
	c.Put(seq(2, 80), stateFor(80))
	st := c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, uint64(1), st.Evictions[kvcache.Memory])
	assert.Equal(t, int64(800), st.MemoryBytes)
	assert.False(t, c.Has(toks))

	// A state within the budget whose logits are not: not kept.
	small := memCache(t, size-1)
	small.Put(toks, state, ends...)
	assert.Equal(t, kvcache.Stats{}, small.Stats())
	small.Put(toks, state)
	assert.Equal(t, kvcache.Stats{Entries: 1, MemoryBytes: 400}, small.Stats())

	// Logits added to an entry in memory are counted, and evict others.
	c = memCache(t, 800+400)
	c.Put(seq(2, 80), stateFor(80))
	c.Put(toks, state)
	require.Equal(t, int64(1200), c.Stats().MemoryBytes)
	look(c, toks) // used more than seq(2, 80)
	c.Put(toks, fill(400, 0xee), ends[0])
	st = c.Stats()
	assert.Equal(t, int64(400+4*60), st.MemoryBytes, "seq(2, 80) made room for the logits")
	assert.Equal(t, uint64(1), st.Evictions[kvcache.Memory])
	assert.False(t, c.Has(seq(2, 80)))
	hit, ok := look(c, toks)
	require.True(t, ok)
	assert.Equal(t, 40, hit.Match)
	assert.Len(t, hit.Logits, 60)
}

// TestPutReportsWhatIsHeld: Put reports whether an entry holds the tokens
// afterwards (and, in memory, the logits); a nil state only adds logits to
// an entry holding the tokens.
func TestPutReportsWhatIsHeld(t *testing.T) {
	full := seq(1, 60)
	prompt := full[:40]
	promptLogits := []float32{4, 5, 6}
	c := memCache(t, 1000)
	assert.False(t, c.Put(seq(1, 15), stateFor(15)), "under a block")
	assert.False(t, c.Put(prompt, nil, kvcache.Logits{At: 40, Values: promptLogits}), "a nil state, and nothing holds the tokens")
	assert.False(t, c.Put(prompt, []byte{}), "an empty state, and nothing holds the tokens")
	assert.Equal(t, kvcache.Stats{}, c.Stats())

	assert.True(t, c.Put(full, fill(600, 2)))
	assert.True(t, c.Put(prompt, nil, kvcache.Logits{At: 40, Values: promptLogits}), "logits added to the entry holding the tokens")
	st := c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(600+4*len(promptLogits)), st.MemoryBytes)
	hit, ok := look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, 40, hit.Match)
	assert.Equal(t, promptLogits, hit.Logits)
	assert.Equal(t, fill(600, 2), hit.State)
	assert.Equal(t, 60, hit.Positions)
	assert.True(t, c.Put(full, nil), "held, nothing to add")
	assert.True(t, c.Put(prompt, fill(400, 0xee)), "held: the state put is not needed")

	assert.False(t, c.Put(seq(2, 120), stateFor(120)), "too large for every budget")
	assert.False(t, c.Put(seq(3, 40), nil), "a nil state, and nothing holds the tokens")
	assert.False(t, c.Put(branch(1, 40, 1, 50), nil, kvcache.Logits{At: 50, Values: []float32{1}}), "an entry sharing 40 of 50 tokens does not hold them")
	st = c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, int64(600+4*len(promptLogits)), st.MemoryBytes)

	// An entry on disk only holds the tokens but does not take logits.
	dir := t.TempDir()
	d := diskCache(t, dir, 0, 1<<20, nil)
	assert.True(t, d.Put(full, fill(600, 2)))
	assert.False(t, d.Put(prompt, nil, kvcache.Logits{At: 40, Values: promptLogits}), "on disk only: the logits are not added")
	assert.True(t, d.Put(prompt, nil), "held, nothing to add")
	st = d.Stats()
	assert.Equal(t, kvcache.Stats{Entries: 1, DiskBytes: fileSize(ns, 60, 600)}, st, "the file is unchanged")
	assert.Equal(t, st.DiskBytes, dirBytes(t, dir))
	hit, ok = look(d, prompt)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, 39, hit.Match)
	assert.Nil(t, hit.Logits)
}

// TestEvictedStateLastsUntilDone: a state evicted while a lookup still
// restores from it stays readable until the lookup is done, and its memory
// goes back then; one evicted with no lookup on it goes back at once.
func TestEvictedStateLastsUntilDone(t *testing.T) {
	c := memCache(t, 2*int64(len(stateFor(32))))
	c.Put(seq(1, 32), stateFor(32))
	held, ok := look(c, seq(1, 32))
	require.True(t, ok)
	heldBlock := kvcache.HitBlock(held)
	c.Put(seq(2, 32), stateFor(32))
	other, ok := look(c, seq(2, 32))
	require.True(t, ok)
	otherBlock := kvcache.HitBlock(other)
	other.Done()
	for f := 3; f < 6; f++ { // evict both
		c.Put(seq(f, 32), stateFor(32))
	}
	_, ok = look(c, seq(1, 32))
	require.False(t, ok, "evicted")
	assert.True(t, kvcache.Unmapped(otherBlock), "no lookup held it: gone at eviction")
	assert.False(t, kvcache.Unmapped(heldBlock), "a lookup still holds it")
	assert.Equal(t, stateFor(32), held.State, "still readable")
	held.Done()
	assert.True(t, kvcache.Unmapped(heldBlock), "gone once the lookup is done")
}

// TestStatesLiveOutsideTheGoHeap: a full memory tier adds its states'
// bytes to the process, not to the Go heap, whose collector would
// otherwise let the heap grow to twice them.
func TestStatesLiveOutsideTheGoHeap(t *testing.T) {
	const state, n = 4 << 20, 8
	c := memCache(t, n*state)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for f := range n {
		c.Put(seq(f+1, 32), fill(state, byte(f)))
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	require.Equal(t, int64(n*state), c.Stats().MemoryBytes)
	assert.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(state), "the %d MiB of states are not on the heap", n*state>>20)
	hit, ok := look(c, seq(n, 32))
	require.True(t, ok)
	assert.Equal(t, fill(state, n-1), hit.State)
	hit.Done()
}
