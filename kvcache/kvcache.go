// Package kvcache keeps the KV state of token prefixes so that a side
// prefills a passage sequence once and restores it afterwards.
//
// DRAGON decodes one sequence per passage, laid out as (template start +
// passage) then the conversation: a passage's KV sits at the same positions
// with the same attention context whatever the question, so restoring a
// cached prefix and prefilling the rest gives exactly the KV a full prefill
// gives. A cached entry serves any prompt that shares a prefix with it: the
// caller restores the entry and cuts it back to the shared length.
//
// The cache holds entries in host memory under a byte budget and, with a
// directory, on disk under a second budget, so that a restarted daemon
// starts warm. Eviction is GreedyDual-Size-Frequency: an entry's priority
// is the clock when it was last used plus its use count times its cost per
// byte; the lowest goes first and the clock rises to its priority. Here the
// cost of an entry (its prefill) and its size (its KV bytes) both grow
// linearly with its tokens, so cost per byte is one constant and the policy
// is LFU with ageing: a passage many questions retrieve stays (the cloud's
// popular passages under Zipf-like traffic), and a burst of one-off entries
// cannot flush it, yet entries that stop being used age out, which plain
// LFU never does.
//
// Lookup finds the entry sharing the longest prefix through a hash chain
// over blocks of BlockTokens tokens (as vLLM's prefix caching does); a
// shared prefix shorter than one block is no hit.
package kvcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/dragon-rag/dragon/engine"
)

// BlockTokens is the granularity of the prefix index.
const BlockTokens = 16

// Tier is where a hit came from.
type Tier int

// Tiers, fastest first.
const (
	// Context: the sequence still holds the prefix (nothing copied); the
	// decoder decides these hits, the cache only counts them.
	Context Tier = iota
	Memory
	Disk
)

func (t Tier) String() string {
	switch t {
	case Context:
		return "context"
	case Memory:
		return "memory"
	case Disk:
		return "disk"
	}
	return fmt.Sprintf("tier(%d)", int(t))
}

// Config configures a Cache.
type Config struct {
	// Namespace identifies what makes KV bytes valid: the model file and
	// the engine settings that change KV contents (see Namespace). Disk
	// entries of another namespace are refused.
	Namespace string
	// MemoryBytes bounds the states held in host memory (0: none; the
	// cache then works from disk alone).
	MemoryBytes int64
	// Dir, when set, keeps entries on disk too, under DiskBytes.
	Dir       string
	DiskBytes int64
	Log       *slog.Logger
	// Observer, when set, is told of hits, misses, evictions and sizes
	// (metrics).
	Observer Observer
}

// Observer receives the cache's events; calls are made with the cache's
// lock held, so they must be quick and must not call the cache.
type Observer interface {
	Hit(Tier)
	Miss()
	Evict(Tier)
	Bytes(t Tier, n int64)
	Restore(seconds float64)
}

// Namespace builds a Config.Namespace from the model file's identity (a
// digest of its bytes) and the settings that change KV contents.
func Namespace(modelDigest, engineBuild string, settings ...string) string {
	ns := "model=" + modelDigest + ";engine=" + engineBuild
	for _, s := range settings {
		ns += ";" + s
	}
	return ns
}

// Hit is a cached state that shares Match tokens with the prompt looked up.
// Restore the State (Positions positions) into an empty sequence, then
// remove positions [Match, Positions). State is shared: read it only.
type Hit struct {
	State     []byte
	Positions int
	Match     int
	Tier      Tier
}

// entry is one cached prefix.
type entry struct {
	tokens []engine.Token
	hashes []uint64 // chain hash of each full block
	mem    []byte   // nil when only on disk
	disk   int64    // bytes on disk, 0 when not there
	file   string
	freq   float64
	prio   float64
}

func (e *entry) size() int64 { return int64(len(e.mem)) }

