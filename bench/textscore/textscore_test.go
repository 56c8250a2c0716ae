package textscore

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestF1(t *testing.T) {
	p, r, f := F1("The cat sat, the CAT!", "the cat sat on the mat")
	assert.InDelta(t, 4.0/5, p, 1e-9) // the the cat sat (+ one cat too many)
	assert.InDelta(t, 4.0/6, r, 1e-9)
	assert.InDelta(t, 2*p*r/(p+r), f, 1e-9)
	p, r, f = F1("", "words")
	assert.Zero(t, p+r+f)
	assert.Equal(t, map[string]int{"über": 1, "straße": 2, "2024": 1}, Words("Über Straße, straße 2024."))
}
