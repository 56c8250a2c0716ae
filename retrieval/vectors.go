package retrieval

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"

	"github.com/dragon-rag/dragon/internal/atomicfile"
)

// A dense index keeps little of its vectors in memory, because a phone
// holds years of its owner's mail: 384 float32s are 1.5 KB a passage, more
// than the passage's text and its BM25 postings together. Memory holds one
// bit a dimension (its sign: 48 bytes at 384 dimensions); the vectors stay in the snapshot's vectors file,
// which is read where a search needs them. A search ranks every vector by
// the Hamming distance of its bits to the query's, and scores the nearest
// few hundred exactly, by cosine, from the file: so a passage's own vector
// is always found, and what a search returns carries its exact cosine.
// Vectors set since the last checkpoint stay in memory until it writes
// them out.
type vectorStore struct {
	dims  int
	words int // uint64s per code

	// Slots, one per vector set since the store was written: ids[i] is 0
	// for a vector removed since (passage ids start at 1).
	ids   []uint64
	codes []uint64 // words a slot
	slot  map[uint64]int32
	live  int

	// file holds the vectors of slots [0, inFile), in slot order, as
	// write lays them out; mem those of the later slots.
	file   *os.File
	inFile int
	mem    map[uint64][]float32
}

// Rescoring: a search scores exactly the rescoreFactor·n vectors nearest
// by Hamming distance, and at least minRescore of them.
const (
	rescoreFactor = 16
	minRescore    = 512
	// recordsPerRead is the records a scan of the file reads at once.
	recordsPerRead = 256
)

func newVectorStore(dims int) *vectorStore {
	s := &vectorStore{slot: map[uint64]int32{}, mem: map[uint64][]float32{}}
	s.setDims(dims)
	return s
}

func (s *vectorStore) setDims(dims int) { s.dims, s.words = dims, (dims+63)/64 }

func (s *vectorStore) recSize() int64 { return 8 + 4*int64(s.dims) }

// Len is the number of live vectors.
func (s *vectorStore) Len() int { return s.live }

// tombstones are the removed vectors whose slots the next write drops.
func (s *vectorStore) tombstones() int { return len(s.ids) - s.live }

func (s *vectorStore) has(id uint64) bool {
	_, ok := s.slot[id]
	return ok
}

// set stores id's unit vector, replacing any it had.
func (s *vectorStore) set(id uint64, v []float32) {
	if s.dims == 0 {
		s.setDims(len(v))
	}
	s.remove(id)
	s.slot[id] = int32(len(s.ids))
	s.ids = append(s.ids, id)
	s.codes = append(s.codes, make([]uint64, s.words)...)
	s.encode(v, s.codes[len(s.codes)-s.words:])
	s.mem[id] = v
	s.live++
}

func (s *vectorStore) remove(id uint64) {
	i, ok := s.slot[id]
	if !ok {
		return
	}
	delete(s.slot, id)
	delete(s.mem, id)
	s.ids[i] = 0
	s.live--
}

// encode sets dst to v's bits: dimension j's bit is set where v[j] is
// positive. (Taking signs about the corpus's mean instead changed recall
// by under half a point on make run's MiniLM vectors.)
func (s *vectorStore) encode(v []float32, dst []uint64) {
	clear(dst)
	for j, x := range v {
		if x > 0 {
			dst[j>>6] |= 1 << (j & 63)
		}
	}
}

// vector returns id's vector (nil if it has none).
func (s *vectorStore) vector(id uint64) ([]float32, error) {
	i, ok := s.slot[id]
	if !ok {
		return nil, nil
	}
	if v := s.mem[id]; v != nil {
		return v, nil
	}
	buf := make([]byte, s.recSize())
	v := make([]float32, s.dims)
	if err := s.readSlot(int(i), buf, v); err != nil {
		return nil, err
	}
	return v, nil
}

// readSlot reads file slot i's vector into v, checking that the record
// is the one the slot expects.
func (s *vectorStore) readSlot(i int, buf []byte, v []float32) error {
	if _, err := s.file.ReadAt(buf, int64(vecHeaderSize)+int64(i)*s.recSize()); err != nil {
		return fmt.Errorf("read dense vector %d of %s: %w", i, s.file.Name(), err)
	}
	return s.decode(i, buf, v)
}

