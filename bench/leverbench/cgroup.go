package leverbench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroupRoot is cgroup v1's memory hierarchy (these VMs have it; making a
// group needs root).
const cgroupRoot = "/sys/fs/cgroup/memory"

// cgroup is a cgroup v1 memory group made for one run and removed after.
type cgroup struct{ dir string }

func newCgroup(name string) (*cgroup, error) {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "memory.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("lever: no cgroup v1 memory hierarchy at %s: %w", cgroupRoot, err)
	}
	dir := filepath.Join(cgroupRoot, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lever: make the cgroup (as root): %w", err)
	}
	return &cgroup{dir: dir}, nil
}

func (c *cgroup) write(file string, v int64) error {
	if err := os.WriteFile(filepath.Join(c.dir, file), []byte(strconv.FormatInt(v, 10)), 0o644); err != nil {
		return fmt.Errorf("lever: %s: %w", file, err)
	}
	return nil
}

func (c *cgroup) read(file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// limit caps the group's memory, page cache included, without swap: at
// the limit the kernel reclaims the group's own pages (the model file's,
// re-read when next touched) or, with nothing to reclaim, kills.
func (c *cgroup) limit(bytes int64) error {
	if err := c.write("memory.limit_in_bytes", bytes); err != nil {
		return err
	}
	// Without swap accounting the file is absent; then there is no swap
	// to fall back on anyway.
	if _, err := os.Stat(filepath.Join(c.dir, "memory.memsw.limit_in_bytes")); err == nil {
		return c.write("memory.memsw.limit_in_bytes", bytes)
	}
	return nil
}

// peak is the most memory the group was charged (memory.max_usage_in_bytes).
func (c *cgroup) peak() (int64, error) { return c.read("memory.max_usage_in_bytes") }

// command runs argv inside the group: a shell joins it, then becomes argv.
func (c *cgroup) command(argv ...string) *exec.Cmd {
	procs := filepath.Join(c.dir, "cgroup.procs")
	return exec.Command("sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs}, argv...)...)
}

// remove deletes the group once its processes are gone.
func (c *cgroup) remove() error {
	var err error
	for range 50 {
		if err = os.Remove(c.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("lever: remove the cgroup: %w", err)
}
