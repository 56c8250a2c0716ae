package llamacpp

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unsafe"

	"github.com/dragon-rag/dragon/engine"
)

// Weight types Quantize can produce. Every matrix gets the one type (no
// K-quant mixes), so a type's speed and quality are measured alone.
var ftypes = map[string]C.enum_llama_ftype{
	"f16":    C.LLAMA_FTYPE_MOSTLY_F16,
	"q8_0":   C.LLAMA_FTYPE_MOSTLY_Q8_0,
	"q6_k":   C.LLAMA_FTYPE_MOSTLY_Q6_K,
	"q5_k":   C.LLAMA_FTYPE_MOSTLY_Q5_K_M,
	"q5_0":   C.LLAMA_FTYPE_MOSTLY_Q5_0,
	"q4_k":   C.LLAMA_FTYPE_MOSTLY_Q4_K_M,
	"q4_1":   C.LLAMA_FTYPE_MOSTLY_Q4_1,
	"q4_0":   C.LLAMA_FTYPE_MOSTLY_Q4_0,
	"iq4_nl": C.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}

// WeightTypes lists the types Quantize can produce.
func WeightTypes() []string {
	return slices.Sorted(maps.Keys(ftypes))
}

// Quantize rewrites the model at in with weights of type ftype (one of
// WeightTypes) into out. Already-quantized weights are dequantized first.
// Used to move a model onto a weight type whose matrix kernels are fast on
// this CPU (see docs/BENCHMARKS.md).
func Quantize(in, out, ftype string, threads int) error {
	ft, ok := ftypes[ftype]
	if !ok {
		return fmt.Errorf("%w: unknown weight type %q (want one of %s)", engine.ErrInvalidInput, ftype, strings.Join(WeightTypes(), ", "))
	}
	if err := checkGGUF(in); err != nil {
		return err
	}
	backendOnce.Do(initBackend)
	if errBackend != nil {
		return errBackend
	}
	cin := C.CString(in)
	defer C.free(unsafe.Pointer(cin))
	cout := C.CString(out)
	defer C.free(unsafe.Pointer(cout))
	p := C.llama_model_quantize_default_params()
	p.nthread = C.int32_t(threads)
	p.ftype = ft
	p.allow_requantize = true
	p.quantize_output_tensor = true
	p.pure = true
	if rc := C.llama_model_quantize(cin, cout, &p); rc != 0 {
		return fmt.Errorf("%w: llama.cpp could not quantize %s to %s (code %d)", engine.ErrBadModel, in, ftype, rc)
	}
	return nil
}
