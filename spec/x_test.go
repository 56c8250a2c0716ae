package spec

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/stat/distuv"
)

func TestX(t *testing.T) { require.Equal(t, 1, 1); _ = distuv.ChiSquared{K: 1} }
