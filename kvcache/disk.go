package kvcache

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/dragon-rag/dragon/engine"
)

// An entry on disk is one file:
//
//	magic    8 bytes  "DRGNKV\x00\x01"
//	version  uint32   FormatVersion
//	ns       uint32 length, then the namespace
//	tokens   uint32 count, then int32 each
//	lengths  uint64 state bytes, uint64 logits bytes
//	state    the state bytes
//	logits   uint32 count, then each: uint32 At, uint32 n, n float32
//	crc      uint32   CRC-32C of everything before it
//
// little-endian. The header alone (read at start-up) says whose entry it
// is and how long the file must be; the checksum is checked when the entry
// is loaded.
const (
	magic = "DRGNKV\x00\x01"
	// FormatVersion changes whenever the layout above does.
	FormatVersion uint32 = 2
	fileExt              = ".kv"
	// maxTokens bounds a header's token count, so a corrupt count cannot
	// make the scan allocate gigabytes.
	maxTokens = 1 << 20
)

var (
	errForeign = errors.New("another model or engine settings (namespace)")
	crcTable   = crc32.MakeTable(crc32.Castagnoli)
)

type diskStore struct {
	dir string
	ns  string
	log *slog.Logger
	// beforeRename, for tests, runs in store between the write and the
	// rename: a slow disk, or a drop racing the write.
	beforeRename func()
}

type diskEntry struct {
	name   string
	tokens []engine.Token
	size   int64
}

func openDisk(dir, ns string, log *slog.Logger) (*diskStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kvcache: cache directory: %w", err)
	}
	return &diskStore{dir: dir, ns: ns, log: log}, nil
}

// fileName names a new file for an entry: a digest of its namespace and
// tokens, which says whose it is to a person listing the directory, and
// a random part, so that a write finishing after its entry was dropped
// removes its own file and never a newer entry's of the same tokens.
func (d *diskStore) fileName(toks []engine.Token) string {
	h := sha256.New()
	h.Write([]byte(d.ns))
	var b [4]byte
	for _, t := range toks {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	return fmt.Sprintf("%s-%016x%s", hex.EncodeToString(h.Sum(nil)[:16]), rand.Uint64(), fileExt)
}

// scan indexes the directory's entries by their headers. Entries of
// another namespace are skipped with one log line; entries that cannot be
// used (another format version, a header that does not parse, a size that
// does not match it) are removed with one log line, so they are recomputed
// rather than read again; leftovers of interrupted writes are removed
// silently.
func (d *diskStore) scan() (found []diskEntry, refused int) {
	des, err := os.ReadDir(d.dir)
	if err != nil {
		d.log.Warn("kv cache: cannot read the cache directory; starting cold", "dir", d.dir, "err", err)
		return nil, 0
	}
	for _, de := range des {
		name := de.Name()
		if de.IsDir() {
			continue
		}
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(filepath.Join(d.dir, name))
			continue
		}
		if !strings.HasSuffix(name, fileExt) {
			continue
		}
		toks, size, err := d.readHeader(name)
		if errors.Is(err, errForeign) {
			// Another model's daemon may share the directory: leave its
			// entries alone.
			d.log.Warn("kv cache: skipping a disk entry of another model or engine", "file", name)
			refused++
			continue
		}
		if err != nil {
			d.log.Warn("kv cache: refusing a disk entry; it will be recomputed", "file", name, "err", err)
			refused++
			d.remove(name)
			continue
		}
		found = append(found, diskEntry{name: name, tokens: toks, size: size})
	}
	return found, refused
}

// readHeader reads an entry's tokens and checks the file's size against
// its header.
func (d *diskStore) readHeader(name string) ([]engine.Token, int64, error) {
	f, err := os.Open(filepath.Join(d.dir, name))
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	toks, stateLen, logitsLen, hdr, err := d.parseHeader(bufio.NewReader(f))
	if err != nil {
		return nil, 0, err
	}
	if want := hdr + int64(stateLen) + int64(logitsLen) + 4; st.Size() != want {
		return nil, 0, fmt.Errorf("truncated or padded: %d bytes, the header says %d", st.Size(), want)
	}
	return toks, st.Size(), nil
}

// parseHeader reads everything before the state; hdr is its length.
func (d *diskStore) parseHeader(r io.Reader) (toks []engine.Token, stateLen, logitsLen uint64, hdr int64, err error) {
	var m [8]byte
	if _, err := io.ReadFull(r, m[:]); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if string(m[:]) != magic {
		return nil, 0, 0, 0, errors.New("not a dragon KV cache entry (bad magic)")
	}
	var version, nsLen uint32
	if err := binary.Read(r, binary.LittleEndian, &version); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if version != FormatVersion {
		return nil, 0, 0, 0, fmt.Errorf("format version %d, this build reads %d", version, FormatVersion)
	}
	if err := binary.Read(r, binary.LittleEndian, &nsLen); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if nsLen != uint32(len(d.ns)) {
		return nil, 0, 0, 0, errForeign
	}
	ns := make([]byte, nsLen)
	if _, err := io.ReadFull(r, ns); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if string(ns) != d.ns {
		return nil, 0, 0, 0, errForeign
	}
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if n == 0 || n > maxTokens {
		return nil, 0, 0, 0, fmt.Errorf("header: %d tokens", n)
	}
	toks = make([]engine.Token, n)
	if err := binary.Read(r, binary.LittleEndian, toks); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if err := binary.Read(r, binary.LittleEndian, &stateLen); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if err := binary.Read(r, binary.LittleEndian, &logitsLen); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("header: %w", err)
	}
	if stateLen == 0 || stateLen > 1<<40 || logitsLen < 4 || logitsLen > 1<<40 {
		return nil, 0, 0, 0, fmt.Errorf("header: a state of %d bytes, logits of %d", stateLen, logitsLen)
	}
	hdr = int64(8 + 4 + 4 + len(ns) + 4 + 4*len(toks) + 8 + 8)
	return toks, stateLen, logitsLen, hdr, nil
}