// Cache is a token-prefix cache of KV states, safe for concurrent use.
type Cache struct {
	cfg  Config
	seed maphash.Seed
	log  *slog.Logger

	mu      sync.Mutex
	blocks  map[uint64][]*entry // chain hash of a block → entries holding it
	entries map[*entry]struct{}
	clock   float64
	memUsed int64
	dskUsed int64
	stats   Stats
	disk    *diskStore
}

// Stats are counters since the cache was made.
type Stats struct {
	Hits        [3]uint64 // by Tier
	Misses      uint64
	Evictions   [3]uint64 // by Tier (Memory, Disk)
	Refused     uint64    // disk entries refused (corrupt, foreign, ...)
	Entries     int
	MemoryBytes int64
	DiskBytes   int64
}

// New makes a cache; with a directory it indexes the entries found there
// (refusing, with one log line each, those it cannot use).
func New(cfg Config) (*Cache, error) {
	if cfg.MemoryBytes < 0 || cfg.DiskBytes < 0 {
		return nil, fmt.Errorf("kvcache: negative budget (memory %d, disk %d bytes)", cfg.MemoryBytes, cfg.DiskBytes)
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kvcache: no namespace: the model's identity and KV settings key every entry")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	c := &Cache{cfg: cfg, seed: maphash.MakeSeed(), log: cfg.Log, blocks: map[uint64][]*entry{}, entries: map[*entry]struct{}{}}
	if cfg.Dir != "" {
		if cfg.DiskBytes == 0 {
			return nil, fmt.Errorf("kvcache: a cache directory (%s) needs a disk budget", cfg.Dir)
		}
		d, err := openDisk(cfg.Dir, cfg.Namespace, cfg.Log)
		if err != nil {
			return nil, err
		}
		c.disk = d
		found, refused := d.scan()
		c.stats.Refused += uint64(refused)
		for _, f := range found {
			e := &entry{tokens: f.tokens, disk: f.size, file: f.name}
			e.hashes = c.chain(e.tokens)
			c.insertLocked(e)
			c.dskUsed += f.size
		}
		c.evictDiskLocked(nil)
		c.publishLocked()
	}
	return c, nil
}

// chain hashes each full block of toks, each hash covering every token
// before it.
func (c *Cache) chain(toks []engine.Token) []uint64 {
	n := len(toks) / BlockTokens
	out := make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(c.seed)
	var buf [4]byte
	for i := range n {
		for _, t := range toks[i*BlockTokens : (i+1)*BlockTokens] {
			binary.LittleEndian.PutUint32(buf[:], uint32(t))
			h.Write(buf[:])
		}
		out[i] = h.Sum64()
	}
	return out
}

// Lookup returns the cached state sharing the longest prefix with toks, if
// that prefix is at least one block and longer than better (what the
// caller already has, e.g. in its sequence), loading it from disk if it is
// only there. A hit sharing at least counts tokens is counted as a hit, a
// shorter one (only the template every prompt starts with, say) as a
// miss; without a hit the caller counts what it does (CountContextHit or
// CountMiss).
func (c *Cache) Lookup(toks []engine.Token, better, counts int) (Hit, bool) {
	c.mu.Lock()
	e, match := c.longestLocked(toks, c.chain(toks))
	if e == nil || match <= better {
		c.mu.Unlock()
		return Hit{}, false
	}
	count := func(tier Tier) {
		if match >= counts {
			c.stats.Hits[tier]++
			c.observe(func(o Observer) { o.Hit(tier) })
		} else {
			c.stats.Misses++
			c.observe(func(o Observer) { o.Miss() })
		}
	}
	c.touchLocked(e)
	if e.mem != nil {
		count(Memory)
		h := Hit{State: e.mem, Positions: len(e.tokens), Match: match, Tier: Memory}
		c.mu.Unlock()
		return h, true
	}
	file := e.file
	c.mu.Unlock()

	// Read outside the lock: a disk read takes milliseconds.
	state, err := c.disk.load(file, e.tokens)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, live := c.entries[e]
	live = live && e.file == file
	switch {
	case err != nil && (!live || errors.Is(err, fs.ErrNotExist)):
		// Replaced or evicted while it was read: no hit, nothing wrong.
		return Hit{}, false
	case err != nil:
		c.log.Warn("kv cache: refusing a disk entry; it will be recomputed", "file", file, "err", err)
		c.stats.Refused++
		c.dropDiskLocked(e)
		c.publishLocked()
		return Hit{}, false
	}
	count(Disk)
	if live && e.mem == nil && c.cfg.MemoryBytes >= int64(len(state)) {
		e.mem = state
		c.memUsed += e.size()
		c.evictMemLocked(e)
	}
	c.publishLocked()
	return Hit{State: state, Positions: len(e.tokens), Match: match, Tier: Disk}, true
}

// CountContextHit records a hit the caller served from a sequence that
// still held the prefix.
func (c *Cache) CountContextHit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Hits[Context]++
	c.observe(func(o Observer) { o.Hit(Context) })
}

