package docsbench

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSubjectAndQuantile(t *testing.T) {
	assert.Equal(t, "Re: lunch", subject([]byte("From: a\r\nSubject: Re: lunch\r\n\r\nSubject: not a header\r\n")))
	assert.Equal(t, "mail", subject([]byte("From: a\n\nSubject: in the body\n")), "headers end at the blank line")
	xs := []float64{5, 1, 4, 2, 3}
	assert.Equal(t, 3.0, quantile(xs, 0.5))
	assert.Equal(t, 5.0, quantile(xs, 0.99))
	assert.Equal(t, []float64{5, 1, 4, 2, 3}, xs, "the input is left as it was")
	assert.Zero(t, quantile(nil, 0.5))
}
