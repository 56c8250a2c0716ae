package retrieval

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
)

// journalFile is the write-ahead log of the changes made since the last
// checkpoint (the snapshot the manifest names). A change is durable once
// its record is synced here; bleve, the maps in memory and, at the next
// checkpoint, the snapshot follow from it, and Open replays what the
// snapshot lacks.
const journalFile = "journal.log"

// maxJournalRecord bounds one record: a damaged length must not make Open
// allocate gigabytes. A change holds at most one commit group's passages.
const maxJournalRecord = 1 << 30

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// change is one atomic mutation of the index: passages removed and added
// and file records set (nil: removed). Replaying it twice gives the same
// index, so a crash between the journal and bleve is repaired by replay.
type change struct {
	Seq    uint64                 `json:"seq"`
	Remove []uint64               `json:"remove,omitempty"`
	Add    []passageRecord        `json:"add,omitempty"`
	Files  map[string]*fileRecord `json:"files,omitempty"`
	NextID uint64                 `json:"next_id"`
}

// journal appends changes to journalFile. Each record is its length and
// CRC-32C (uint32s, little-endian) and the change as JSON; a torn or
// damaged tail, which only a crash mid-append leaves, ends the log.
type journal struct {
	f    *os.File
	size int64
	seq  uint64 // the last change's, or the snapshot's when none is newer
}

// openJournal reads the changes after seq (the snapshot's) from dir's
// journal, creating it when missing. A torn tail is cut off unless
// readOnly, so that new records follow the last good one.
func openJournal(dir string, seq uint64, readOnly bool) (*journal, []*change, error) {
	path := dir + string(os.PathSeparator) + journalFile
	flag := os.O_RDWR | os.O_CREATE
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if readOnly && errors.Is(err, fs.ErrNotExist) {
		return &journal{seq: seq}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	j := &journal{f: f, seq: seq}
	var changes []*change
	r := bufio.NewReaderSize(f, 1<<20)
	var good int64
	for {
		c, n, err := readRecord(r)
		if err == io.EOF {
			break
		}
		if err != nil {
			// Only the tail can be torn: records are appended and synced
			// one at a time.
			if !readOnly {
				if terr := f.Truncate(good); terr != nil {
					f.Close()
					return nil, nil, fmt.Errorf("cut the torn tail of %s: %w", journalFile, terr)
				}
			}
			break
		}
		good += n
		if c.Seq <= seq {
			continue // already in the snapshot
		}
		if c.Seq != j.seq+1 {
			f.Close()
			return nil, nil, fmt.Errorf("%s: change %d follows %d", journalFile, c.Seq, j.seq)
		}
		j.seq = c.Seq
		changes = append(changes, c)
	}
	j.size = good
	if !readOnly {
		if _, err := f.Seek(good, io.SeekStart); err != nil {
			f.Close()
			return nil, nil, err
		}
	}
	return j, changes, nil
}

// readRecord reads one record and its size in bytes.
func readRecord(r io.Reader) (*change, int64, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, 0, errors.New("torn header")
		}
		return nil, 0, err
	}
	n := binary.LittleEndian.Uint32(hdr[:4])
	if n == 0 || n > maxJournalRecord {
		return nil, 0, fmt.Errorf("record of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, 0, fmt.Errorf("torn record: %w", err)
	}
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(hdr[4:]) {
		return nil, 0, errors.New("checksum mismatch")
	}
	c := new(change)
	if err := json.Unmarshal(body, c); err != nil {
		return nil, 0, fmt.Errorf("decode record: %w", err)
	}
	return c, int64(len(hdr)) + int64(n), nil
}

// append numbers c, writes it and syncs: once it returns nil, the change
// survives a crash.
func (j *journal) append(c *change) error {
	if j.f == nil {
		return ErrReadOnly
	}
	c.Seq = j.seq + 1
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode change: %w", err)
	}
	if len(body) > maxJournalRecord {
		return fmt.Errorf("a change of %d bytes is over the journal's %d", len(body), maxJournalRecord)
	}
	buf := make([]byte, 8, 8+len(body))
	binary.LittleEndian.PutUint32(buf, uint32(len(body)))
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(body, crcTable))
	buf = append(buf, body...)
	_, err = j.f.Write(buf)
	if err == nil {
		err = j.f.Sync()
	}
	if err != nil {
		// Not acknowledged: cut what reached the file, so that the next
		// record follows the last good one and this one never replays.
		j.f.Truncate(j.size)
		j.f.Seek(j.size, io.SeekStart)
		return fmt.Errorf("append to %s: %w", journalFile, err)
	}
	j.size += int64(len(buf))
	j.seq = c.Seq
	return nil
}

// reset empties the journal once a checkpoint holds all its changes.
func (j *journal) reset() error {
	if j.f == nil {
		return nil
	}
	if err := j.f.Truncate(0); err != nil {
		return err
	}
	if _, err := j.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	j.size = 0
	return j.f.Sync()
}

func (j *journal) close() error {
	if j == nil || j.f == nil {
		return nil
	}
	return j.f.Close()
}
