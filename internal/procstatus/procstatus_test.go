package procstatus

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKB(t *testing.T) {
	status := filepath.Join(t.TempDir(), "status")
	require.NoError(t, os.WriteFile(status, []byte("Name:\tdragon\nVmHWM:\t  412345 kB\nVmRSS:\t  301000 kB\nVmBad:\t  x kB\n"), 0o644))
	for _, tc := range []struct {
		key  string
		want int64
		err  string
	}{
		{"VmRSS", 301000, ""},
		{"VmHWM", 412345, ""},
		{"VmSwap", 0, "no VmSwap"},
		{"VmBad", 0, "VmBad in"},
	} {
		got, err := KB(status, tc.key)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.key)
			continue
		}
		require.NoError(t, err, tc.key)
		assert.Equal(t, tc.want, got, tc.key)
	}
	_, err := KB(filepath.Join(t.TempDir(), "missing"), "VmRSS")
	assert.Error(t, err)

	live, err := KB(Self, "VmRSS")
	require.NoError(t, err)
	assert.Positive(t, live)
	mine, err := KB(Of(os.Getpid()), "VmRSS")
	require.NoError(t, err)
	assert.Positive(t, mine)
}