// CountMiss records a sequence prefilled from the start.
func (c *Cache) CountMiss() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Misses++
	c.observe(func(o Observer) { o.Miss() })
}

// ObserveRestore records how long restoring a hit took.
func (c *Cache) ObserveRestore(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observe(func(o Observer) { o.Restore(d.Seconds()) })
}

// Has reports whether an entry holds exactly toks or extends it.
func (c *Cache) Has(toks []engine.Token) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, match := c.longestLocked(toks, c.chain(toks))
	return match == len(toks) && len(toks) >= BlockTokens
}

// longestLocked finds the entry sharing the longest prefix with toks.
func (c *Cache) longestLocked(toks []engine.Token, hashes []uint64) (*entry, int) {
	var cands []*entry
	for _, h := range hashes {
		es := c.blocks[h]
		if len(es) == 0 {
			break
		}
		cands = es
	}
	var best *entry
	bestMatch := 0
	for _, e := range cands {
		m := commonPrefix(e.tokens, toks)
		// On a tie prefer the shorter entry: it restores fewer bytes.
		if m > bestMatch || (m == bestMatch && best != nil && len(e.tokens) < len(best.tokens)) {
			best, bestMatch = e, m
		}
	}
	if bestMatch < BlockTokens {
		return nil, 0
	}
	return best, bestMatch
}

func commonPrefix(a, b []engine.Token) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// Put caches the state of toks (state holds exactly len(toks) positions).
// An entry that toks extends is replaced, since the new one serves every
// prompt the old one did; when an entry already extends toks, nothing is
// added. States too large for every budget are not kept.
func (c *Cache) Put(toks []engine.Token, state []byte) {
	if len(toks) < BlockTokens || len(state) == 0 {
		return
	}
	toks = append([]engine.Token(nil), toks...)
	hashes := c.chain(toks)
	c.mu.Lock()
	defer c.mu.Unlock()
	var prefixes []*entry
	seen := map[*entry]bool{}
	for _, h := range hashes {
		es := c.blocks[h]
		if len(es) == 0 {
			break
		}
		for _, e := range es {
			if seen[e] {
				continue
			}
			seen[e] = true
			m := commonPrefix(e.tokens, toks)
			switch {
			case m == len(toks): // e holds toks already, or extends it
				c.touchLocked(e)
				return
			case m == len(e.tokens):
				prefixes = append(prefixes, e)
			}
		}
	}
	size := int64(len(state))
	toDisk := c.disk != nil && c.disk.fileSize(toks, len(state)) <= c.cfg.DiskBytes
	if size > c.cfg.MemoryBytes && !toDisk {
		return
	}
	e := &entry{tokens: toks, hashes: hashes}
	for _, p := range prefixes {
		// Inherit the use counts of what the new entry replaces.
		e.freq = max(e.freq, p.freq)
		c.removeLocked(p)
	}
	c.insertLocked(e)
	c.touchLocked(e)
	if size <= c.cfg.MemoryBytes {
		e.mem = state
		c.memUsed += size
		c.evictMemLocked(e)
	}
	if toDisk {
		file, n, err := c.disk.store(toks, state)
		if err != nil {
			c.log.Warn("kv cache: could not write an entry to disk", "err", err)
		} else {
			e.file, e.disk = file, n
			c.dskUsed += n
			c.evictDiskLocked(e)
		}
	}
	if e.mem == nil && e.disk == 0 {
		c.removeLocked(e)
	}
	c.publishLocked()
}

