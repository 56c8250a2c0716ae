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
	"slices"
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
	// DiskError: a disk write failed. DiskOn: whether entries are being
	// written to disk (false from a failed write until one works again).
	DiskError()
	DiskOn(bool)
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
// remove positions [Match, Positions). Logits, when not nil, are the
// next-token logits after the whole prompt (Match is then its length): the
// caller needs no forward pass for them. Otherwise Match leaves at least
// the prompt's last token to decode, for its logits. State and Logits are
// shared: read them only.
type Hit struct {
	// State is valid until Done.
	State     []byte
	Logits    []float32
	Positions int
	Match     int
	Tier      Tier

	c   *Cache
	blk *block // the memory tier's bytes State shares, nil from disk
}

// Done ends the caller's use of State: a state in memory that was evicted
// meanwhile is freed now. A Hit not ended keeps its state's memory.
func (h *Hit) Done() {
	if h.blk == nil {
		return
	}
	h.c.mu.Lock()
	h.blk.doneLocked()
	h.c.mu.Unlock()
	h.blk, h.State = nil, nil
}

// Logits are the next-token logits after the first At tokens of an entry
// (the row of its token At-1), kept so that a prompt ending there starts
// its answer without a forward pass.
type Logits struct {
	At     int
	Values []float32
}

func logitsAt(ends []Logits, at int) []float32 {
	for _, l := range ends {
		if l.At == at {
			return l.Values
		}
	}
	return nil
}

// mergeLogits adds to ends those of more that it lacks, up to n tokens.
func mergeLogits(ends, more []Logits, n int) []Logits {
	for _, l := range more {
		if l.At <= n && l.At > 0 && logitsAt(ends, l.At) == nil {
			ends = append(ends, l)
		}
	}
	return ends
}

func logitsBytes(ends []Logits) int64 {
	n := 0
	for _, l := range ends {
		n += 4 * len(l.Values)
	}
	return int64(n)
}

// entry is one cached prefix.
type entry struct {
	tokens []engine.Token
	hashes []uint64 // chain hash of each full block
	mem    *block   // nil when only on disk
	ends   []Logits // with mem
	disk   int64    // bytes on disk, 0 when not there
	file   string
	freq   float64
	prio   float64
	// written is open while Put writes the entry's file outside the
	// lock; memory eviction then keeps the entry (its disk copy is on the
	// way), and a drop waits for the write so as to remove the file.
	written chan struct{}
}

func (e *entry) size() int64 {
	if e.mem == nil {
		return 0
	}
	return int64(len(e.mem.b)) + logitsBytes(e.ends)
}

// dropMemLocked lets go of e's state in memory.
func (e *entry) dropMemLocked() {
	if e.mem != nil {
		e.mem.freeLocked()
	}
	e.mem, e.ends = nil, nil
}

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
	// diskOff is when a disk write last failed, zero while writes work.
	diskOff time.Time
	now     func() time.Time
}

// Stats are counters since the cache was made.
type Stats struct {
	Hits        [3]uint64 // by Tier
	Misses      uint64
	Evictions   [3]uint64 // by Tier (Memory, Disk)
	Refused     uint64    // disk entries refused (corrupt, foreign, ...)
	DiskErrors  uint64    // disk writes that failed
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
	c := &Cache{cfg: cfg, seed: maphash.MakeSeed(), log: cfg.Log, blocks: map[uint64][]*entry{}, entries: map[*entry]struct{}{}, now: time.Now}
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
		seen := map[string]bool{}
		for _, f := range found {
			// Two files of the same tokens: a crash after a write whose
			// entry had been dropped or replaced. One serves.
			k := tokensKey(f.tokens)
			if seen[k] {
				d.remove(f.name)
				continue
			}
			seen[k] = true
			e := &entry{tokens: f.tokens, disk: f.size, file: f.name}
			e.hashes = c.chain(e.tokens)
			c.insertLocked(e)
			c.dskUsed += f.size
		}
		c.evictDiskLocked(nil)
		c.publishLocked()
		c.observe(func(o Observer) { o.DiskOn(true) })
	}
	return c, nil
}

