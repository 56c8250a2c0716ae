package llamacpp

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/residency"
)

// Prefetch reads a streamed model's weights before the layer that needs
// them faults on them (stream.c). Under a memory budget smaller than the
// weights every pass reads the unpinned layers from storage again; left
// to the page faults of the pass, one readahead at a time, those reads
// ran at 0.6 GB/s on storage that gives 1.3 GB/s to several reads at once.
// With a Prefetch, at the start of each layer Readers threads read its
// ranges into the page cache in large chunks, and the layer runs once
// they are in.
type Prefetch struct {
	// Ranges are the file's bytes each pass reads, each by the layer that
	// reads it, in layer order (residency.Reads); Layer equal to the
	// model's layer count is what runs after the last layer (the output
	// head).
	Ranges  []residency.Read
	Readers int
}

// Layers is the model's transformer layer count.
func (m *Model) Layers() int {
	if err := m.hold(); err != nil {
		return 0
	}
	defer m.mu.RUnlock()
	return int(C.llama_model_n_layer(m.c))
}

// SetPrefetch makes the contexts created from now on read p's ranges
// ahead of their passes (nil: none).
func (m *Model) SetPrefetch(p *Prefetch) error {
	if p != nil {
		n := m.Layers()
		last := 0
		for _, r := range p.Ranges {
			if r.Layer < last || r.Layer > n || r.Off < 0 || r.Size <= 0 {
				return fmt.Errorf("%w: prefetch range %+v (layers 0 to %d, in order)", engine.ErrInvalidInput, r, n)
			}
			last = r.Layer
		}
		if p.Readers < 1 {
			return fmt.Errorf("%w: prefetch with %d readers", engine.ErrInvalidInput, p.Readers)
		}
	}
	m.prefetch.Store(p)
	return nil
}

// newStream starts the readers of a context's Prefetch, or returns nil
// when the model has none. The caller owns it until a context takes it.
func (m *Model) newStream() (*C.dragon_stream, error) {
	p := m.prefetch.Load()
	if p == nil || len(p.Ranges) == 0 {
		return nil, nil
	}
	n := len(p.Ranges)
	layer := make([]C.int32_t, n)
	off := make([]C.int64_t, n)
	size := make([]C.int64_t, n)
	for i, r := range p.Ranges {
		layer[i], off[i], size[i] = C.int32_t(r.Layer), C.int64_t(r.Off), C.int64_t(r.Size)
	}
	path := C.CString(m.info.Path)
	defer C.free(unsafe.Pointer(path))
	s := C.dragon_stream_new(path, C.int32_t(C.llama_model_n_layer(m.c)), C.int32_t(n), &layer[0], &off[0], &size[0], C.int32_t(p.Readers))
	if s == nil {
		return nil, fmt.Errorf("llamacpp: could not start %d readers of %s", p.Readers, m.info.Path)
	}
	return s, nil
}

// PrefetchedBytes is how much this context's readers have read ahead of
// its passes (0 without a Prefetch).
func (c *Context) PrefetchedBytes() int64 {
	if c.stream == nil {
		return 0
	}
	return int64(C.dragon_stream_read_bytes(c.stream))
}
