package netsim

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Rate
		err  string
	}{
		{"0", 0, ""},
		{"125000", 125000, ""},
		{"1MB/s", 1_000_000, ""},
		{"1.5MiB", 1_572_864, ""},
		{"100 kB/s", 100_000, ""},
		{"8mbit", 1_000_000, ""},
		{"8Mbit/s", 1_000_000, ""},
		{"1gbit", 125_000_000, ""},
		{"64KiB/s", 65536, ""},
		{"3B", 3, ""},
		{"", 0, "want a number"},
		{"fast", 0, "want a number"},
		{"-1MB/s", 0, "negative"},
		{"8Mb", 0, `unknown unit "Mb"`},
		{"8mb/s", 0, `unknown unit "mb"`},
		{"1e9", 0, `unknown unit "e9"`},
		{"1..2MB", 0, "want a number"},
		{"1e30GB", 0, "unknown unit"},
		{"99999999999GB", 0, "too large"},
	} {
		got, err := ParseRate(tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

func TestRateStringRoundTrips(t *testing.T) {
	for r, want := range map[Rate]string{0: "unlimited", 1_000_000: "1MB/s", 1 << 20: "1MiB/s", 1500: "1500B/s", 3 << 30: "3GiB/s", 2000: "2kB/s"} {
		assert.Equal(t, want, r.String())
		if r != 0 {
			back, err := ParseRate(r.String())
			require.NoError(t, err)
			assert.Equal(t, r, back)
		}
	}
}

func TestRateJSON(t *testing.T) {
	var r Rate
	require.NoError(t, json.Unmarshal([]byte(`1000000`), &r))
	assert.Equal(t, Rate(1_000_000), r)
	require.NoError(t, json.Unmarshal([]byte(`"2MB/s"`), &r))
	assert.Equal(t, Rate(2_000_000), r)
	b, err := json.Marshal(r)
	require.NoError(t, err)
	assert.JSONEq(t, `2000000`, string(b))
	for _, bad := range []string{`-1`, `1.5`, `"8Mb"`, `true`, `1e30`} {
		assert.Error(t, json.Unmarshal([]byte(bad), &r), bad)
	}
}
