//go:build !unix

package kvcache

// mapBytes is n bytes of the Go heap where there is no mmap.
func mapBytes(n int) ([]byte, error) { return make([]byte, n), nil }

// unmapBytes leaves b to the collector.
func unmapBytes([]byte) {}