// touchLocked counts a use (GDSF: priority = clock + uses).
func (c *Cache) touchLocked(e *entry) {
	e.freq++
	e.prio = c.clock + e.freq
}

func (c *Cache) insertLocked(e *entry) {
	c.entries[e] = struct{}{}
	for _, h := range e.hashes {
		c.blocks[h] = append(c.blocks[h], e)
	}
}

// removeLocked forgets e in every tier.
func (c *Cache) removeLocked(e *entry) {
	if _, ok := c.entries[e]; !ok {
		return
	}
	delete(c.entries, e)
	for _, h := range e.hashes {
		es := c.blocks[h]
		for i, x := range es {
			if x == e {
				es = append(es[:i], es[i+1:]...)
				break
			}
		}
		if len(es) == 0 {
			delete(c.blocks, h)
		} else {
			c.blocks[h] = es
		}
	}
	c.memUsed -= e.size()
	e.mem = nil
	c.dropDiskLocked(e)
}

func (c *Cache) dropDiskLocked(e *entry) {
	if e.disk == 0 && e.file == "" {
		return
	}
	c.disk.remove(e.file)
	c.dskUsed -= e.disk
	e.disk, e.file = 0, ""
	if e.mem == nil {
		c.removeLocked(e)
	}
}

// evictMemLocked frees memory, lowest priority first, until the budget
// holds; keep is not evicted (it was just added).
func (c *Cache) evictMemLocked(keep *entry) {
	for c.memUsed > c.cfg.MemoryBytes {
		v := c.victimLocked(func(e *entry) bool { return e.mem != nil && e != keep })
		if v == nil {
			return
		}
		c.clock = max(c.clock, v.prio)
		c.stats.Evictions[Memory]++
		c.observe(func(o Observer) { o.Evict(Memory) })
		c.memUsed -= v.size()
		v.mem = nil
		if v.disk == 0 {
			c.removeLocked(v)
		}
	}
}

// evictDiskLocked frees disk space, lowest priority first, until the
// budget holds; keep is not evicted (it was just written).
func (c *Cache) evictDiskLocked(keep *entry) {
	for c.dskUsed > c.cfg.DiskBytes {
		v := c.victimLocked(func(e *entry) bool { return e.disk > 0 && e != keep })
		if v == nil {
			return
		}
		c.clock = max(c.clock, v.prio)
		c.stats.Evictions[Disk]++
		c.observe(func(o Observer) { o.Evict(Disk) })
		c.dropDiskLocked(v)
	}
}

// victimLocked is the entry of lowest priority among those ok accepts.
// A scan: a cache holds hundreds to a few thousand passages, and an
// eviction follows a prefill that costs far more.
func (c *Cache) victimLocked(ok func(*entry) bool) *entry {
	var v *entry
	for e := range c.entries {
		if ok(e) && (v == nil || e.prio < v.prio) {
			v = e
		}
	}
	return v
}

func (c *Cache) observe(f func(Observer)) {
	if c.cfg.Observer != nil {
		f(c.cfg.Observer)
	}
}

func (c *Cache) publishLocked() {
	c.observe(func(o Observer) {
		o.Bytes(Memory, c.memUsed)
		o.Bytes(Disk, c.dskUsed)
	})
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Entries, s.MemoryBytes, s.DiskBytes = len(c.entries), c.memUsed, c.dskUsed
	return s
}
