package retrieval

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dragon-rag/dragon/internal/atomicfile"
)

// formatVersion is the on-disk layout version written: a snapshot whose
// files carry the manifest's generation in their names, so that a crash
// mid-checkpoint leaves the last one whole, and the journal of changes
// since. Open also reads formatPlain, whose files had fixed names and no
// journal, and formatGraphVectors, whose dense indexes kept their vectors
// in the HNSW graph file, so that every one of them had to build a graph.
const (
	formatVersion      = 3
	formatPlain        = 2
	formatGraphVectors = 1
)

// File names inside an index directory.
const (
	manifestFile = "manifest.json"
	passagesFile = "passages.jsonl"
	filesFile    = "files.json"
	bleveDir     = "bleve"
	vectorsFile  = "dense.vec"
	graphFile    = "dense.hnsw"
)

// Manifest describes an index; it is written last on every commit, so its
// counts are what the other files must agree with.
type Manifest struct {
	Version     int       `json:"version"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
	Generation  uint64    `json:"generation"` // commits so far
	ChunkTokens int       `json:"chunk_tokens"`
	Overlap     int       `json:"overlap"`
	Tokenizer   string    `json:"tokenizer"`
	Dense       bool      `json:"dense"`
	Embedder    string    `json:"embedder,omitempty"`
	Dims        int       `json:"dims,omitempty"`
	Passages    int       `json:"passages"`
	Sources     int       `json:"sources"`
	Files       int       `json:"files"`
	// GraphNodes counts the nodes of the HNSW graph that held the vectors
	// of indexes written before vectorStore (dense.hnsw), deleted passages
	// included; 0: the vectors are in dense.vec. Only read.
	GraphNodes int    `json:"graph_nodes"`
	NextID     uint64 `json:"next_id"`
	// JournalSeq is the last journaled change the snapshot holds; Open
	// replays the later ones.
	JournalSeq uint64 `json:"journal_seq"`
}

// file is the name of one of the snapshot's files (passagesFile,
// filesFile, vectorsFile, graphFile): from format 3 on, with the
// generation that wrote it.
func (m Manifest) file(base string) string {
	if m.Version < formatVersion {
		return base
	}
	ext := filepath.Ext(base)
	return fmt.Sprintf("%s-%d%s", strings.TrimSuffix(base, ext), m.Generation, ext)
}

// PassagesFile is the name, inside the index directory, of the file of
// the snapshot's passages (JSON lines): for tools that read an index
// without opening it.
func (m Manifest) PassagesFile() string { return m.file(passagesFile) }

// VectorsFile is the name, inside the index directory, of the file of the
// snapshot's dense vectors.
func (m Manifest) VectorsFile() string { return m.file(vectorsFile) }

// snapshotFile says whether name is a snapshot file of any generation (or
// of the fixed-name formats).
func snapshotFile(name string) bool {
	for _, base := range []string{passagesFile, filesFile, vectorsFile, graphFile} {
		if name == base {
			return true
		}
		ext := filepath.Ext(base)
		stem := strings.TrimSuffix(base, ext) + "-"
		if gen, ok := strings.CutPrefix(name, stem); ok {
			if gen, ok = strings.CutSuffix(gen, ext); ok {
				if _, err := strconv.ParseUint(gen, 10, 64); err == nil {
					return true
				}
			}
		}
	}
	return false
}

// Passage is a span of a source document.
type Passage struct {
	ID     uint64 `json:"id"`
	Source string `json:"source"`
	// Start and End are byte offsets into the document's text (see
	// Document.Text): for UTF-8 text files, into the file.
	Start  int               `json:"start"`
	End    int               `json:"end"`
	Tokens int               `json:"tokens"`
	Text   string            `json:"text"`
	Meta   map[string]string `json:"meta,omitempty"`

	// terms is the passage's length as BM25 counts it (analyzed terms).
	terms int
	// date is Meta["date"] read once, for filters (zero: none readable).
	date time.Time
}

// passageRecord is a line of passages.jsonl: the passage and what only the
// index needs.
type passageRecord struct {
	*Passage
	Terms int `json:"terms"`
}

// fileRecord remembers an ingested file, so that Add skips it while it is
// unchanged and replaces all its passages when it changes. The document
// API's files (Put) are keyed by the name they were given and also keep
// their content's hash, when they came and, for a file that could not be
// read, why.
type fileRecord struct {
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
	Sources []string  `json:"sources"`

	Hash  string            `json:"sha256,omitempty"`
	Added time.Time         `json:"added,omitzero"`
	Kind  string            `json:"kind,omitempty"`
	Meta  map[string]string `json:"meta,omitempty"`
	Error string            `json:"error,omitempty"`
}

// syncDir makes the renames into dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func writeJSON(path string, v any) error {
	return atomicfile.Write(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	})
}

func readManifest(dir string) (Manifest, error) {
	var m Manifest
	data, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("decode %s: %w", manifestFile, err)
	}
	return m, nil
}

func writePassages(path string, ps map[uint64]*Passage) error {
	ids := make([]uint64, 0, len(ps))
	for id := range ps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return atomicfile.Write(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		for _, id := range ids {
			if err := enc.Encode(passageRecord{ps[id], ps[id].terms}); err != nil {
				return err
			}
		}
		return nil
	})
}

func readPassages(path string) (map[uint64]*Passage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ps := map[uint64]*Passage{}
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	// A document's passages carry the same source and, but for a PDF's
	// page, the same metadata; decoded, each would hold copies of its
	// own (a fifth of an index's memory), so one of each is kept.
	sources := map[string]string{}
	metas := map[string]map[string]string{} // the last map kept, by source
	for line := 1; ; line++ {
		p := new(Passage)
		rec := passageRecord{Passage: p}
		if err := dec.Decode(&rec); err == io.EOF {
			return ps, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s record %d: %w", passagesFile, line, err)
		}
		p.terms = rec.Terms
		if src, ok := sources[p.Source]; ok {
			p.Source = src
		} else {
			sources[p.Source] = p.Source
		}
		if prev, ok := metas[p.Source]; ok && maps.Equal(prev, p.Meta) {
			p.Meta = prev
		} else if p.Meta != nil {
			metas[p.Source] = p.Meta
		}
		if _, dup := ps[p.ID]; dup {
			return nil, fmt.Errorf("%s record %d: duplicate passage id %d", passagesFile, line, p.ID)
		}
		ps[p.ID] = p
	}
}

// The vectors file: a header of vecMagic, vecVersion, the dimensions and
// the count (uint32, uint32, uint64), then per passage in id order its id
// (uint64) and its unit vector (float32s), all little-endian.
const (
	vecMagic      = "DRGNVECS"
	vecVersion    = 1
	vecHeaderSize = len(vecMagic) + 4 + 4 + 8
)

// writeVectorsHeader writes the vectors file's header: magic, version,
// dimensions and count. Records follow, by passage id: the id, then the
// vector's float32s, little-endian.
func writeVectorsHeader(w io.Writer, dims, n int) error {
	hdr := append([]byte(vecMagic), make([]byte, vecHeaderSize-len(vecMagic))...)
	binary.LittleEndian.PutUint32(hdr[8:], vecVersion)
	binary.LittleEndian.PutUint32(hdr[12:], uint32(dims))
	binary.LittleEndian.PutUint64(hdr[16:], uint64(n))
	_, err := w.Write(hdr)
	return err
}

func putRecord(rec []byte, id uint64, v []float32) {
	binary.LittleEndian.PutUint64(rec, id)
	for i, x := range v {
		binary.LittleEndian.PutUint32(rec[8+4*i:], math.Float32bits(x))
	}
}

// parseVectorsHeader returns the dimensions and count a header gives. The
// count must match the file's size, so a truncated file, or a damaged
// header that would have it allocate gigabytes, is refused up front.
func parseVectorsHeader(hdr []byte, size int64) (int, uint64, error) {
	if string(hdr[:8]) != vecMagic {
		return 0, 0, fmt.Errorf("%s: not a vectors file", vectorsFile)
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != vecVersion {
		return 0, 0, fmt.Errorf("%s: version %d, this build reads %d", vectorsFile, v, vecVersion)
	}
	dims := int(binary.LittleEndian.Uint32(hdr[12:]))
	n := binary.LittleEndian.Uint64(hdr[16:])
	recSize := 8 + 4*int64(dims)
	if body := size - int64(vecHeaderSize); body%recSize != 0 || uint64(body/recSize) != n {
		return 0, 0, fmt.Errorf("%s: %d bytes, not %d vectors of %d dimensions", vectorsFile, size, n, dims)
	}
	return dims, n, nil
}

func readFiles(path string) (map[string]*fileRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	files := map[string]*fileRecord{}
	if err := json.Unmarshal(data, &files); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filesFile, err)
	}
	return files, nil
}

// dirSize is the bytes of the files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
