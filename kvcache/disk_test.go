package kvcache_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/kvcache"
)

// fileSize is the size of an entry's file (see the layout in disk.go)
// with logits of len(logits) entries, logits[i] values each.
func fileSize(namespace string, tokens, stateBytes int, logits ...int) int64 {
	return int64(headerSize(namespace, tokens)+stateBytes) + logitsSize(logits...) + 4
}

// headerSize is the offset of the state in an entry's file.
func headerSize(namespace string, tokens int) int {
	return 8 + 4 + 4 + len(namespace) + 4 + 4*tokens + 8 + 8
}

// logitsSize is the size of a logits section of len(logits) entries,
// logits[i] values each.
func logitsSize(logits ...int) int64 {
	n := int64(4)
	for _, k := range logits {
		n += 8 + 4*int64(k)
	}
	return n
}

// kvFiles lists the entry files in dir.
func kvFiles(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, de := range des {
		if de.Type().IsRegular() && strings.HasSuffix(de.Name(), ".kv") {
			out = append(out, de.Name())
		}
	}
	sort.Strings(out)
	return out
}

// dirBytes is the size of the entry files in dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	for _, name := range kvFiles(t, dir) {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		n += fi.Size()
	}
	return n
}

// onlyFile is the path of dir's one entry file.
func onlyFile(t *testing.T, dir string) string {
	t.Helper()
	files := kvFiles(t, dir)
	require.Len(t, files, 1)
	return filepath.Join(dir, files[0])
}

// textLog is a logger writing text lines to buf.
func textLog(buf *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

// logLines are the lines logged to buf.
func logLines(buf *bytes.Buffer) []string {
	s := strings.TrimSpace(buf.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func diskCache(t *testing.T, dir string, memory, disk int64, log *slog.Logger) *kvcache.Cache {
	t.Helper()
	return newCache(t, kvcache.Config{Dir: dir, MemoryBytes: memory, DiskBytes: disk, Log: log})
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestDiskFileFormat: an entry's file is laid out as disk.go documents,
// without logits and with them (in the order put).
func TestDiskFileFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		ends []kvcache.Logits
	}{
		{"no logits", nil},
		{"logits", []kvcache.Logits{
			{At: 20, Values: []float32{1.5, -2, float32(math.Inf(1)), 0, math.SmallestNonzeroFloat32}},
			{At: 16, Values: []float32{math.MaxFloat32}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkFileFormat(t, tc.ends)
		})
	}
}

func checkFileFormat(t *testing.T, ends []kvcache.Logits) {
	dir := t.TempDir()
	c := diskCache(t, dir, 0, 1<<20, nil)
	toks := seq(3, 20)
	state := []byte("0123456789abcdefghijklmnopqrstuvwxyz")
	c.Put(toks, state, ends...)
	path := onlyFile(t, dir)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var counts []int
	for _, l := range ends {
		counts = append(counts, len(l.Values))
	}
	require.Len(t, b, int(fileSize(ns, len(toks), len(state), counts...)))
	assert.Equal(t, int64(len(b)), c.Stats().DiskBytes)

	le := binary.LittleEndian
	assert.Equal(t, "DRGNKV\x00\x01", string(b[:8]), "magic")
	assert.Equal(t, kvcache.FormatVersion, le.Uint32(b[8:]), "version")
	nsLen := int(le.Uint32(b[12:]))
	require.Equal(t, len(ns), nsLen)
	assert.Equal(t, ns, string(b[16:16+nsLen]))
	p := 16 + nsLen
	require.Equal(t, uint32(len(toks)), le.Uint32(b[p:]))
	p += 4
	for i, tok := range toks {
		assert.Equal(t, tok, engine.Token(le.Uint32(b[p+4*i:])))
	}
	p += 4 * len(toks)
	require.Equal(t, uint64(len(state)), le.Uint64(b[p:]), "state bytes")
	p += 8
	require.Equal(t, uint64(logitsSize(counts...)), le.Uint64(b[p:]), "logits bytes")
	p += 8
	assert.Equal(t, headerSize(ns, len(toks)), p)
	assert.Equal(t, state, b[p:p+len(state)])
	p += len(state)
	require.Equal(t, uint32(len(ends)), le.Uint32(b[p:]), "logits count")
	p += 4
	for _, l := range ends {
		assert.Equal(t, uint32(l.At), le.Uint32(b[p:]), "At")
		require.Equal(t, uint32(len(l.Values)), le.Uint32(b[p+4:]), "values")
		p += 8
		for _, v := range l.Values {
			assert.Equal(t, math.Float32bits(v), le.Uint32(b[p:]), "float32 bits")
			p += 4
		}
	}
	require.Equal(t, len(b)-4, p)
	assert.Equal(t, crc32.Checksum(b[:p], crc32.MakeTable(crc32.Castagnoli)), le.Uint32(b[p:]), "CRC-32C of all before it")
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, des, 1, "no temporary file left behind")
}

// TestDiskSurvivesRestart: a new cache over the directory starts with the
// entries on disk only, hits them from disk with the bytes put, and moves
// them to memory.
func TestDiskSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	entries := map[string]struct {
		toks  []engine.Token
		state []byte
	}{
		"a": {seq(1, 32), fill(320, 'a')},
		"b": {seq(2, 48), fill(480, 'b')},
		"c": {branch(3, 16, 1, 40), fill(400, 'c')},
		"d": {seq(4, 64), fill(640, 'd')}, // replaces seq(4, 32) below
	}
	c1 := diskCache(t, dir, 1<<20, 1<<20, nil)
	c1.Put(seq(4, 32), fill(320, 'x'))
	var want, stateBytes int64
	for _, e := range entries {
		c1.Put(e.toks, e.state)
		want += fileSize(ns, len(e.toks), len(e.state))
		stateBytes += int64(len(e.state))
	}
	assert.Len(t, kvFiles(t, dir), 4, "the replaced prefix's file is removed")
	assert.Equal(t, want, dirBytes(t, dir))
	st1 := c1.Stats()
	assert.Equal(t, want, st1.DiskBytes)
	assert.Equal(t, stateBytes, st1.MemoryBytes)

	var logs bytes.Buffer
	c2 := diskCache(t, dir, 1<<20, 1<<20, textLog(&logs))
	st := c2.Stats()
	assert.Equal(t, kvcache.Stats{Entries: 4, DiskBytes: want}, st, "on disk only, nothing counted")
	assert.Empty(t, logs.String())

	// A partial match from disk.
	hit, ok := c2.Lookup(branch(2, 20, 7, 48), 0, 0)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, 20, hit.Match)
	assert.Equal(t, 48, hit.Positions)
	assert.Equal(t, entries["b"].state, hit.State)

	for name, e := range entries {
		if name == "b" {
			continue
		}
		hit, ok := look(c2, e.toks)
		require.True(t, ok, name)
		assert.Equal(t, kvcache.Disk, hit.Tier, name)
		assert.Equal(t, e.state, hit.State, name)
		assert.Equal(t, len(e.toks)-1, hit.Match, name+": no logits, the last token to decode")
		assert.Nil(t, hit.Logits, name)
		assert.Equal(t, len(e.toks), hit.Positions, name)
	}
	hit, ok = look(c2, seq(4, 32))
	require.True(t, ok)
	assert.Equal(t, 64, hit.Positions, "the replacement, not the prefix it replaced")
	st = c2.Stats()
	assert.Equal(t, uint64(4), st.Hits[kvcache.Disk])
	assert.Equal(t, uint64(1), st.Hits[kvcache.Memory], "seq(4, 32) after d moved to memory")
	assert.Equal(t, stateBytes, st.MemoryBytes, "every entry moved to memory")
	assert.Equal(t, want, st.DiskBytes, "and stays on disk")
	assert.Zero(t, st.Refused)

	for name, e := range entries {
		hit, ok := look(c2, e.toks)
		require.True(t, ok, name)
		assert.Equal(t, kvcache.Memory, hit.Tier, name)
		assert.Equal(t, e.state, hit.State, name)
	}
	assert.Equal(t, uint64(5), c2.Stats().Hits[kvcache.Memory])
	assert.Equal(t, uint64(4), c2.Stats().Hits[kvcache.Disk])
}

