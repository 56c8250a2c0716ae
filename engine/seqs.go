package engine

import "fmt"

// SeqLens mirrors, in Go, how many KV positions each sequence of a context
// holds, and validates batches against it before they reach a backend. Both
// backends use it so that they reject the same inputs the same way.
type SeqLens struct {
	lens      []int
	capPerSeq int
	scratch   []int
}

// NewSeqLens tracks n empty sequences of capacity capPerSeq each.
func NewSeqLens(n, capPerSeq int) *SeqLens {
	return &SeqLens{lens: make([]int, n), capPerSeq: capPerSeq, scratch: make([]int, n)}
}

// Len is the number of positions sequence seq holds (0 if out of range).
func (s *SeqLens) Len(seq int) int {
	if seq < 0 || seq >= len(s.lens) {
		return 0
	}
	return s.lens[seq]
}

func (s *SeqLens) checkSeq(seq int) error {
	if seq < 0 || seq >= len(s.lens) {
		return fmt.Errorf("%w: sequence id %d out of range [0, %d)", ErrInvalidInput, seq, len(s.lens))
	}
	return nil
}

// Check validates a batch: known sequences, tokens in the vocabulary, and
// positions that continue each sequence without gaps. maxBatch bounds the
// number of entries (0: no bound).
func (s *SeqLens) Check(b *Batch, vocab, maxBatch int) error {
	if b == nil || len(b.Entries) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalidInput)
	}
	if maxBatch > 0 && len(b.Entries) > maxBatch {
		return fmt.Errorf("%w: batch of %d tokens exceeds the batch size %d", ErrInvalidInput, len(b.Entries), maxBatch)
	}
	next := s.scratch
	copy(next, s.lens)
	for i, e := range b.Entries {
		if e.Token < 0 || int(e.Token) >= vocab {
			return fmt.Errorf("%w: row %d: token %d outside the vocabulary of %d", ErrInvalidInput, i, e.Token, vocab)
		}
		if len(e.Seqs) == 0 {
			return fmt.Errorf("%w: row %d belongs to no sequence", ErrInvalidInput, i)
		}
		for _, seq := range e.Seqs {
			if err := s.checkSeq(seq); err != nil {
				return fmt.Errorf("row %d: %w", i, err)
			}
			if e.Pos != next[seq] {
				return fmt.Errorf("%w: row %d: position %d does not continue sequence %d (holds %d)", ErrInvalidInput, i, e.Pos, seq, next[seq])
			}
			if next[seq] >= s.capPerSeq {
				return fmt.Errorf("%w: sequence %d would exceed %d positions", ErrContextFull, seq, s.capPerSeq)
			}
			next[seq]++
		}
	}
	return nil
}

// Apply records a batch that was decoded.
func (s *SeqLens) Apply(b *Batch) {
	for _, e := range b.Entries {
		for _, seq := range e.Seqs {
			s.lens[seq] = e.Pos + 1
		}
	}
}

// Touched returns, for each sequence the batch touches, the length it had
// before: what to truncate back to when the decode did not complete.
func (s *SeqLens) Touched(b *Batch) map[int]int {
	out := map[int]int{}
	for _, e := range b.Entries {
		for _, seq := range e.Seqs {
			if _, ok := out[seq]; !ok {
				out[seq] = s.lens[seq]
			}
		}
	}
	return out
}

// Truncate validates and records the removal of positions [pos, end).
func (s *SeqLens) Truncate(seq, pos int) error {
	if err := s.checkSeq(seq); err != nil {
		return err
	}
	if pos < 0 {
		return fmt.Errorf("%w: negative position %d", ErrInvalidInput, pos)
	}
	if pos < s.lens[seq] {
		s.lens[seq] = pos
	}
	return nil
}

// Copy validates and records CopySeq(src, dst, p0, p1).
func (s *SeqLens) Copy(src, dst, p0, p1 int) error {
	if err := s.checkSeq(src); err != nil {
		return err
	}
	if err := s.checkSeq(dst); err != nil {
		return err
	}
	if p0 < 0 || p1 < p0 || p1 > s.lens[src] {
		return fmt.Errorf("%w: copy range [%d, %d) outside sequence %d of %d positions", ErrInvalidInput, p0, p1, src, s.lens[src])
	}
	if s.lens[dst] != p0 {
		return fmt.Errorf("%w: copy to sequence %d at %d, but it holds %d positions", ErrInvalidInput, dst, p0, s.lens[dst])
	}
	s.lens[dst] = p1
	return nil
}

// Load validates and records that sequence seq, empty, now holds n
// positions loaded from a saved state.
func (s *SeqLens) Load(seq, n int) error {
	if err := s.checkSeq(seq); err != nil {
		return err
	}
	if s.lens[seq] != 0 {
		return fmt.Errorf("%w: load into sequence %d, which holds %d positions", ErrInvalidInput, seq, s.lens[seq])
	}
	if n < 1 || n > s.capPerSeq {
		return fmt.Errorf("%w: a state of %d positions for sequences of %d", ErrInvalidInput, n, s.capPerSeq)
	}
	s.lens[seq] = n
	return nil
}