// tokensKey is a map key for a token sequence.
func tokensKey(toks []engine.Token) string {
	b := make([]byte, 4*len(toks))
	for i, t := range toks {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
	}
	return string(b)
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

// Lookup returns the cached state sharing the longest prefix with toks, a
// prompt, if that prefix is at least one block and longer than better
// (what the caller already has, e.g. in its sequence), loading it from
// disk if it is only there. The prefix covers the whole prompt only where
// the entry has the logits after it (Hit.Logits); otherwise it stops one
// token short. A hit sharing at least counts tokens is counted as a hit, a
// shorter one (only the template every prompt starts with, say) as a miss;
// without a hit the caller counts what it does (CountContextHit or
// CountMiss).
func (c *Cache) Lookup(toks []engine.Token, better, counts int) (Hit, bool) {
	c.mu.Lock()
	e, match := c.longestLocked(toks, c.chain(toks))
	// Without logits for the whole prompt, its last token must be decoded.
	fits := func(ends []Logits) (int, []float32) {
		if match == len(toks) {
			if l := logitsAt(ends, match); l != nil {
				return match, l
			}
		}
		return min(match, len(toks)-1), nil
	}
	if e == nil || match <= better {
		c.mu.Unlock()
		return Hit{}, false
	}
	count := func(tier Tier, m int) {
		if m >= counts {
			c.stats.Hits[tier]++
			c.observe(func(o Observer) { o.Hit(tier) })
		} else {
			c.stats.Misses++
			c.observe(func(o Observer) { o.Miss() })
		}
	}
	if e.mem != nil {
		m, logits := fits(e.ends)
		if m <= better {
			c.mu.Unlock()
			return Hit{}, false
		}
		c.touchLocked(e)
		count(Memory, m)
		e.mem.refs++
		h := Hit{State: e.mem.b, Logits: logits, Positions: len(e.tokens), Match: m, Tier: Memory, c: c, blk: e.mem}
		c.mu.Unlock()
		return h, true
	}
	file := e.file
	c.mu.Unlock()
	if file == "" {
		return Hit{}, false // its file is still being written
	}

	// Read outside the lock: a disk read takes milliseconds.
	state, ends, err := c.disk.load(file, e.tokens)
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
	m, logits := fits(ends)
	if m <= better {
		return Hit{}, false
	}
	c.touchLocked(e)
	count(Disk, m)
	if live && e.mem == nil && c.cfg.MemoryBytes >= int64(len(state))+logitsBytes(ends) {
		if blk, err := newBlock(state); err == nil {
			e.mem, e.ends = blk, ends
			c.memUsed += e.size()
			c.evictMemLocked(e)
		}
	}
	c.publishLocked()
	return Hit{State: state, Logits: logits, Positions: len(e.tokens), Match: m, Tier: Disk}, true
}

// LogitsAfter returns the cached logits after exactly toks, if an entry in
// memory holding toks has them: for a caller whose sequence still holds
// toks and needs only their distribution. It counts nothing.
func (c *Cache) LogitsAfter(toks []engine.Token) []float32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, match := c.longestLocked(toks, c.chain(toks))
	if e == nil || match != len(toks) || e.mem == nil {
		return nil
	}
	l := logitsAt(e.ends, len(toks))
	if l != nil {
		c.touchLocked(e)
	}
	return l
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
	// Of entries holding all of toks, one with the logits after it spares
	// the caller a forward pass.
	ends := func(e *entry) bool { return logitsAt(e.ends, len(toks)) != nil }
	for _, e := range cands {
		m := CommonPrefix(e.tokens, toks)
		better := m > bestMatch
		if m == bestMatch && best != nil {
			// On a tie prefer the entry with those logits, then the shorter
			// entry: it restores fewer bytes.
			switch le, lb := m == len(toks) && ends(e), m == len(toks) && ends(best); {
			case le != lb:
				better = le
			default:
				better = len(e.tokens) < len(best.tokens)
			}
		}
		if better {
			best, bestMatch = e, m
		}
	}
	if bestMatch < BlockTokens {
		return nil, 0
	}
	return best, bestMatch
}

// CommonPrefix is how many leading tokens a and b share.
func CommonPrefix(a, b []engine.Token) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// Put caches the state of toks (state holds exactly len(toks) positions)
// and the logits after some of its prefixes. An entry that toks extends is
// replaced, since the new one serves every prompt the old one did, and its
// logits carry over (those in memory: a prefix held only on disk is not
// read back for them); when an entry already extends toks, it only gains the
// logits it lacks (in memory). States too large for every budget are not
// kept. A nil state only adds logits to an entry that holds toks; Put
// reports whether an entry now holds toks (and, in memory, the logits).
func (c *Cache) Put(toks []engine.Token, state []byte, ends ...Logits) bool {
	if len(toks) < BlockTokens {
		return false
	}
	toks = append([]engine.Token(nil), toks...)
	c.mu.Lock()
	held, w := c.putLocked(toks, state, ends)
	c.mu.Unlock()
	if w == nil {
		return held
	}
	// The file is written outside the lock: a slow disk then delays this
	// Put, not every other side's lookups.
	e := w.e
	file, n, err := c.disk.store(toks, state, w.ends)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer close(e.written)
	e.written = nil
	_, live := c.entries[e]
	switch {
	case err != nil:
		c.diskFailedLocked(err)
		if e.mem == nil {
			c.removeLocked(e)
		}
	case !live:
		// Dropped (a deleted document's, say) or replaced while it was
		// written; the file has a name of its own, so this removes no
		// other entry's.
		c.disk.remove(file)
	default:
		c.diskWorkedLocked()
		e.file, e.disk = file, n
		c.dskUsed += n
		c.evictDiskLocked(e)
	}
	c.publishLocked()
	_, live = c.entries[e]
	return live
}

// diskWrite is an entry Put is to write to disk, with its logits (which
// memory holds only with its state).
type diskWrite struct {
	e    *entry
	ends []Logits
}

