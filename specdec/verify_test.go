package specdec

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVerifyGreedy(t *testing.T) {
	tests := []struct {
		name          string
		draft, argmax []Token
		want          Verdict
	}{
		{"empty draft decodes one token", nil, []Token{7}, Verdict{Emit: []Token{7}}},
		{"all accepted plus bonus", []Token{1, 2, 3}, []Token{1, 2, 3, 4},
			Verdict{Accepted: 3, Attempted: 3, Emit: []Token{1, 2, 3, 4}}},
		{"first rejected", []Token{1, 2, 3}, []Token{9, 2, 3, 4},
			Verdict{Accepted: 0, Attempted: 1, Emit: []Token{9}, Rollback: 3}},
		{"middle rejected", []Token{1, 2, 3, 4}, []Token{1, 2, 8, 4, 5},
			Verdict{Accepted: 2, Attempted: 3, Emit: []Token{1, 2, 8}, Rollback: 2}},
		{"last rejected", []Token{1, 2}, []Token{1, 5, 6},
			Verdict{Accepted: 1, Attempted: 2, Emit: []Token{1, 5}, Rollback: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := VerifyGreedy(tc.draft, tc.argmax)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := VerifyGreedy([]Token{1}, []Token{1})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestVerifySampleEdgeCases(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// p(x) = 1: always accepted; p(x) = 0: never.
	sure := []float32{0, 1, 0}
	never := []float32{0.5, 0, 0.5}
	v, err := VerifySample([]Token{1, 1}, [][]float32{sure, sure, {0, 0, 1}}, rng)
	require.NoError(t, err)
	require.Equal(t, Verdict{Accepted: 2, Attempted: 2, Emit: []Token{1, 1, 2}}, v)
	for range 100 {
		v, err = VerifySample([]Token{1}, [][]float32{never, sure}, rng)
		require.NoError(t, err)
		require.Zero(t, v.Accepted)
		require.NotEqual(t, Token(1), v.Emit[0])
		require.Equal(t, 1, v.Rollback)
	}
	_, err = VerifySample([]Token{1}, [][]float32{sure}, rng)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = VerifySample([]Token{5}, [][]float32{sure, sure}, rng)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = VerifySample(nil, [][]float32{{0, 0}}, rng)
	require.ErrorIs(t, err, ErrInvalid)
}