// fileSize is the size of an entry's file.
func (d *diskStore) fileSize(toks []engine.Token, stateLen int, ends []Logits) int64 {
	return int64(8+4+4+len(d.ns)+4+4*len(toks)+8+8+stateLen) + logitsFileBytes(ends) + 4
}

func logitsFileBytes(ends []Logits) int64 {
	n := int64(4)
	for _, l := range ends {
		n += 8 + 4*int64(len(l.Values))
	}
	return n
}

// encode lays an entry out as a file's bytes.
func (d *diskStore) encode(toks []engine.Token, state []byte, ends []Logits) []byte {
	var b bytes.Buffer
	b.Grow(int(d.fileSize(toks, len(state), ends)))
	b.WriteString(magic)
	le := binary.LittleEndian
	b.Write(le.AppendUint32(nil, FormatVersion))
	b.Write(le.AppendUint32(nil, uint32(len(d.ns))))
	b.WriteString(d.ns)
	b.Write(le.AppendUint32(nil, uint32(len(toks))))
	for _, t := range toks {
		b.Write(le.AppendUint32(nil, uint32(t)))
	}
	b.Write(le.AppendUint64(nil, uint64(len(state))))
	b.Write(le.AppendUint64(nil, uint64(logitsFileBytes(ends))))
	b.Write(state)
	b.Write(le.AppendUint32(nil, uint32(len(ends))))
	for _, l := range ends {
		b.Write(le.AppendUint32(nil, uint32(l.At)))
		b.Write(le.AppendUint32(nil, uint32(len(l.Values))))
		for _, v := range l.Values {
			b.Write(le.AppendUint32(nil, math.Float32bits(v)))
		}
	}
	b.Write(le.AppendUint32(nil, crc32.Checksum(b.Bytes(), crcTable)))
	return b.Bytes()
}

// store writes an entry atomically (a temporary file, synced, renamed
// into place) and returns its name and size. Without the sync a crash
// could leave the name pointing at a file whose blocks never reached the
// disk; its checksum would refuse it, but a warm restart is what the disk
// tier is for. The directory is not synced: an entry whose rename is lost
// is only recomputed.
func (d *diskStore) store(toks []engine.Token, state []byte, ends []Logits) (string, int64, error) {
	name := d.fileName(toks)
	data := d.encode(toks, state, ends)
	f, err := os.CreateTemp(d.dir, name+".*.tmp")
	if err != nil {
		return "", 0, err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return "", 0, err
	}
	if d.beforeRename != nil {
		d.beforeRename()
	}
	if err := os.Rename(f.Name(), filepath.Join(d.dir, name)); err != nil {
		_ = os.Remove(f.Name())
		return "", 0, err
	}
	return name, int64(len(data)), nil
}

// load reads an entry's state and logits, checking its checksum and that
// it holds the tokens the index says.
func (d *diskStore) load(name string, want []engine.Token) ([]byte, []Logits, error) {
	data, err := os.ReadFile(filepath.Join(d.dir, name))
	if err != nil {
		return nil, nil, err
	}
	if len(data) < 4 {
		return nil, nil, errors.New("truncated")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	r := bytes.NewReader(body)
	toks, stateLen, logitsLen, hdr, err := d.parseHeader(r)
	if err != nil {
		return nil, nil, err
	}
	if int64(len(body)) != hdr+int64(stateLen)+int64(logitsLen) {
		return nil, nil, fmt.Errorf("truncated or padded: %d bytes, the header says %d", len(data), hdr+int64(stateLen)+int64(logitsLen)+4)
	}
	if crc32.Checksum(body, crcTable) != sum {
		return nil, nil, errors.New("checksum mismatch (corrupt)")
	}
	if CommonPrefix(toks, want) != len(want) || len(toks) != len(want) {
		return nil, nil, errors.New("holds other tokens than its index entry")
	}
	state := body[hdr : hdr+int64(stateLen)]
	ends, err := parseLogits(body[hdr+int64(stateLen):], len(toks))
	if err != nil {
		return nil, nil, err
	}
	return state, ends, nil
}

// parseLogits reads the logits section of an entry of n tokens.
func parseLogits(b []byte, n int) ([]Logits, error) {
	le := binary.LittleEndian
	if len(b) < 4 {
		return nil, errors.New("logits: truncated")
	}
	count := le.Uint32(b)
	b = b[4:]
	var ends []Logits
	for range count {
		if len(b) < 8 {
			return nil, errors.New("logits: truncated")
		}
		at, k := int(le.Uint32(b)), int(le.Uint32(b[4:]))
		b = b[8:]
		if at < 1 || at > n || len(b) < 4*k {
			return nil, fmt.Errorf("logits after %d of %d tokens, %d values, %d bytes left", at, n, k, len(b))
		}
		v := make([]float32, k)
		for i := range v {
			v[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
		b = b[4*k:]
		ends = append(ends, Logits{At: at, Values: v})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("logits: %d bytes left over", len(b))
	}
	return ends, nil
}

func (d *diskStore) remove(name string) {
	if name == "" {
		return
	}
	if err := os.Remove(filepath.Join(d.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.log.Warn("kv cache: could not remove a disk entry", "file", name, "err", err)
	}
}
