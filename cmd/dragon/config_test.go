package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testCommand is "dragon device"-like: a root with one subcommand and a
// few flags.
func testCommand() (*cobra.Command, *cobra.Command, *struct {
	listen  string
	timeout time.Duration
	threads int
	stop    []string
}) {
	v := &struct {
		listen  string
		timeout time.Duration
		threads int
		stop    []string
	}{}
	root := &cobra.Command{Use: "dragon"}
	sub := &cobra.Command{Use: "device", RunE: func(*cobra.Command, []string) error { return nil }}
	sub.Flags().StringVar(&v.listen, "listen", "127.0.0.1:7071", "")
	sub.Flags().DurationVar(&v.timeout, "cloud-timeout", 10*time.Second, "")
	sub.Flags().IntVar(&v.threads, "threads", 1, "")
	sub.Flags().StringArrayVar(&v.stop, "stop", nil, "")
	root.AddCommand(sub)
	return root, sub, v
}

func writeFile(t *testing.T, text string) string {
	p := filepath.Join(t.TempDir(), "dragon.yaml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// TestConfigPrecedence: the command line beats the environment, which
// beats the file, which beats the defaults.
func TestConfigPrecedence(t *testing.T) {
	file := writeFile(t, "device:\n  listen: 0.0.0.0:1\n  threads: 3\n  cloud-timeout: 2s\n  stop: [a, b]\n")
	t.Setenv("DRAGON_DEVICE_THREADS", "5")
	root, sub, v := testCommand()
	require.NoError(t, sub.ParseFlags([]string{"--listen", "127.0.0.1:9"}))
	require.NoError(t, checkConfigCommands(root, file))
	require.NoError(t, applyConfig(sub, file))
	assert.Equal(t, "127.0.0.1:9", v.listen, "command line")
	assert.Equal(t, 5, v.threads, "environment")
	assert.Equal(t, 2*time.Second, v.timeout, "file")
	assert.Equal(t, []string{"a", "b"}, v.stop, "a list in the file")
	assert.Equal(t, "DRAGON_BENCH_AGG_MAX_TOKENS", configEnv("bench agg", "max-tokens"))
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]struct {
		file, env, want string
	}{
		"unknown command": {file: "clod:\n  listen: x\n", want: "unknown commands clod"},
		"unknown flag":    {file: "device:\n  lisen: x\n", want: `unknown flag "lisen"`},
		"bad value":       {file: "device:\n  threads: many\n", want: "device.threads"},
		"bad environment": {env: "soon", want: "$DRAGON_DEVICE_CLOUD_TIMEOUT"},
		"not a map":       {file: "device: 3\n", want: "want a map"},
		"bad YAML":        {file: "device: [\n", want: "--config"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			root, sub, _ := testCommand()
			file := ""
			if c.file != "" {
				file = writeFile(t, c.file)
			}
			if c.env != "" {
				t.Setenv("DRAGON_DEVICE_CLOUD_TIMEOUT", c.env)
			}
			err := checkConfigCommands(root, file)
			if err == nil {
				err = applyConfig(sub, file)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