// TestDiskHitsWithoutRoomInMemory: without room in memory a disk entry is
// read from disk each time.
func TestDiskHitsWithoutRoomInMemory(t *testing.T) {
	for _, memory := range []int64{0, 319} {
		dir := t.TempDir()
		diskCache(t, dir, 1<<20, 1<<20, nil).Put(seq(1, 32), stateFor(32))
		c := diskCache(t, dir, memory, 1<<20, nil)
		for range 3 {
			hit, ok := look(c, seq(1, 32))
			require.True(t, ok)
			assert.Equal(t, kvcache.Disk, hit.Tier)
			assert.Equal(t, stateFor(32), hit.State)
		}
		st := c.Stats()
		assert.Equal(t, uint64(3), st.Hits[kvcache.Disk])
		assert.Zero(t, st.MemoryBytes)
		assert.Zero(t, st.Evictions[kvcache.Memory])
	}
}

// TestDiskPromotionEvictsFromMemoryOnly: moving a disk entry to memory
// evicts another from memory, which stays on disk.
func TestDiskPromotionEvictsFromMemoryOnly(t *testing.T) {
	dir := t.TempDir()
	a, b := seq(1, 32), seq(2, 32)
	c1 := diskCache(t, dir, 1<<20, 1<<20, nil)
	c1.Put(a, fill(320, 'a'))
	c1.Put(b, fill(320, 'b'))
	c := diskCache(t, dir, 320, 1<<20, nil)
	hit, ok := look(c, a)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, int64(320), c.Stats().MemoryBytes)
	hit, ok = look(c, a)
	require.True(t, ok)
	assert.Equal(t, kvcache.Memory, hit.Tier)

	hit, ok = look(c, b)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, fill(320, 'b'), hit.State)
	st := c.Stats()
	assert.Equal(t, uint64(1), st.Evictions[kvcache.Memory], "a made room for b")
	assert.Zero(t, st.Evictions[kvcache.Disk])
	assert.Equal(t, 2, st.Entries)
	assert.Equal(t, int64(320), st.MemoryBytes)
	assert.Equal(t, 2*fileSize(ns, 32, 320), st.DiskBytes)

	hit, ok = look(c, a)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier, "a is back to disk only")
	assert.Equal(t, fill(320, 'a'), hit.State)
	assert.Len(t, kvFiles(t, dir), 2)
}

