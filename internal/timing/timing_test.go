package timing

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestMedian(t *testing.T) {
	assert.Equal(t, 0.0, Median(nil))
	assert.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	v := []float64{4, 1, 3, 2}
	assert.Equal(t, 2.5, Median(v))
	assert.Equal(t, []float64{4, 1, 3, 2}, v, "input untouched")
	assert.Equal(t, 1.5, MS(1500*time.Microsecond))
}
