// Reading a streamed model's weights before the layer that needs them
// faults on them (stream.c): with a memory budget smaller than the
// weights, every pass reads the unpinned layers from storage again. Left
// to page faults, one fault's readahead at a time, that ran at 0.6 GB/s on
// VMs whose storage gives 1.3 GB/s to several reads at once; here, at the
// start of each layer, a few reader threads read its unpinned ranges into
// the page cache in large chunks, and the layer runs once they are in.
#ifndef DRAGON_STREAM_H
#define DRAGON_STREAM_H

#include <stdbool.h>
#include <stdint.h>
#include "ggml.h"

typedef struct dragon_stream dragon_stream;

// dragon_stream_new opens path and starts n_threads readers for the n
// ranges (off, len) of the file, each of layer[i] in 0..n_layers (n_layers:
// what runs after the last layer, the output head), in layer order. NULL
// when the file cannot be opened or no reader starts.
dragon_stream *dragon_stream_new(const char *path, int32_t n_layers, int32_t n, const int32_t *layer,
                                 const int64_t *off, const int64_t *len, int32_t n_threads);
void dragon_stream_free(dragon_stream *s);

// dragon_stream_eval is a ggml_backend_sched_eval_callback (user data: the
// stream): it splits the graph at each layer's first node and, there,
// has the layer's reads done.
bool dragon_stream_eval(struct ggml_tensor *t, bool ask, void *data);

// dragon_stream_read_bytes is how much the readers have read (whole
// chunks; a failed read counts as read: the pass's faults read it again).
int64_t dragon_stream_read_bytes(dragon_stream *s);

#endif
