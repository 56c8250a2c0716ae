package memcgroup

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fadviseDontNeed drops f's clean pages from the page cache.
func fadviseDontNeed(f *os.File) error {
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("memcgroup: drop %s from the page cache: %w", f.Name(), err)
	}
	return nil
}
