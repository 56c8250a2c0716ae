// Package timing holds the small statistics the benchmarks share.
package timing

import (
	"slices"
	"time"
)

// MS is d in milliseconds.
func MS(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// Median of v (0 for none); v is not modified.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
