package aggbench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Daemon is a dragon daemon running as a child process.
type Daemon struct {
	Name string
	Addr string // where it serves
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
	done chan error

	stopOnce sync.Once
	stopErr  error
	killed   atomic.Bool
	http     atomic.Pointer[string]
}

// HTTPAddr is where the daemon serves HTTP, once it has said so ("" until
// then, or without --http).
func (d *Daemon) HTTPAddr() string {
	if p := d.http.Load(); p != nil {
		return *p
	}
	return ""
}

var (
	servingAddr = regexp.MustCompile(`msg=serving .*addr=(\S+)`)
	httpAddr    = regexp.MustCompile(`msg="serving http" .*addr=(\S+)`)
)

// StartDaemon runs argv (the dragon binary and a daemon command line) with
// extra environment variables, pinned to cores (a taskset list: "0",
// "0,1"; empty: anywhere) when taskset exists, and waits until it logs
// that it serves.
func StartDaemon(name, cores string, env []string, argv ...string) (*Daemon, error) {
	if cores != "" {
		if ts, err := exec.LookPath("taskset"); err == nil {
			argv = append([]string{ts, "-c", cores}, argv...)
		}
	}
	d := &Daemon{Name: name, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), env...)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.log.WriteString(line + "\n")
			d.mu.Unlock()
			if m := servingAddr.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
			if m := httpAddr.FindStringSubmatch(line); m != nil {
				d.http.Store(&m[1])
			}
		}
		close(addr)
		d.done <- d.cmd.Wait()
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			return nil, fmt.Errorf("%s exited before serving:\n%s", name, d.Logs())
		}
		d.Addr = a
		return d, nil
	case <-time.After(3 * time.Minute):
		_ = d.cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start in 3 minutes:\n%s", name, d.Logs())
	}
}

// Logs is what the daemon wrote to stderr.
func (d *Daemon) Logs() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// Kill ends the daemon at once (SIGKILL), as a crash would.
func (d *Daemon) Kill() error {
	d.stopOnce.Do(func() {
		d.killed.Store(true)
		_ = d.cmd.Process.Kill()
		<-d.done
	})
	return nil
}

// Killed reports whether Kill was called.
func (d *Daemon) Killed() bool { return d.killed.Load() }

// Stop asks the daemon to shut down (SIGTERM) and waits; it kills a daemon
// that does not stop in time and reports that. Later calls return the
// first one's result.
func (d *Daemon) Stop(grace time.Duration) error {
	d.stopOnce.Do(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-d.done:
			if err != nil {
				d.stopErr = fmt.Errorf("%s: %w:\n%s", d.Name, err, d.Logs())
			}
		case <-time.After(grace):
			_ = d.cmd.Process.Kill()
			<-d.done
			d.stopErr = errors.New(d.Name + " did not stop on SIGTERM and was killed")
		}
	})
	return d.stopErr
}
