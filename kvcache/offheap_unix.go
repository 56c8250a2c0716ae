//go:build unix

package kvcache

import (
	"fmt"
	"syscall"
)

// mapBytes is n bytes of anonymous private memory, outside the Go heap.
func mapBytes(n int) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("kvcache: map %d bytes for a state: %w", n, err)
	}
	return b, nil
}

// unmapBytes returns mapBytes' memory to the system.
func unmapBytes(b []byte) {
	if len(b) > 0 {
		_ = syscall.Munmap(b)
	}
}