// TestDiskOnlyForLargeStates: a state over the memory budget goes to disk
// only.
func TestDiskOnlyForLargeStates(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 100, 1<<20, nil)
	c.Put(seq(1, 32), stateFor(32))
	st := c.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Zero(t, st.MemoryBytes)
	assert.Equal(t, fileSize(ns, 32, 320), st.DiskBytes)
	hit, ok := look(c, seq(1, 32))
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, stateFor(32), hit.State)
	assert.Zero(t, c.Stats().MemoryBytes, "not moved to memory: it does not fit")
	// Too large for both budgets: not kept anywhere.
	small := diskCache(t, t.TempDir(), 100, 200, nil)
	small.Put(seq(2, 32), stateFor(32))
	assert.Equal(t, kvcache.Stats{}, small.Stats())
}

// TestDiskRefusals: an entry that cannot be used is refused with one log
// line, gives no hit, and is recomputed: a later Put writes a valid file.
func TestDiskRefusals(t *testing.T) {
	toks, state := seq(1, 32), stateFor(32)
	stateAt := headerSize(ns, len(toks))
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		atScan bool   // refused by New, else by Lookup
		log    string // in the log line
	}{
		{"corrupt state", func(b []byte) []byte { b[stateAt+100] ^= 0x40; return b }, false, "checksum"},
		{"corrupt first state byte", func(b []byte) []byte { b[stateAt] ^= 1; return b }, false, "checksum"},
		{"corrupt checksum", func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b }, false, "checksum"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-10] }, true, "truncated"},
		{"truncated to the header", func(b []byte) []byte { return b[:stateAt] }, true, "truncated"},
		{"truncated in the header", func(b []byte) []byte { return b[:20] }, true, "header"},
		{"padded", func(b []byte) []byte { return append(b, 0) }, true, "padded"},
		{"foreign version", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], kvcache.FormatVersion+1)
			return b
		}, true, "format version"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, true, "magic"},
		{"empty", func([]byte) []byte { return nil }, true, "EOF"},
		{"no tokens", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[16+len(ns):], 0)
			return b
		}, true, "0 tokens"},
		{"absurd token count", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[16+len(ns):], 1<<30)
			return b
		}, true, "tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRefusal(t, toks, state, nil, tc.damage, tc.atScan, tc.log)
		})
	}
}

// checkRefusal puts toks, state and ends in a cache directory, damages the
// entry's file and checks that it is refused (by New if atScan, else by
// Lookup) with one log line holding log, gives no hit, is removed, and is
// recomputed: a later Put writes a valid file that a restart hits.
func checkRefusal(t *testing.T, toks []engine.Token, state []byte, ends []kvcache.Logits, damage func([]byte) []byte, atScan bool, log string) {
	t.Helper()
	dir := t.TempDir()
	diskCache(t, dir, 1<<20, 1<<20, nil).Put(toks, state, ends...)
	path := onlyFile(t, dir)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, damage(b), 0o644))

	var logs bytes.Buffer
	c := diskCache(t, dir, 0, 1<<20, textLog(&logs))
	st := c.Stats()
	if atScan {
		assert.Equal(t, kvcache.Stats{Refused: 1}, st)
		assert.False(t, exists(path), "removed, so that it is recomputed")
		require.Len(t, logLines(&logs), 1, logs.String())
	} else {
		assert.Equal(t, kvcache.Stats{Entries: 1, DiskBytes: int64(len(b))}, st, "the scan reads headers only")
		assert.Empty(t, logs.String())
	}

	hit, ok := look(c, toks)
	assert.False(t, ok)
	assert.Equal(t, kvcache.Hit{}, hit)
	_, ok = look(c, toks)
	assert.False(t, ok, "refused once, then gone")
	st = c.Stats()
	assert.Equal(t, uint64(1), st.Refused)
	assert.Zero(t, st.Entries)
	assert.Zero(t, st.DiskBytes)
	assert.Zero(t, st.MemoryBytes)
	assert.False(t, exists(path))
	lines := logLines(&logs)
	require.Len(t, lines, 1, "one line per bad entry: %s", logs.String())
	assert.Contains(t, lines[0], "level=WARN")
	assert.Contains(t, lines[0], "refusing")
	assert.Contains(t, lines[0], filepath.Base(path))
	assert.Contains(t, lines[0], log)

	// Recomputed: the next Put writes a valid file (of a name of its
	// own) that a restart hits.
	c.Put(toks, state, ends...)
	assert.NotEqual(t, path, onlyFile(t, dir))
	var counts []int
	for _, l := range ends {
		counts = append(counts, len(l.Values))
	}
	assert.Equal(t, fileSize(ns, len(toks), len(state), counts...), c.Stats().DiskBytes)
	var logs2 bytes.Buffer
	c2 := diskCache(t, dir, 0, 1<<20, textLog(&logs2))
	hit, ok = look(c2, toks)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, state, hit.State)
	if want := logitsOf(ends, len(toks)); want != nil {
		assert.Equal(t, len(toks), hit.Match)
		assertSameBits(t, want, hit.Logits)
	} else {
		assert.Equal(t, len(toks)-1, hit.Match)
		assert.Nil(t, hit.Logits)
	}
	assert.Zero(t, c2.Stats().Refused)
	assert.Empty(t, logs2.String())
}

