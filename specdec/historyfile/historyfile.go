// Package historyfile keeps a specdec.History across restarts, in a file
// of its own: varint token sequences after a magic string, ended by a
// CRC-32 (Castagnoli) of everything before it. It is apart from specdec,
// which stays pure.
package historyfile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/dragon-rag/dragon/internal/atomicfile"
	"github.com/dragon-rag/dragon/specdec"
)

const magic = "DRGNHIST\x01"

var table = crc32.MakeTable(crc32.Castagnoli)

// ErrBad: a file that does not read back (cut off, changed, or not a
// history).
var ErrBad = errors.New("historyfile: bad history file")

// Save writes h to path, replacing it whole (atomicfile), so a crash
// leaves the old file or the new one.
func Save(h *specdec.History, path string) error {
	seqs := h.Sequences()
	err := atomicfile.Write(path, func(out io.Writer) error {
		crc := crc32.New(table)
		w := bufio.NewWriter(io.MultiWriter(out, crc))
		w.WriteString(magic)
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
			return err
		}
		return binary.Write(out, binary.LittleEndian, crc.Sum32())
	})
	if err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	return nil
}

// Load reads a file Save wrote into a store of maxTokens tokens (the most
// recent sequences that fit). A missing file is an empty store.
func Load(path string, maxTokens int) (*specdec.History, error) {
	h, err := specdec.NewHistory(maxTokens)
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
	bad := func(why string) (*specdec.History, error) { return nil, fmt.Errorf("%w %s: %s", ErrBad, path, why) }
	if len(b) < len(magic)+4 || string(b[:len(magic)]) != magic {
		return bad("not a history")
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, table) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return bad("checksum mismatch")
	}
	r := body[len(magic):]
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
		seq := make([]specdec.Token, n)
		for j := range seq {
			v, ok := next()
			if !ok || v > uint64(^uint32(0)) {
				return bad(fmt.Sprintf("sequence %d cut off", i))
			}
			seq[j] = specdec.Token(int32(uint32(v)))
		}
		h.Add(seq)
	}
	if len(r) != 0 {
		return bad("bytes after the last sequence")
	}
	return h, nil
}
