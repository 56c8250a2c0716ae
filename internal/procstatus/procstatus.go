// Package procstatus reads a process's memory figures from Linux's
// /proc/PID/status.
package procstatus

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Self is this process's status file.
const Self = "/proc/self/status"

// Of is process pid's status file.
func Of(pid int) string { return fmt.Sprintf("/proc/%d/status", pid) }

// KB reads one "Key:   N kB" line (VmRSS, VmHWM, ...) of a status file.
func KB(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("resident memory: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("resident memory: %s in %s: %w", key, path, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("resident memory: no %s in %s", key, path)
}