func (s *vectorStore) decode(i int, rec []byte, v []float32) error {
	if id := binary.LittleEndian.Uint64(rec); id != s.ids[i] {
		return fmt.Errorf("%s: record %d holds passage %d, the index expects %d", s.file.Name(), i, id, s.ids[i])
	}
	for j := range v {
		v[j] = math.Float32frombits(binary.LittleEndian.Uint32(rec[8+4*j:]))
	}
	return nil
}

// each calls fn with every live vector, the file's in order (read a block
// at a time) and then memory's. v is reused between calls.
func (s *vectorStore) each(fn func(slot int, v []float32)) error {
	rec := s.recSize()
	buf := make([]byte, recordsPerRead*rec)
	v := make([]float32, s.dims)
	for first := 0; first < s.inFile; first += recordsPerRead {
		n := min(recordsPerRead, s.inFile-first)
		if _, err := s.file.ReadAt(buf[:int64(n)*rec], int64(vecHeaderSize)+int64(first)*rec); err != nil {
			return fmt.Errorf("read dense vectors of %s: %w", s.file.Name(), err)
		}
		for k := range n {
			i := first + k
			if s.ids[i] == 0 {
				continue
			}
			if err := s.decode(i, buf[int64(k)*rec:int64(k+1)*rec], v); err != nil {
				return err
			}
			fn(i, v)
		}
	}
	for i := s.inFile; i < len(s.ids); i++ {
		if id := s.ids[i]; id != 0 {
			fn(i, s.mem[id])
		}
	}
	return nil
}

// search returns the n live vectors keep lets through (nil: all) with the
// highest cosine to the unit vector q, best first. An index of up to
// exactMax vectors, or one no larger than the rescoring pool, is scored
// whole; a larger one by its nearest codes.
func (s *vectorStore) search(q []float32, n int, keep func(uint64) bool, exactMax int) ([]scored, error) {
	if s.live == 0 || n <= 0 {
		return nil, nil
	}
	pool := max(rescoreFactor*n, minRescore)
	if exactMax < 0 || s.live > exactMax && s.live > pool {
		return s.rescore(q, n, s.nearestCodes(q, pool, keep))
	}
	top := make([]scored, 0, n+1)
	err := s.each(func(i int, v []float32) {
		if id := s.ids[i]; keep == nil || keep(id) {
			top = pushTop(top, scored{id, float64(dot(q, v))}, n)
		}
	})
	return top, err
}

// scoreAmong scores the vectors of ids exactly and keeps the n best.
func (s *vectorStore) scoreAmong(q []float32, n int, ids map[uint64]bool) ([]scored, error) {
	slots := make([]int, 0, len(ids))
	for id := range ids {
		if i, ok := s.slot[id]; ok {
			slots = append(slots, int(i))
		}
	}
	slices.Sort(slots)
	return s.rescore(q, n, slots)
}

// nearestCodes returns the slots of the pool vectors (of those keep lets
// through) nearest to q in Hamming distance: distances are small integers,
// so a histogram finds the cut-off in one pass over them.
func (s *vectorStore) nearestCodes(q []float32, pool int, keep func(uint64) bool) []int {
	qc := make([]uint64, s.words)
	s.encode(q, qc)
	const skip = math.MaxUint16
	dist := make([]uint16, len(s.ids))
	hist := make([]int, s.dims+1)
	for i, id := range s.ids {
		if id == 0 || keep != nil && !keep(id) {
			dist[i] = skip
			continue
		}
		d := 0
		for w, c := range s.codes[i*s.words : (i+1)*s.words] {
			d += bits.OnesCount64(c ^ qc[w])
		}
		dist[i] = uint16(d)
		hist[d]++
	}
	cut, below := 0, 0
	for cut < len(hist) && below+hist[cut] < pool {
		below += hist[cut]
		cut++
	}
	// Every slot nearer than the cut, and as many at it as fill the pool.
	out := make([]int, 0, pool)
	atCut := pool - below
	for i, d := range dist {
		switch {
		case d < uint16(cut):
			out = append(out, i)
		case d == uint16(cut) && atCut > 0:
			out = append(out, i)
			atCut--
		}
	}
	return out
}

