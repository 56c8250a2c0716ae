package llamacpp

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/residency"
)

// Prefetch streams a model's unpinned weights through two layer-sized
// buffers (stream.c). Under a memory budget smaller than the weights every
// pass reads them from storage again. Left to the page faults of the pass,
// one readahead at a time, those reads ran at 0.6 GB/s on storage that
// gives 1.3 GB/s to several direct reads at once; and a layer read ahead
// into the page cache was the first thing the budget's reclaim took. With
// a Prefetch, Readers threads read each layer's tensors into a buffer of
// the context's own, the next layer into the other while this one runs,
// and the layer's weights point into the buffer while it runs.
type Prefetch struct {
	// Ranges are the tensors each pass reads from the file, each by the
	// layer that reads it, in layer order and in file order within a
	// layer (residency.Reads). Those with Layer equal to the model's
	// layer count run after the last layer (the output head): they are
	// left to the mapping's faults. Read ahead into the page cache
	// instead, where the plan could not lock the head there was no room
	// to keep it until it ran, and readers and faults evicted each
	// other's pages: trees with the draft model at 800 MiB read 3 GB a
	// token.
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

// SetPrefetch makes the contexts created from now on stream p's tensors
// (nil: none), and advises the layers' pages of the model's mapping
// random (residency.AdviseLayers): in the buffers, those pages are
// faulted on only for the odd small tensor (a layer's first norm runs
// before its reads are waited for), and a readahead there would read the
// big tensors around it into the page cache beside the buffers. The
// output head, left to the faults, keeps the mapping's advice. It must
// come before the model's first context: a context made before it would
// run its passes on the weights while another's pass points them into
// its buffers.
func (m *Model) SetPrefetch(p *Prefetch) error {
	if n := m.contexts.Load(); n > 0 {
		return fmt.Errorf("%w: %d contexts of %s are open; set its prefetch before the first", engine.ErrInvalidInput, n, m.info.Name)
	}
	if p != nil {
		n := m.Layers()
		last := 0
		for _, r := range p.Ranges {
			if r.Layer < last || r.Layer > n || r.Off < 0 || r.Size <= 0 || (r.Layer < n && r.Name == "") {
				return fmt.Errorf("%w: prefetch range %+v (layers 0 to %d, in order; a layer's tensors named)", engine.ErrInvalidInput, r, n)
			}
			last = r.Layer
		}
		if p.Readers < 1 {
			return fmt.Errorf("%w: prefetch with %d readers", engine.ErrInvalidInput, p.Readers)
		}
		if err := residency.AdviseLayers(m.info.Path, residency.AdviceRandom, p.Ranges, n); err != nil {
			return fmt.Errorf("llamacpp: prefetch: %w", err)
		}
		// The contexts' readers read the layers alone; the head is left
		// to the faults.
		p = &Prefetch{Ranges: slices.DeleteFunc(slices.Clone(p.Ranges), func(r residency.Read) bool { return r.Layer == n }), Readers: p.Readers}
	}
	m.prefetch.Store(p)
	return nil
}

// newStream starts the readers and buffers of a context's Prefetch, or
// returns nil when the model has none. The caller owns it until a
// context takes it.
func (m *Model) newStream() (*C.dragon_stream, error) {
	p := m.prefetch.Load()
	if p == nil {
		return nil, nil
	}
	ranges := p.Ranges
	n := len(ranges)
	if n == 0 {
		return nil, nil
	}
	layer := make([]C.int32_t, n)
	off := make([]C.int64_t, n)
	size := make([]C.int64_t, n)
	// C memory: the array of names is passed to C, so it may not hold Go
	// pointers.
	names := unsafe.Slice((**C.char)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof((*C.char)(nil))))), n)
	for i, r := range ranges {
		layer[i], off[i], size[i] = C.int32_t(r.Layer), C.int64_t(r.Off), C.int64_t(r.Size)
		names[i] = C.CString(r.Name)
	}
	defer func() {
		for _, s := range names {
			C.free(unsafe.Pointer(s))
		}
		C.free(unsafe.Pointer(&names[0]))
	}()
	path := C.CString(m.info.Path)
	defer C.free(unsafe.Pointer(path))
	s := C.dragon_stream_new(path, C.int32_t(m.Layers()), C.int32_t(n), &layer[0], &names[0], &off[0], &size[0], C.int32_t(p.Readers))
	if s == nil {
		return nil, fmt.Errorf("llamacpp: could not start %d readers and the layer buffers of %s", p.Readers, m.info.Path)
	}
	return s, nil
}

// PrefetchedBytes is how many of the streamed tensors' bytes this
// context's readers have read (0 without a Prefetch).
func (c *Context) PrefetchedBytes() int64 {
	if c.stream == nil {
		return 0
	}
	return int64(C.dragon_stream_read_bytes(c.stream))
}

// StreamBuffers is what this context's two layer buffers take (0
// without a Prefetch).
func (c *Context) StreamBuffers() int64 {
	if c.stream == nil {
		return 0
	}
	return int64(C.dragon_stream_buffer_bytes(c.stream))
}

// StreamedUses is how many times one of this context's passes ran a node
// on a weight in its buffers rather than in the mapping.
func (c *Context) StreamedUses() int64 {
	if c.stream == nil {
		return 0
	}
	return int64(C.dragon_stream_pointed(c.stream))
}
