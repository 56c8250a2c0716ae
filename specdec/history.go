package specdec

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// History is a bounded store of earlier answers that drafters draft from
// beside the current context (SAM's drafting from history in sd.npu and
// CoordGen): an owner who asks about the same mail thread twice, or
// follows a question up, gets answers that repeat much of the earlier
// ones, which the retrieved passages alone do not hold. It keeps the most
// recent sequences up to a token budget. It belongs to one daemon, is
// never sent anywhere, and is safe for concurrent use.
type History struct {
	mu        sync.Mutex
	maxTokens int
	seqs      [][]Token
	total     int
}

// NewHistory returns an empty store of at most maxTokens tokens.
func NewHistory(maxTokens int) (*History, error) {
	if maxTokens <= 0 {
		return nil, fmt.Errorf("%w: history of %d tokens", ErrInvalid, maxTokens)
	}
	return &History{maxTokens: maxTokens}, nil
}

// Add keeps a copy of seq as the most recent sequence, dropping the oldest
// ones past the budget (a sequence longer than the budget keeps its end).
func (h *History) Add(seq []Token) {
	if len(seq) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addLocked(seq)
}

func (h *History) addLocked(seq []Token) {
	if len(seq) > h.maxTokens {
		seq = seq[len(seq)-h.maxTokens:]
	}
	h.seqs = append(h.seqs, slices.Clone(seq))
	h.total += len(seq)
	drop := 0
	for h.total > h.maxTokens {
		h.total -= len(h.seqs[drop])
		drop++
	}
	h.seqs = slices.Delete(h.seqs, 0, drop)
}

// Sequences are the stored sequences, oldest first. They are shared: the
// caller must not change them.
func (h *History) Sequences() [][]Token {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seqs)
}

// Tokens is how many tokens the store holds.
func (h *History) Tokens() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}

// historyMagic starts a saved history; a CRC-32 (Castagnoli) of everything
// before it ends it.
const historyMagic = "DRGNHIST\x01"

var historyCRC = crc32.MakeTable(crc32.Castagnoli)

// Save writes the store to path through a synced temporary file and a
// rename, so a crash leaves the old file or the new one.
func (h *History) Save(path string) (err error) {
	seqs := h.Sequences()
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	crc := crc32.New(historyCRC)
	w := bufio.NewWriter(io.MultiWriter(tmp, crc))
	w.WriteString(historyMagic)
	var buf [binary.MaxVarintLen64]byte
	put := func(v uint64) { w.Write(buf[:binary.PutUvarint(buf[:], v)]) }
	put(uint64(len(seqs)))
	for _, s := range seqs {
		put(uint64(len(s)))
		for _, t := range s {
			put(uint64(uint32(t)))
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	if err := binary.Write(tmp, binary.LittleEndian, crc.Sum32()); err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	return nil
}

// ErrBadHistory: a saved history that does not read back (cut off,
// changed, or not a history).
var ErrBadHistory = errors.New("specdec: bad history file")

// LoadHistory reads a store saved by Save into one of maxTokens tokens
// (the most recent sequences that fit). A missing file is an empty store.
func LoadHistory(path string, maxTokens int) (*History, error) {
	h, err := NewHistory(maxTokens)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load history: %w", err)
	}
	bad := func(why string) (*History, error) { return nil, fmt.Errorf("%w %s: %s", ErrBadHistory, path, why) }
	if len(b) < len(historyMagic)+4 || string(b[:len(historyMagic)]) != historyMagic {
		return bad("not a history")
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, historyCRC) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return bad("checksum mismatch")
	}
	r := body[len(historyMagic):]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(r)
		if n <= 0 {
			return 0, false
		}
		r = r[n:]
		return v, true
	}
	count, ok := next()
	if !ok {
		return bad("no count")
	}
	for i := uint64(0); i < count; i++ {
		n, ok := next()
		if !ok || n > uint64(len(r)) {
			return bad(fmt.Sprintf("sequence %d cut off", i))
		}
		seq := make([]Token, n)
		for j := range seq {
			v, ok := next()
			if !ok || v > uint64(^uint32(0)) {
				return bad(fmt.Sprintf("sequence %d cut off", i))
			}
			seq[j] = Token(int32(uint32(v)))
		}
		h.addLocked(seq)
	}
	if len(r) != 0 {
		return bad("bytes after the last sequence")
	}
	return h, nil
}
