// Package vecmath holds the decoder's vocabulary-wide kernels in C, where
// the compiler's AVX2 code runs them an order of magnitude faster than
// scalar Go (docs/BENCHMARKS.md, "Mixture kernel").
package vecmath

/*
#cgo CFLAGS: -O3
#cgo LDFLAGS: -lm
#include "vecmath.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// NegligibleNats: logits this far below a row's maximum get probability
// exactly zero (each would weigh under 1e-13, below float32 resolution of
// a distribution).
const NegligibleNats = 30

// SoftmaxMix adds w·softmax(logits) into acc and returns the log partition
// log Σ exp(logits). Probabilities carry a relative error below 1e-6.
// Logits that hold a NaN or +Inf, or are all -Inf, are an error and leave
// acc untouched.
func SoftmaxMix(acc, logits []float32, w float32) (float64, error) {
	if len(logits) == 0 {
		return 0, fmt.Errorf("vecmath: empty logits")
	}
	if len(acc) < len(logits) {
		return 0, fmt.Errorf("vecmath: accumulator of %d entries for %d logits", len(acc), len(logits))
	}
	logZ := float64(C.dragon_softmax_mix((*C.float)(unsafe.Pointer(&acc[0])), (*C.float)(unsafe.Pointer(&logits[0])), C.size_t(len(logits)), C.float(w)))
	if math.IsNaN(logZ) {
		return 0, fmt.Errorf("vecmath: logits hold a NaN or +Inf, or are all -Inf: no distribution")
	}
	return logZ, nil
}

// LogSumExp is log Σ exp(logits), the log partition SoftmaxMix returns for
// the same logits, bit for bit, without mixing anything. Logits that hold a
// NaN or +Inf, or are all -Inf, are an error.
func LogSumExp(logits []float32) (float64, error) {
	if len(logits) == 0 {
		return 0, fmt.Errorf("vecmath: empty logits")
	}
	logZ := float64(C.dragon_log_sum_exp((*C.float)(unsafe.Pointer(&logits[0])), C.size_t(len(logits))))
	if math.IsNaN(logZ) {
		return 0, fmt.Errorf("vecmath: logits hold a NaN or +Inf, or are all -Inf: no distribution")
	}
	return logZ, nil
}