// logitsOf are the values of ends at at, nil if none.
func logitsOf(ends []kvcache.Logits, at int) []float32 {
	for _, l := range ends {
		if l.At == at {
			return l.Values
		}
	}
	return nil
}

// assertSameBits checks that got holds want's float32s bit for bit (-0 is
// not 0).
func assertSameBits(t *testing.T, want, got []float32, msgAndArgs ...any) {
	t.Helper()
	bits := func(v []float32) []uint32 {
		if v == nil {
			return nil
		}
		out := make([]uint32, len(v))
		for i, x := range v {
			out[i] = math.Float32bits(x)
		}
		return out
	}
	assert.Equal(t, bits(want), bits(got), msgAndArgs...)
}

// arbitraryFloats are n float32s of random bits, NaNs excepted, after the
// awkward ones (signed zeros, infinities, extremes, a subnormal) as far as
// n allows.
func arbitraryFloats(r *rand.Rand, n int) []float32 {
	special := []float32{
		float32(math.Copysign(0, -1)), 0, float32(math.Inf(1)), float32(math.Inf(-1)),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, -1.5e-42,
	}
	out := make([]float32, n)
	for i := range out {
		if i < len(special) {
			out[i] = special[i]
			continue
		}
		for {
			v := math.Float32frombits(r.Uint32())
			if v == v { // not NaN
				out[i] = v
				break
			}
		}
	}
	return out
}

// recrc recomputes a damaged file's checksum, so that only the checks
// past it can refuse the file.
func recrc(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// TestDiskLogitsRefusals: a file whose logits section is damaged, or
// disagrees with its header or its tokens even under a valid checksum, is
// refused with one log line and recomputed.
func TestDiskLogitsRefusals(t *testing.T) {
	toks, state := seq(1, 32), stateFor(32)
	ends := []kvcache.Logits{
		{At: 20, Values: []float32{1.5, -2, 0.25}},
		{At: 32, Values: []float32{1, 2, 3, 4, 5}},
	}
	le := binary.LittleEndian
	lengths := headerSize(ns, len(toks)) - 16 // the state's, then the logits' length
	sec := headerSize(ns, len(toks)) + len(state)
	// The section: count at sec, then At, n and values: At 20 at sec+4,
	// its n at sec+8, its values from sec+12; At 32 at sec+24, its n at
	// sec+28, its values from sec+32 to sec+52.
	require.Equal(t, int64(52), logitsSize(3, 5))
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		atScan bool
		log    string
	}{
		{"corrupt logit value", func(b []byte) []byte { b[sec+12+5] ^= 0x10; return b }, false, "checksum"},
		{"corrupt last logit byte", func(b []byte) []byte { b[sec+51] ^= 0x80; return b }, false, "checksum"},
		{"corrupt logits count", func(b []byte) []byte { b[sec] ^= 1; return b }, false, "checksum"},
		{"corrupt At", func(b []byte) []byte { b[sec+4] ^= 4; return b }, false, "checksum"},
		{"logits length in the header over the file", func(b []byte) []byte {
			le.PutUint64(b[lengths+8:], uint64(logitsSize(3, 5)+4))
			return recrc(b)
		}, true, "truncated or padded"},
		{"logits length in the header under the file", func(b []byte) []byte {
			le.PutUint64(b[lengths+8:], uint64(logitsSize(3, 5)-4))
			return recrc(b)
		}, true, "truncated or padded"},
		{"no logits section in the header", func(b []byte) []byte {
			le.PutUint64(b[lengths+8:], 0)
			return recrc(b)
		}, true, "logits of 0"},
		{"logits section cut short, the file too", func(b []byte) []byte {
			le.PutUint64(b[lengths+8:], 2)
			b = append(b[:sec+2], 0, 0, 0, 0)
			return recrc(b)
		}, true, "logits of 2"},
		{"state longer, logits shorter than written", func(b []byte) []byte {
			le.PutUint64(b[lengths:], uint64(len(state)+4))
			le.PutUint64(b[lengths+8:], uint64(logitsSize(3, 5)-4))
			return recrc(b)
		}, false, "logits after"},
		{"state shorter, logits longer than written", func(b []byte) []byte {
			le.PutUint64(b[lengths:], uint64(len(state)-4))
			le.PutUint64(b[lengths+8:], uint64(logitsSize(3, 5)+4))
			return recrc(b)
		}, false, "logits after"},
		{"At past the tokens", func(b []byte) []byte { le.PutUint32(b[sec+24:], 33); return recrc(b) }, false, "logits after 33 of 32 tokens"},
		{"At far past the tokens", func(b []byte) []byte { le.PutUint32(b[sec+4:], 1<<31); return recrc(b) }, false, "of 32 tokens"},
		{"At 0", func(b []byte) []byte { le.PutUint32(b[sec+4:], 0); return recrc(b) }, false, "logits after 0 of 32 tokens"},
		{"more values than the section holds", func(b []byte) []byte { le.PutUint32(b[sec+28:], 6); return recrc(b) }, false, "6 values"},
		{"absurd value count", func(b []byte) []byte { le.PutUint32(b[sec+8:], 1<<30); return recrc(b) }, false, "values"},
		{"fewer values than the section holds", func(b []byte) []byte { le.PutUint32(b[sec+28:], 4); return recrc(b) }, false, "left over"},
		{"more entries than the section holds", func(b []byte) []byte { le.PutUint32(b[sec:], 3); return recrc(b) }, false, "truncated"},
		{"absurd entry count", func(b []byte) []byte { le.PutUint32(b[sec:], 1<<31); return recrc(b) }, false, "truncated"},
		{"fewer entries than the section holds", func(b []byte) []byte { le.PutUint32(b[sec:], 1); return recrc(b) }, false, "left over"},
		{"no entries, bytes left", func(b []byte) []byte { le.PutUint32(b[sec:], 0); return recrc(b) }, false, "left over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRefusal(t, toks, state, ends, tc.damage, tc.atScan, tc.log)
		})
	}
}

