package llamacpp

/*
#include <stdlib.h>
#include "llamacpp/llama.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/dragon-rag/dragon/engine"
)

// Weight types Quantize can produce.
var ftypes = map[string]C.enum_llama_ftype{
	"f16":    C.LLAMA_FTYPE_MOSTLY_F16,
	"q8_0":   C.LLAMA_FTYPE_MOSTLY_Q8_0,
	"q4_0":   C.LLAMA_FTYPE_MOSTLY_Q4_0,
	"q5_0":   C.LLAMA_FTYPE_MOSTLY_Q5_0,
	"iq4_nl": C.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}

// Quantize rewrites the model at in with weights of type ftype ("q8_0",
// "q4_0", "iq4_nl", "q5_0", "f16") into out. Already-quantized weights are
// dequantized first. Used to move a model onto a weight type whose batched
// matrix kernels are fast on this CPU (see docs/BENCHMARKS.md).
func Quantize(in, out, ftype string, threads int) error {
	ft, ok := ftypes[ftype]
	if !ok {
		return fmt.Errorf("%w: unknown weight type %q (want q8_0, q4_0, iq4_nl, q5_0 or f16)", engine.ErrInvalidInput, ftype)
	}
	if err := checkGGUF(in); err != nil {
		return err
	}
	backendOnce.Do(initBackend)
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
