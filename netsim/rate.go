package netsim

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Rate is a bandwidth in bytes per second; zero is unlimited.
type Rate int64

// rateUnits are the units ParseRate reads, in bytes per second. Byte
// units need a capital B and bits are spelled out, so that "8Mb" is
// refused rather than read as bytes when bits were meant.
var rateUnits = []struct {
	name string
	mult float64
}{
	{"B", 1}, {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"bit", 1.0 / 8}, {"kbit", 1e3 / 8}, {"mbit", 1e6 / 8}, {"gbit", 1e9 / 8},
}

// ParseRate reads a bandwidth: a plain number of bytes per second, or a
// number with a unit and an optional "/s": B, kB or KB, MB, GB (powers of
// 1000), KiB, MiB, GiB (of 1024), or bit, kbit, mbit, gbit (any case).
// "1MB/s", "1.5MiB", "8mbit" and "125000" are rates; 0 is unlimited.
func ParseRate(s string) (Rate, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "/s")
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("netsim: rate %q is negative", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("netsim: rate %q: want a number of bytes/s, maybe with a unit (1MB/s, 8mbit)", s)
	}
	mult := 0.0
	for _, u := range rateUnits {
		if unit == u.name || strings.HasSuffix(u.name, "bit") && strings.EqualFold(unit, u.name) {
			mult = u.mult
		}
	}
	switch {
	case unit == "":
		mult = 1
	case mult == 0:
		return 0, fmt.Errorf("netsim: rate %q: unknown unit %q (B, kB, MB, GB, KiB, MiB, GiB, bit, kbit, mbit, gbit; bits spelled out)", s, unit)
	}
	r := math.Round(v * mult)
	if r > math.MaxInt64/2 {
		return 0, fmt.Errorf("netsim: rate %q is too large", s)
	}
	return Rate(r), nil
}

// String writes the rate in the largest unit that divides it ("1MB/s",
// "1500B/s"), or "unlimited".
func (r Rate) String() string {
	if r == 0 {
		return "unlimited"
	}
	for _, u := range []struct {
		name string
		mult int64
	}{{"GB", 1e9}, {"GiB", 1 << 30}, {"MB", 1e6}, {"MiB", 1 << 20}, {"kB", 1e3}, {"KiB", 1 << 10}} {
		if int64(r)%u.mult == 0 {
			return fmt.Sprintf("%d%s/s", int64(r)/u.mult, u.name)
		}
	}
	return fmt.Sprintf("%dB/s", int64(r))
}

// serialize is how long n bytes take to leave at the rate.
func (r Rate) serialize(n int) time.Duration {
	return time.Duration(int64(n) * int64(time.Second) / int64(r))
}

// MarshalJSON writes bytes per second as a number.
func (r Rate) MarshalJSON() ([]byte, error) { return strconv.AppendInt(nil, int64(r), 10), nil }

// UnmarshalJSON reads a number of bytes per second or a string ParseRate
// accepts.
func (r *Rate) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch v := v.(type) {
	case float64:
		if v < 0 || v != math.Trunc(v) || v > math.MaxInt64/2 {
			return fmt.Errorf("netsim: rate %v: want a whole, non-negative number of bytes/s", v)
		}
		*r = Rate(v)
	case string:
		p, err := ParseRate(v)
		if err != nil {
			return err
		}
		*r = p
	default:
		return fmt.Errorf("netsim: rate %s: want bytes/s or a string like \"1MB/s\"", b)
	}
	return nil
}