// TestDiskLogitsSurviveRestart: logits put with an entry are written with
// it and come back after a restart bit for bit, each at its At, from disk
// and then from memory, counted in the memory bytes once loaded.
func TestDiskLogitsSurviveRestart(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	toks := seq(1, 64)
	ends := []kvcache.Logits{
		{At: 40, Values: arbitraryFloats(r, 33)},
		{At: 20, Values: arbitraryFloats(r, 7)},
		{At: 64, Values: arbitraryFloats(r, 1)},
		{At: 16, Values: arbitraryFloats(r, 1000)},
	}
	nvalues := 33 + 7 + 1 + 1000
	other := seq(2, 48) // no logits
	c1 := diskCache(t, dir, 1<<20, 1<<20, nil)
	c1.Put(toks, stateFor(64), ends...)
	c1.Put(other, stateFor(48))
	want := fileSize(ns, 64, 640, 33, 7, 1, 1000) + fileSize(ns, 48, 480)
	st := c1.Stats()
	assert.Equal(t, want, st.DiskBytes)
	assert.Equal(t, want, dirBytes(t, dir))
	assert.Equal(t, int64(640+4*nvalues+480), st.MemoryBytes)

	for _, memory := range []int64{1 << 20, 0} {
		t.Run(fmt.Sprint("memory=", memory), func(t *testing.T) {
			var logs bytes.Buffer
			c := diskCache(t, dir, memory, 1<<20, textLog(&logs))
			assert.Equal(t, kvcache.Stats{Entries: 2, DiskBytes: want}, c.Stats(), "on disk only")
			tier := kvcache.Disk
			for _, l := range ends {
				hit, ok := look(c, seq(1, l.At))
				require.True(t, ok, l.At)
				assert.Equal(t, tier, hit.Tier, l.At)
				assert.Equal(t, l.At, hit.Match, l.At)
				assert.Equal(t, 64, hit.Positions, l.At)
				assert.Equal(t, stateFor(64), hit.State, l.At)
				assertSameBits(t, l.Values, hit.Logits, "At %d", l.At)
				if memory > 0 {
					tier = kvcache.Memory
					assert.Equal(t, int64(640+4*nvalues), c.Stats().MemoryBytes, "loaded with its logits")
				} else {
					assert.Zero(t, c.Stats().MemoryBytes)
				}
			}
			for _, n := range []int{17, 39, 41, 63} {
				hit, ok := look(c, seq(1, n))
				require.True(t, ok, n)
				assert.Equal(t, n-1, hit.Match, n)
				assert.Nil(t, hit.Logits, n)
			}
			hit, ok := look(c, seq(1, 100))
			require.True(t, ok)
			assert.Equal(t, 64, hit.Match)
			assert.Nil(t, hit.Logits)
			hit, ok = look(c, other)
			require.True(t, ok)
			assert.Equal(t, kvcache.Disk, hit.Tier)
			assert.Equal(t, 47, hit.Match)
			assert.Nil(t, hit.Logits)
			assert.Zero(t, c.Stats().Refused)
			assert.Empty(t, logs.String())
		})
	}
}

// TestDiskCarriedLogitsAreWritten: logits that a replacement carries over
// from the prefix it replaces are in its file, so a restart serves them.
func TestDiskCarriedLogitsAreWritten(t *testing.T) {
	dir := t.TempDir()
	prompt := seq(1, 40)
	full := cat(prompt, seq(9, 20))
	promptLogits := arbitraryFloats(rand.New(rand.NewPCG(5, 6)), 50)
	c1 := diskCache(t, dir, 1<<20, 1<<20, nil)
	c1.Put(prompt, fill(400, 1), kvcache.Logits{At: 40, Values: promptLogits})
	c1.Put(full, fill(600, 2))
	require.Len(t, kvFiles(t, dir), 1, "the prompt's file is removed")
	assert.Equal(t, fileSize(ns, 60, 600, 50), c1.Stats().DiskBytes)

	c := diskCache(t, dir, 1<<20, 1<<20, nil)
	hit, ok := look(c, prompt)
	require.True(t, ok)
	assert.Equal(t, kvcache.Disk, hit.Tier)
	assert.Equal(t, 40, hit.Match)
	assert.Equal(t, 60, hit.Positions)
	assert.Equal(t, fill(600, 2), hit.State)
	assertSameBits(t, promptLogits, hit.Logits)
}