// rescore scores the slots' vectors exactly and keeps the n best. Slots
// come in file order, so that the reads go forward through it.
func (s *vectorStore) rescore(q []float32, n int, slots []int) ([]scored, error) {
	buf := make([]byte, s.recSize())
	v := make([]float32, s.dims)
	top := make([]scored, 0, n+1)
	for _, i := range slots {
		id := s.ids[i]
		u := s.mem[id]
		if u == nil {
			if err := s.readSlot(i, buf, v); err != nil {
				return nil, err
			}
			u = v
		}
		top = pushTop(top, scored{id, float64(dot(q, u))}, n)
	}
	return top, nil
}

// pushTop inserts x into top, which holds the n best so far in order;
// most candidates fail the first comparison.
func pushTop(top []scored, x scored, n int) []scored {
	if len(top) == n && !better(x, top[n-1]) {
		return top
	}
	i, _ := slices.BinarySearchFunc(top, x, func(a, b scored) int {
		if better(a, b) {
			return -1
		}
		return 1
	})
	top = slices.Insert(top, i, x)
	return top[:min(len(top), n)]
}

// write writes the live vectors to path, in slot order (the old file's
// read a block at a time, then memory's), and returns the store that
// reads them from there. s is left as it was, for searches to use until
// the caller swaps the two.
func (s *vectorStore) write(path string) (*vectorStore, error) {
	order := make([]int, 0, s.live)
	err := atomicfile.Write(path, func(w io.Writer) error {
		if err := writeVectorsHeader(w, s.dims, s.live); err != nil {
			return err
		}
		rec := make([]byte, s.recSize())
		var werr error
		err := s.each(func(i int, v []float32) {
			if werr != nil {
				return
			}
			putRecord(rec, s.ids[i], v)
			_, werr = w.Write(rec)
			order = append(order, i)
		})
		return cmp.Or(err, werr)
	})
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	ns := &vectorStore{
		ids: make([]uint64, len(order)), codes: make([]uint64, 0, len(order)*s.words),
		slot: make(map[uint64]int32, len(order)), live: len(order),
		file: f, inFile: len(order), mem: map[uint64][]float32{},
	}
	ns.setDims(s.dims)
	for k, i := range order {
		ns.ids[k] = s.ids[i]
		ns.slot[s.ids[i]] = int32(k)
		ns.codes = append(ns.codes, s.codes[i*s.words:(i+1)*s.words]...)
	}
	return ns, nil
}

func (s *vectorStore) close() error {
	if s.file == nil {
		return nil
	}
	return s.file.Close()
}

// openVectorStore opens a vectors file whose vectors all belong to live
// passages, checking its header against its size, and computes the
// codes.
func openVectorStore(path string, live func(uint64) bool) (*vectorStore, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	s, err := readVectorStore(f, live)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func readVectorStore(f *os.File, live func(uint64) bool) (*vectorStore, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	hdr := make([]byte, vecHeaderSize)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("%s header: %w", vectorsFile, err)
	}
	dims, n, err := parseVectorsHeader(hdr, info.Size())
	if err != nil {
		return nil, err
	}
	s := newVectorStore(dims)
	s.file, s.inFile, s.live = f, int(n), int(n)
	s.ids = make([]uint64, n)
	s.codes = make([]uint64, int(n)*s.words)
	s.slot = make(map[uint64]int32, n)
	r := bufio.NewReaderSize(f, 1<<20)
	rec := make([]byte, s.recSize())
	v := make([]float32, dims)
	for i := range int(n) {
		if _, err := io.ReadFull(r, rec); err != nil {
			return nil, fmt.Errorf("%s vector %d: %w", vectorsFile, i, err)
		}
		id := binary.LittleEndian.Uint64(rec)
		if _, dup := s.slot[id]; dup {
			return nil, fmt.Errorf("%s: duplicate passage id %d", vectorsFile, id)
		}
		if id == 0 || !live(id) {
			return nil, fmt.Errorf("%s: a vector for passage %d, which the index does not hold", vectorsFile, id)
		}
		s.ids[i], s.slot[id] = id, int32(i)
		if err := s.decode(i, rec, v); err != nil {
			return nil, err
		}
		s.encode(v, s.codes[i*s.words:(i+1)*s.words])
	}
	return s, nil
}
