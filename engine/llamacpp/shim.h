// A thin C layer over llama.cpp: aborting a decode from another thread,
// telling an abort apart from a full KV cache, filling a batch and decoding
// it in one cgo call, toggling embeddings output, and the log filter.
#ifndef DRAGON_SHIM_H
#define DRAGON_SHIM_H

#include <stdint.h>
#include "llama.h"
#include "stream.h"

typedef struct dragon_ctx dragon_ctx;

// dragon_ctx_new creates a context with the abort callback installed.
// With embeddings 1, every row's hidden state is kept unpooled (the caller
// pools); with 2, each sequence is pooled as the model says (a ranking
// model's score per sequence). A stream, when not NULL, reads the model's
// streamed layers into its buffers for its passes; the context owns it
// from a successful call on (the caller frees it after a failed one).
// With turns (or a stream), its passes take turns with those of the
// other contexts of streamed models (dragon_stream_pass_begin).
dragon_ctx *dragon_ctx_new(struct llama_model *model, uint32_t n_ctx, uint32_t n_batch,
                           uint32_t n_ubatch, uint32_t n_seq_max, int32_t n_threads, int embeddings, int unified,
                           dragon_stream *stream, int turns);
void dragon_ctx_free(dragon_ctx *c);
struct llama_context *dragon_ctx_llama(dragon_ctx *c);

// dragon_abort raises (1) or clears (0) the abort flag polled by ggml
// between graph nodes.
void dragon_abort(dragon_ctx *c, int on);

// dragon_decode_start fills the batch from flat arrays and hands it to
// the context's decode worker: 0 when the pass started (its end is one
// write to dragon_decode_done_fd, its code dragon_decode_result), <0 for a
// batch it refused. seqs holds nseq[i] sequence ids for each row i,
// concatenated. One pass at a time; nothing else may use the context
// until it ends.
int32_t dragon_decode_start(dragon_ctx *c, int32_t n, const int32_t *tokens, const int32_t *pos,
                            const int32_t *nseq, const int32_t *seqs, const int8_t *logits);

// dragon_decode_done_fd is the non-blocking eventfd the worker writes 1 to
// at the end of each pass. The caller takes it over: it closes it, after
// dragon_ctx_free.
int dragon_decode_done_fd(dragon_ctx *c);

// dragon_decode_result is the last pass's llama_decode code (0 ok, 1 no
// KV slot, 2 aborted, <0 error), once its end was read.
int32_t dragon_decode_result(dragon_ctx *c);

// dragon_last_decode_ns is the time the last pass spent inside
// llama_decode, to tell llama.cpp's cost from the wrapper's.
int64_t dragon_last_decode_ns(dragon_ctx *c);

// dragon_log_install routes llama.cpp's log to Go (dragonLlamaLog), less
// the error lines of aborted decodes.
void dragon_log_install(void);

// dragon_llama_build identifies the llama.cpp build linked in: the hash of
// its build record, which the Makefile passes as DRAGON_LLAMA_BUILD
// ("unknown" when built without it).
const char *dragon_llama_build(void);

// dragon_model_load memory-maps a model on the CPU without llama.cpp's
// progress dots; repack 0 keeps every weight in the mapping.
struct llama_model *dragon_model_load(const char *path, int repack);

#endif