// TestDiskRefusedIsNoHit: a disk entry refused at Lookup is not counted as
// a hit, since the caller, given no hit, counts a miss itself.
func TestDiskRefusedIsNoHit(t *testing.T) {
	dir := t.TempDir()
	diskCache(t, dir, 0, 1<<20, nil).Put(seq(1, 32), stateFor(32))
	path := onlyFile(t, dir)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)-1] ^= 0xff
	require.NoError(t, os.WriteFile(path, b, 0o644))
	c := diskCache(t, dir, 0, 1<<20, nil)
	_, ok := look(c, seq(1, 32))
	require.False(t, ok)
	st := c.Stats()
	assert.Equal(t, [3]uint64{}, st.Hits)
	assert.Zero(t, st.Misses)
	assert.Equal(t, uint64(1), st.Refused)
}

// TestDiskForeignNamespace: another model's entries are skipped with one
// log line and left in place for it.
func TestDiskForeignNamespace(t *testing.T) {
	toks := seq(1, 32)
	for _, other := range []string{
		"model=TEST;engine=test",      // same length
		"model=other;engine=test",     // another length
		"model=test;engine=test;kv=8", // ours is a prefix of it
		"model=test",                  // a prefix of ours
	} {
		t.Run(other, func(t *testing.T) {
			dir := t.TempDir()
			diskCache(t, dir, 1<<20, 1<<20, nil).Put(toks, fill(320, 'o'))
			path := onlyFile(t, dir)

			var logs bytes.Buffer
			foreign := newCache(t, kvcache.Config{Namespace: other, Dir: dir, DiskBytes: 1 << 20, Log: textLog(&logs)})
			assert.Equal(t, kvcache.Stats{Refused: 1}, foreign.Stats())
			lines := logLines(&logs)
			require.Len(t, lines, 1)
			assert.Contains(t, lines[0], "level=WARN")
			assert.Contains(t, lines[0], "another model")
			assert.True(t, exists(path), "another model's entry is left alone")
			_, ok := look(foreign, toks)
			assert.False(t, ok)

			// The other model computes its own entry for the same tokens.
			foreign.Put(toks, fill(320, 'f'))
			assert.Len(t, kvFiles(t, dir), 2)
			assert.Equal(t, fileSize(other, 32, 320), foreign.Stats().DiskBytes)

			// Each namespace reads its own entry and skips the other's.
			for _, tc := range []struct {
				ns   string
				want byte
			}{{ns, 'o'}, {other, 'f'}} {
				var logs bytes.Buffer
				c := newCache(t, kvcache.Config{Namespace: tc.ns, Dir: dir, DiskBytes: 1 << 20, Log: textLog(&logs)})
				st := c.Stats()
				assert.Equal(t, uint64(1), st.Refused)
				assert.Equal(t, 1, st.Entries)
				assert.Equal(t, fileSize(tc.ns, 32, 320), st.DiskBytes)
				assert.Len(t, logLines(&logs), 1)
				hit, ok := look(c, toks)
				require.True(t, ok)
				assert.Equal(t, kvcache.Disk, hit.Tier)
				assert.Equal(t, fill(320, tc.want), hit.State)
			}
			assert.Len(t, kvFiles(t, dir), 2)
		})
	}
}

// TestDiskScanGarbageAndLeftovers: files that are no entries are removed
// with a line each; temporaries of interrupted writes silently; files and
// directories that are not named as entries are left alone.
func TestDiskScanGarbageAndLeftovers(t *testing.T) {
	dir := t.TempDir()
	diskCache(t, dir, 0, 1<<20, nil).Put(seq(1, 32), stateFor(32))
	valid := onlyFile(t, dir)
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	garbage := write("x.kv", "this is not a KV cache entry, it is just some text")
	empty := write("empty.kv", "")
	tmp := write(filepath.Base(valid)+".123456.tmp", "half a write")
	tmp2 := write("other.tmp", "")
	notes := write("notes.txt", "keep me")
	sub := filepath.Join(dir, "sub.kv")
	require.NoError(t, os.Mkdir(sub, 0o755))

	var logs bytes.Buffer
	c := diskCache(t, dir, 0, 1<<20, textLog(&logs))
	st := c.Stats()
	assert.Equal(t, uint64(2), st.Refused)
	assert.Equal(t, 1, st.Entries)
	assert.Equal(t, fileSize(ns, 32, 320), st.DiskBytes)
	lines := logLines(&logs)
	require.Len(t, lines, 2, logs.String())
	joined := strings.Join(lines, "\n")
	assert.Contains(t, joined, "x.kv")
	assert.Contains(t, joined, "empty.kv")
	for _, l := range lines {
		assert.Contains(t, l, "level=WARN")
		assert.NotContains(t, l, ".tmp")
	}
	assert.False(t, exists(garbage))
	assert.False(t, exists(empty))
	assert.False(t, exists(tmp))
	assert.False(t, exists(tmp2))
	assert.True(t, exists(notes))
	assert.True(t, exists(sub))
	assert.True(t, exists(valid))
	hit, ok := look(c, seq(1, 32))
	require.True(t, ok)
	assert.Equal(t, stateFor(32), hit.State)
}

