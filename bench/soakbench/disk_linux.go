package soakbench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// mountTmpfs mounts a tmpfs of mb MB on dir (root only): a disk that
// really fills.
func mountTmpfs(dir string, mb int) error {
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", mb)); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	return nil
}

// unmount detaches the tmpfs at dir, even while a file on it is open.
func unmount(dir string) error {
	return syscall.Unmount(dir, syscall.MNT_DETACH)
}

// fill writes a file into dir until its file system has no room left.
func fill(dir string) error {
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}
