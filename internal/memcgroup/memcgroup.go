// Package memcgroup makes cgroup v1 memory groups (/sys/fs/cgroup/memory,
// root only) to run a process under a memory limit: the limit a phone
// gives an app, page cache included.
package memcgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Root is cgroup v1's memory hierarchy.
const Root = "/sys/fs/cgroup/memory"

// Available says whether this process can make memory groups: the
// hierarchy is mounted and writable (root).
func Available() bool {
	if _, err := os.Stat(filepath.Join(Root, "memory.limit_in_bytes")); err != nil {
		return false
	}
	return syscall.Access(Root, 2) == nil // W_OK
}

// Group is a memory group made for one run and removed after.
type Group struct{ dir string }

// New makes the group Root/name.
func New(name string) (*Group, error) {
	if _, err := os.Stat(filepath.Join(Root, "memory.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("memcgroup: no cgroup v1 memory hierarchy at %s: %w", Root, err)
	}
	dir := filepath.Join(Root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("memcgroup: make the group (as root): %w", err)
	}
	return &Group{dir: dir}, nil
}

func (c *Group) write(file string, v int64) error {
	if err := os.WriteFile(filepath.Join(c.dir, file), []byte(strconv.FormatInt(v, 10)), 0o644); err != nil {
		return fmt.Errorf("memcgroup: %s: %w", file, err)
	}
	return nil
}

func (c *Group) read(file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Limit caps the group's memory, page cache included, without swap: at
// the limit the kernel reclaims the group's own pages (a mapped file's,
// read again when next touched) or, with nothing to reclaim, kills. The
// peak is reset to the usage now.
func (c *Group) Limit(bytes int64) error {
	if err := c.write("memory.limit_in_bytes", bytes); err != nil {
		return err
	}
	// Without swap accounting the file is absent; then there is no swap
	// to fall back on anyway.
	if _, err := os.Stat(filepath.Join(c.dir, "memory.memsw.limit_in_bytes")); err == nil {
		if err := c.write("memory.memsw.limit_in_bytes", bytes); err != nil {
			return err
		}
	}
	return c.write("memory.max_usage_in_bytes", 0)
}

// Peak is the most memory the group was charged since its limit was set
// (memory.max_usage_in_bytes).
func (c *Group) Peak() (int64, error) { return c.read("memory.max_usage_in_bytes") }

// OOMKills counts the group's processes the kernel killed at the limit
// (memory.oom_control's oom_kill, 0 where the kernel does not say).
func (c *Group) OOMKills() int64 {
	b, err := os.ReadFile(filepath.Join(c.dir, "memory.oom_control"))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Argv is argv run inside the group: a shell joins it, then becomes argv.
func (c *Group) Argv(argv ...string) []string {
	return append([]string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.dir, "cgroup.procs")}, argv...)
}

// Command runs argv inside the group.
func (c *Group) Command(argv ...string) *exec.Cmd {
	a := c.Argv(argv...)
	return exec.Command(a[0], a[1:]...)
}

// Remove deletes the group once its processes are gone.
func (c *Group) Remove() error {
	var err error
	for range 50 {
		if err = os.Remove(c.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("memcgroup: remove %s: %w", c.dir, err)
}

// DropFromPageCache writes out and evicts a file's pages from the page
// cache: pages cached before a group existed are charged to whoever read
// or wrote them, so a process in the group would read them for free.
// Pages a process still maps stay.
func DropFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return fadviseDontNeed(f)
}