// TestDiskBudget: the directory holds at most the disk budget; entries
// evicted from disk stay in memory when they are there.
func TestDiskBudget(t *testing.T) {
	size := fileSize(ns, 32, 320)
	budget := 2*size + 100
	for _, tc := range []struct {
		name    string
		memory  int64
		entries int
	}{{"disk only", 0, 2}, {"memory too", 1 << 20, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := diskCache(t, dir, tc.memory, budget, nil)
			for f := 1; f <= 4; f++ {
				c.Put(seq(f, 32), stateFor(32))
				st := c.Stats()
				require.LessOrEqual(t, dirBytes(t, dir), budget)
				require.Equal(t, dirBytes(t, dir), st.DiskBytes)
			}
			st := c.Stats()
			assert.Equal(t, uint64(2), st.Evictions[kvcache.Disk])
			assert.Zero(t, st.Evictions[kvcache.Memory])
			assert.Len(t, kvFiles(t, dir), 2)
			assert.Equal(t, tc.entries, st.Entries)
			held := 0
			for f := 1; f <= 4; f++ {
				if hit, ok := look(c, seq(f, 32)); ok {
					held++
					assert.Equal(t, stateFor(32), hit.State)
				}
			}
			assert.Equal(t, tc.entries, held)
		})
	}
}

// TestDiskBudgetKeepsPopular: disk eviction follows the same priorities.
func TestDiskBudgetKeepsPopular(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 0, 3*fileSize(ns, 32, 320), nil)
	c.Put(seq(0, 32), stateFor(32))
	for range 30 {
		_, ok := look(c, seq(0, 32))
		require.True(t, ok)
	}
	for f := 1; f <= 20; f++ {
		c.Put(seq(f, 32), stateFor(32))
	}
	assert.True(t, c.Has(seq(0, 32)))
	assert.Equal(t, uint64(18), c.Stats().Evictions[kvcache.Disk])
	assert.Len(t, kvFiles(t, dir), 3)
}

// TestDiskBudgetAtRestart: a restart with a smaller disk budget evicts down
// to it.
func TestDiskBudgetAtRestart(t *testing.T) {
	dir := t.TempDir()
	c1 := diskCache(t, dir, 0, 1<<20, nil)
	for f := 1; f <= 4; f++ {
		c1.Put(seq(f, 32), stateFor(32))
	}
	require.Len(t, kvFiles(t, dir), 4)
	budget := 2*fileSize(ns, 32, 320) + 100
	c := diskCache(t, dir, 0, budget, nil)
	st := c.Stats()
	assert.Equal(t, uint64(2), st.Evictions[kvcache.Disk])
	assert.Equal(t, 2, st.Entries)
	assert.Len(t, kvFiles(t, dir), 2)
	assert.Equal(t, dirBytes(t, dir), st.DiskBytes)
	assert.LessOrEqual(t, st.DiskBytes, budget)
}

// TestDiskFileOverBudgetEvictsNothing: a state within the disk budget
// whose file (state plus header) is not must not flush the disk tier.
func TestDiskFileOverBudgetEvictsNothing(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 0, 1000, nil)
	require.Equal(t, int64(514), fileSize(ns, 32, 320))
	require.Equal(t, int64(1410), fileSize(ns, 96, 960))
	c.Put(seq(1, 32), stateFor(32)) // a 514-byte file
	require.Len(t, kvFiles(t, dir), 1)
	c.Put(seq(2, 96), stateFor(96)) // 960 bytes of state, a 1,410-byte file
	st := c.Stats()
	assert.Zero(t, st.Evictions[kvcache.Disk])
	assert.True(t, c.Has(seq(1, 32)))
	assert.Equal(t, fileSize(ns, 32, 320), st.DiskBytes)
}

// TestDropContaining: a deleted passage's entries go from memory and disk,
// the others stay, also across a restart.
func TestDropContaining(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 1<<20, 1<<20, nil)
	c.Put(seq(1, 32), fill(320, 'a'))
	c.Put(seq(100, 40), fill(400, 'b'))
	c.Put(branch(100, 16, 7, 48), fill(480, 'c')) // shares tokens 100..115
	require.Len(t, kvFiles(t, dir), 3)

	run := seq(100, 11)[5:] // tokens 5..10 of both entries
	assert.Equal(t, 2, c.DropContaining([][]engine.Token{run}), "both entries holding the run")
	_, ok := look(c, seq(100, 40))
	assert.False(t, ok)
	_, ok = look(c, seq(1, 32))
	assert.True(t, ok, "an entry without the run stays")
	assert.Len(t, kvFiles(t, dir), 1)
	assert.Equal(t, 0, c.DropContaining([][]engine.Token{run, nil}))

	c2 := diskCache(t, dir, 1<<20, 1<<20, nil)
	assert.Equal(t, 1, c2.Stats().Entries, "gone on disk too")
}

