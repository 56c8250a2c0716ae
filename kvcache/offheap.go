package kvcache

// block is an entry's state in memory, kept outside the Go heap: a cache
// given N bytes then costs N bytes of the process's memory, where states
// on the heap would raise the collector's goal by as much again (GOGC
// 100 lets the heap grow to twice what is live before it collects), and
// an evicted state's pages go back to the system at once. A lookup that
// hands the bytes out holds a reference, under the cache's lock, until
// it is done with them, so that an eviction meanwhile unmaps them only
// after.
type block struct {
	b     []byte
	refs  int
	freed bool
}

// newBlock copies src into memory of its own.
func newBlock(src []byte) (*block, error) {
	b, err := mapBytes(len(src))
	if err != nil {
		return nil, err
	}
	copy(b, src)
	return &block{b: b}, nil
}

// freeLocked drops the cache's own hold on b: its memory goes back once
// no lookup uses it.
func (b *block) freeLocked() {
	b.freed = true
	b.unmapIfUnused()
}

// doneLocked ends one lookup's use of b.
func (b *block) doneLocked() {
	b.refs--
	b.unmapIfUnused()
}

func (b *block) unmapIfUnused() {
	if b.freed && b.refs == 0 && b.b != nil {
		unmapBytes(b.b)
		b.b = nil
	}
}
