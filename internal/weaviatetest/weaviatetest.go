// Package weaviatetest starts real Weaviate nodes on loopback for tests,
// through deploy/weaviate/cluster.sh (the script operators use), and stops
// them when the test ends. The binary is $WEAVIATE_BIN, else the one `make
// weaviate` builds (about 3 minutes the first time and when the Makefile's
// version changes, a no-op after); under -short the tests that need it use
// a binary already built, or skip.
package weaviatetest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dragon-rag/dragon/internal/testmodel"
)

var (
	buildOnce sync.Once
	buildErr  error
)

// Binary returns the Weaviate server binary, building it if needed.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("WEAVIATE_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("WEAVIATE_BIN: %v", err)
		}
		return bin
	}
	bin := filepath.Join(testmodel.Root(), "build", "weaviate", "weaviate-server")
	if testing.Short() {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("no Weaviate binary at %s: `make weaviate` builds it (skipped under -short)", bin)
		}
		return bin
	}
	// make rebuilds only a binary of another version than the Makefile's.
	buildOnce.Do(func() {
		cmd := exec.Command("make", "--no-print-directory", "weaviate")
		cmd.Dir = testmodel.Root()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make weaviate: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// Cluster is a set of running nodes.
type Cluster struct {
	t    testing.TB
	dir  string
	bin  string
	env  []string
	base int
	n    int
}

// Start starts n nodes and waits until all are ready; env adds variables
// for the script (WEAVIATE_API_KEY=...).
func Start(t testing.TB, n int, env ...string) *Cluster {
	t.Helper()
	c := &Cluster{t: t, dir: t.TempDir(), bin: Binary(t), env: env, n: n}
	// Below Linux's ephemeral range (32768 and up): a killed node's port
	// must still be free when it restarts, not taken as the local port of
	// some outgoing connection.
	for range 20 {
		c.base = 10000 + 10*rand.IntN(2200)
		if c.portsFree() {
			break
		}
	}
	t.Cleanup(func() {
		if out, err := c.script("stop"); err != nil {
			t.Logf("stopping Weaviate: %v\n%s", err, out)
		}
	})
	if out, err := c.script("start", strconv.Itoa(n), strconv.Itoa(c.base)); err != nil {
		t.Fatalf("starting %d Weaviate nodes: %v\n%s", n, err, out)
	}
	return c
}

// portsFree checks the ports the script will give the nodes.
func (c *Cluster) portsFree() bool {
	for i := range c.n {
		for _, p := range []int{c.base + i, c.base + 100 + i, c.base + 200 + 2*i, c.base + 201 + 2*i, c.base + 300 + 2*i, c.base + 301 + 2*i, c.base + 400 + i} {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				return false
			}
			l.Close()
		}
	}
	return true
}

func (c *Cluster) script(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(testmodel.Root(), "deploy", "weaviate", "cluster.sh"), append([]string{args[0], c.dir}, args[1:]...)...)
	// WATCH_PID: nodes outlive no test binary, even one killed by its
	// timeout before its cleanups ran.
	cmd.Env = append(os.Environ(), append([]string{"WEAVIATE_BIN=" + c.bin, "WATCH_PID=" + strconv.Itoa(os.Getpid())}, c.env...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// URL is node i's HTTP URL.
func (c *Cluster) URL(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", c.base+i) }

// GRPC is node i's gRPC address (cluster.sh's ports: BASE+100+I).
func (c *Cluster) GRPC(i int) string { return fmt.Sprintf("127.0.0.1:%d", c.base+100+i) }

// Kill kills node i at once (its data stays).
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	if out, err := c.script("kill", strconv.Itoa(i)); err != nil {
		c.t.Fatalf("kill node %d: %v\n%s", i, err, out)
	}
}

// Pause freezes node i (SIGSTOP): its connections stay open and nothing
// on them is answered, a node that hangs rather than dies. It returns
// an error rather than failing the test: a soak calls it from a goroutine
// of its own.
func (c *Cluster) Pause(i int) error {
	if out, err := c.script("pause", strconv.Itoa(i)); err != nil {
		return fmt.Errorf("pause node %d: %w: %s", i, err, out)
	}
	return nil
}

// Resume lets a paused node i go on.
func (c *Cluster) Resume(i int) error {
	if out, err := c.script("resume", strconv.Itoa(i)); err != nil {
		return fmt.Errorf("resume node %d: %w: %s", i, err, out)
	}
	return nil
}

// Restart starts node i again on its data and waits until it is ready.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if out, err := c.script("restart", strconv.Itoa(i)); err != nil {
		c.t.Fatalf("restart node %d: %v\n%s", i, err, out)
	}
}

// Stop stops node i the way an operator does (SIGTERM): it writes its
// memtables out as segments before it exits.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	if out, err := c.script("stop", strconv.Itoa(i)); err != nil {
		c.t.Fatalf("stop node %d: %v\n%s", i, err, out)
	}
}