// TestDiskWriteFailureTurnsTierOff: a failed write is logged once and
// counted, the entry stays in memory, and writes stop until diskRetry has
// passed; the first write that works turns the tier back on.
func TestDiskWriteFailureTurnsTierOff(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	var logs bytes.Buffer
	c := diskCache(t, dir, 1<<20, 1<<20, textLog(&logs))
	now := time.Unix(1_800_000_000, 0)
	kvcache.SetClock(c, func() time.Time { return now })
	// A file where the directory was: every write fails, even as root.
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.WriteFile(dir, []byte("not a directory"), 0o644))

	assert.True(t, c.Put(seq(1, 32), fill(320, 'a')), "kept in memory")
	_, ok := look(c, seq(1, 32))
	assert.True(t, ok)
	assert.Equal(t, uint64(1), c.Stats().DiskErrors)
	require.Len(t, logLines(&logs), 1)
	assert.Contains(t, logs.String(), "a disk write failed")

	assert.True(t, c.Put(seq(2, 32), fill(320, 'b')))
	assert.Equal(t, uint64(1), c.Stats().DiskErrors, "the tier is off: no second write tried")
	assert.Len(t, logLines(&logs), 1)

	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Mkdir(dir, 0o755))
	now = now.Add(kvcache.DiskRetry)
	assert.True(t, c.Put(seq(3, 32), fill(320, 'c')))
	assert.Equal(t, uint64(1), c.Stats().DiskErrors)
	assert.Len(t, kvFiles(t, dir), 1, "written once the retry time has passed")
	assert.Contains(t, logs.String(), "disk writes work again")
}

// TestDiskWriteFailureOfDiskOnlyEntry: an entry too large for memory
// whose write fails is not kept at all.
func TestDiskWriteFailureOfDiskOnlyEntry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	c := diskCache(t, dir, 100, 1<<20, nil)
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.WriteFile(dir, nil, 0o644))
	assert.False(t, c.Put(seq(1, 32), fill(320, 'a')))
	_, ok := look(c, seq(1, 32))
	assert.False(t, ok)
	assert.Equal(t, 0, c.Stats().Entries)
	assert.Equal(t, uint64(1), c.Stats().DiskErrors)
}

// TestDiskWriteOutsideTheLock: while one entry's file is being written,
// lookups and other puts go on.
func TestDiskWriteOutsideTheLock(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 1<<20, 1<<20, nil)
	c.Put(seq(1, 32), fill(320, 'a'))
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	kvcache.BeforeRename(c, func() {
		once.Do(func() { close(entered); <-release })
	})
	put := make(chan bool)
	go func() { put <- c.Put(seq(2, 32), fill(320, 'b')) }()
	<-entered

	looked := make(chan bool)
	go func() {
		_, ok := look(c, seq(1, 32))
		looked <- ok
	}()
	select {
	case ok := <-looked:
		assert.True(t, ok, "a lookup during another entry's write")
	case <-time.After(10 * time.Second):
		t.Fatal("a lookup waited for another entry's disk write")
	}
	_, ok := look(c, seq(2, 32))
	assert.True(t, ok, "the entry being written serves from memory")
	close(release)
	assert.True(t, <-put)
	assert.Len(t, kvFiles(t, dir), 2)
}

// TestDropContainingWaitsForItsWrite: a drop that races an entry's write
// returns only once the file is gone, and a restart finds nothing of it.
func TestDropContainingWaitsForItsWrite(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 1<<20, 1<<20, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	kvcache.BeforeRename(c, func() { close(entered); <-release })
	put := make(chan bool)
	go func() { put <- c.Put(seq(1, 32), fill(320, 'a')) }()
	<-entered

	dropped := make(chan int)
	go func() { dropped <- c.DropContaining([][]engine.Token{seq(1, 20)[4:]}) }()
	select {
	case <-dropped:
		t.Fatal("the drop returned before the file it must remove was written")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	assert.Equal(t, 1, <-dropped)
	assert.False(t, <-put, "the entry was dropped while it was written")
	assert.Empty(t, kvFiles(t, dir))
	assert.Equal(t, 0, diskCache(t, dir, 1<<20, 1<<20, nil).Stats().Entries)
}

// TestDiskDuplicateFilesAtRestart: two files of the same tokens (a crash
// between a write and the removal of its dropped entry's file) become one
// entry and one file.
func TestDiskDuplicateFilesAtRestart(t *testing.T) {
	dir := t.TempDir()
	c := diskCache(t, dir, 1<<20, 1<<20, nil)
	c.Put(seq(1, 32), fill(320, 'a'))
	data, err := os.ReadFile(onlyFile(t, dir))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "copy.kv"), data, 0o644))

	c2 := diskCache(t, dir, 1<<20, 1<<20, nil)
	assert.Equal(t, 1, c2.Stats().Entries)
	assert.Len(t, kvFiles(t, dir), 1)
	h, ok := look(c2, seq(1, 32))
	require.True(t, ok)
	assert.Equal(t, fill(320, 'a'), h.State)
}