// putLocked is Put's work under the lock: it reports whether an entry
// holds toks, and the write to disk Put is to do, if any (the entry's
// written channel is then open until the write is done).
func (c *Cache) putLocked(toks []engine.Token, state []byte, ends []Logits) (held bool, _ *diskWrite) {
	hashes := c.chain(toks)
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
			m := CommonPrefix(e.tokens, toks)
			switch {
			case m == len(toks): // e holds toks already, or extends it
				c.touchLocked(e)
				if e.mem == nil {
					return len(ends) == 0, nil
				}
				merged := mergeLogits(e.ends, ends, len(toks))
				if int64(len(e.mem.b))+logitsBytes(merged) > c.cfg.MemoryBytes {
					return false, nil
				}
				c.memUsed -= e.size()
				e.ends = merged
				c.memUsed += e.size()
				c.evictMemLocked(e)
				c.publishLocked()
				return true, nil
			case m == len(e.tokens):
				prefixes = append(prefixes, e)
			}
		}
	}
	if len(state) == 0 {
		return false, nil
	}
	ends = mergeLogits(nil, ends, len(toks))
	for _, p := range prefixes {
		ends = mergeLogits(ends, p.ends, len(toks))
	}
	size := int64(len(state)) + logitsBytes(ends)
	toDisk := c.diskOnLocked() && c.disk.fileSize(toks, len(state), ends) <= c.cfg.DiskBytes
	if size > c.cfg.MemoryBytes && !toDisk {
		return false, nil
	}
	var blk *block
	if size <= c.cfg.MemoryBytes {
		var err error
		if blk, err = newBlock(state); err != nil {
			c.log.Warn("kv cache: no memory for a state", "err", err)
			if !toDisk {
				return false, nil
			}
		}
	}
	e := &entry{tokens: toks, hashes: hashes}
	for _, p := range prefixes {
		// Inherit the use counts of what the new entry replaces.
		e.freq = max(e.freq, p.freq)
		c.removeLocked(p)
	}
	c.insertLocked(e)
	c.touchLocked(e)
	if blk != nil {
		e.mem, e.ends = blk, ends
		c.memUsed += e.size()
		c.evictMemLocked(e)
	}
	c.publishLocked()
	if !toDisk {
		return true, nil
	}
	e.written = make(chan struct{})
	return true, &diskWrite{e, ends}
}

// diskOnLocked says whether entries are to be written to disk: there is a
// directory, and its last write did not fail in the past diskRetry.
func (c *Cache) diskOnLocked() bool {
	return c.disk != nil && (c.diskOff.IsZero() || c.now().Sub(c.diskOff) >= diskRetry)
}

// diskRetry is how long the disk tier stays off after a write failed: a
// full or failing disk then costs one failed write every few minutes,
// not one per prefill.
const diskRetry = 5 * time.Minute

// diskFailedLocked turns the disk tier off for diskRetry after a write
// failed. What is on disk stays readable.
func (c *Cache) diskFailedLocked(err error) {
	c.stats.DiskErrors++
	c.observe(func(o Observer) { o.DiskError(); o.DiskOn(false) })
	if c.diskOff.IsZero() {
		c.log.Warn("kv cache: a disk write failed; entries stay in memory only, and writes are tried again later",
			"dir", c.cfg.Dir, "retry_in", diskRetry, "err", err)
	}
	c.diskOff = c.now()
}

// diskWorkedLocked turns the disk tier back on after a write succeeded.
func (c *Cache) diskWorkedLocked() {
	if c.diskOff.IsZero() {
		return
	}
	c.diskOff = time.Time{}
	c.observe(func(o Observer) { o.DiskOn(true) })
	c.log.Info("kv cache: disk writes work again", "dir", c.cfg.Dir)
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

// DropContaining removes, from memory and disk, every entry whose tokens
// hold any of frags as a contiguous run, and returns how many it removed:
// a deleted document's passages must not be restored from the cache.
//
// It returns once their files are gone, those being written included.
func (c *Cache) DropContaining(frags [][]engine.Token) int {
	c.mu.Lock()
	n := 0
	var writing []chan struct{}
	for e := range c.entries {
		for _, f := range frags {
			if len(f) > 0 && containsRun(e.tokens, f) {
				if e.written != nil {
					writing = append(writing, e.written)
				}
				c.removeLocked(e)
				n++
				break
			}
		}
	}
	if n > 0 {
		c.publishLocked()
	}
	c.mu.Unlock()
	for _, w := range writing {
		<-w // the write sees its entry dropped and removes its file
	}
	return n
}

// containsRun says whether run occurs in toks.
func containsRun(toks, run []engine.Token) bool {
	for i := 0; i+len(run) <= len(toks); i++ {
		if toks[i] == run[0] && slices.Equal(toks[i:i+len(run)], run) {
			return true
		}
	}
	return false
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
	e.dropMemLocked()
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
		v.dropMemLocked()
		if v.disk == 0 && v.written == nil {
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
