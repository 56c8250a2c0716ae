package check

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scripts lists deploy/'s shell scripts.
func scripts(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".sh") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no scripts under deploy/")
	}
	return out
}

func bash(t *testing.T) string {
	t.Helper()
	b, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not installed")
	}
	return b
}

// runScript runs a script with bash and returns its exit code and output.
func runScript(t *testing.T, script string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash(t), append([]string{script}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatalf("%s %v: %v", script, args, err)
	return 0, ""
}

func TestScripts(t *testing.T) {
	for _, s := range scripts(t) {
		t.Run(filepath.Base(s), func(t *testing.T) {
			if out, err := exec.Command(bash(t), "-n", s).CombinedOutput(); err != nil {
				t.Errorf("bash -n: %v\n%s", err, out)
			}
			b, err := os.ReadFile(s)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("#!/usr/bin/env bash\n")) {
				t.Error("want #!/usr/bin/env bash first")
			}
			if !bytes.Contains(b, []byte("\nset -euo pipefail\n")) {
				t.Error("want set -euo pipefail")
			}
			if fi, err := os.Stat(s); err == nil && fi.Mode()&0o111 == 0 {
				t.Error("not executable")
			}
		})
	}

	// shellcheck: make deps installs it, so make test runs this; a bare
	// go test on a machine without it skips.
	t.Run("shellcheck", func(t *testing.T) {
		sc, err := exec.LookPath("shellcheck")
		if err != nil {
			t.Skip("shellcheck not installed")
		}
		for _, s := range scripts(t) {
			if out, err := exec.Command(sc, "--shell=bash", s).CombinedOutput(); err != nil {
				t.Errorf("shellcheck %s: %v\n%s", s, err, out)
			}
		}
	})

	// --help needs no root and changes nothing; usage errors are caught
	// before any privileged step.
	netem := filepath.Join(deployDir, "netem.sh")
	testbed := filepath.Join(deployDir, "testbed.sh")
	for _, tc := range []struct {
		script string
		args   []string
		code   int
		want   string
	}{
		{netem, []string{"--help"}, 0, "usage: netem.sh add|change|clear IFACE"},
		{netem, []string{"-h"}, 0, "dragon netsim"},
		{netem, nil, 2, "missing command"},
		{netem, []string{"add"}, 2, "needs an interface"},
		{netem, []string{"add", "eth0"}, 2, "needs at least one of"},
		{netem, []string{"add", "eth0", "--delay"}, 2, "--delay needs a value"},
		{netem, []string{"add", "eth0", "--delay", "fast"}, 2, "want a duration"},
		{netem, []string{"add", "eth0", "--jitter", "3ms"}, 2, "--jitter needs --delay"},
		{netem, []string{"add", "eth0", "--rate", "10"}, 2, "want a tc rate"},
		{netem, []string{"bogus"}, 2, "unknown command"},
		{testbed, []string{"--help"}, 0, "usage: testbed.sh COMMAND"},
		{testbed, []string{"-h"}, 0, "run-netsim"},
		{testbed, []string{"up", "--help"}, 0, "usage:"},
		{testbed, []string{"shape", "--help"}, 0, "usage:"},
		{testbed, []string{"shape", "--delay"}, 2, "--delay needs a value"},
		{testbed, []string{"shape", "--loss", "lots"}, 2, "want a percentage"},
		{testbed, []string{"exec", "moon", "true"}, 2, "want dev or cloud"},
		{testbed, []string{"bogus"}, 2, "unknown command"},
		{testbed, nil, 2, "missing command"},
	} {
		t.Run(filepath.Base(tc.script)+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			code, out := runScript(t, tc.script, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, want %d, output containing %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}

	// An unknown interface is reported as such, before the root check (ip
	// link show needs no privilege) and before tc touches anything.
	t.Run("netem.sh unknown interface", func(t *testing.T) {
		for _, tool := range []string{"ip", "tc"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("%s not installed", tool)
			}
		}
		code, out := runScript(t, netem, "add", "dragonnosuch0", "--delay", "10ms")
		if code != 1 || !strings.Contains(out, "unknown interface 'dragonnosuch0'") {
			t.Errorf("exit %d, output:\n%s", code, out)
		}
	})

	// probe only reads the kernel's configuration: 0 (netem), 1 (none, and
	// it says to use netsim) or 2 (cannot tell).
	t.Run("netem.sh probe", func(t *testing.T) {
		code, out := runScript(t, netem, "probe")
		switch code {
		case 0, 2:
		case 1:
			if !strings.Contains(out, "dragon netsim") {
				t.Errorf("netem missing, but no word of netsim:\n%s", out)
			}
		default:
			t.Errorf("exit %d:\n%s", code, out)
		}
		t.Logf("this machine: %s", strings.TrimSpace(out))
	})

	// The container health check only needs bash; here its usage errors.
	t.Run("healthcheck.sh usage", func(t *testing.T) {
		hc := filepath.Join(deployDir, "docker", "healthcheck.sh")
		for _, args := range [][]string{nil, {"http", "x"}, {"http", "8080"}, {"udp", "53"}} {
			if code, out := runScript(t, hc, args...); code != 2 || !strings.Contains(out, "usage:") {
				t.Errorf("%v: exit %d:\n%s", args, code, out)
			}
		}
	})
}
