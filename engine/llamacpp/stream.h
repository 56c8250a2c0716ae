// Streaming a model's weights through two layer-sized buffers (stream.c):
// with a memory budget smaller than the weights, every pass reads the
// unpinned layers from storage again. Left to page faults, one fault's
// readahead at a time, that ran at 0.6 GB/s on VMs whose storage gives
// 1.3-1.5 GB/s to several direct reads at once. Here a few reader threads
// read each layer's unpinned tensors straight into one of two buffers
// (O_DIRECT where the file system allows it), the next layer into the
// other while this one runs, and the graph's weights point into the
// buffer while their layer runs. What the buffers hold is the process's
// own memory: the page cache's reclaim cannot take a layer read ahead.
#ifndef DRAGON_STREAM_H
#define DRAGON_STREAM_H

#include <stdbool.h>
#include <stdint.h>
#include "ggml.h"

typedef struct dragon_stream dragon_stream;

// dragon_stream_new opens path and starts n_threads readers for the n
// tensors (name, off, len) of the file, each of layer[i] in
// 0..n_layers-1, in layer order and in file order within a layer. NULL
// when the input is not that, the file cannot be opened, the buffers
// cannot be had, or no reader starts.
dragon_stream *dragon_stream_new(const char *path, int32_t n_layers, int32_t n, const int32_t *layer,
                                 const char *const *name, const int64_t *off, const int64_t *len,
                                 int32_t n_threads);
void dragon_stream_free(dragon_stream *s);

// dragon_stream_eval is a ggml_backend_sched_eval_callback (user data: the
// stream): it splits the graph at each layer's first node, has the layer
// read there (and the next one queued), and points each node's streamed
// weights at the buffer that holds them.
bool dragon_stream_eval(struct ggml_tensor *t, bool ask, void *data);

// dragon_stream_pass_begin and dragon_stream_pass_end bracket a pass
// (llama_decode) of any context of a streamed model: passes of such
// contexts run one at a time, and after each the weights point at the
// model's mapping again. s may be NULL (a context that only needs the
// turn: an embedding context of a streamed model).
void dragon_stream_pass_begin(dragon_stream *s);
void dragon_stream_pass_end(dragon_stream *s);

// dragon_stream_read_bytes is how many of the tensors' bytes the readers
// have read (not the alignment around them; a failed read is not counted,
// and its layer runs from the mapping).
int64_t dragon_stream_read_bytes(dragon_stream *s);

// dragon_stream_pointed is how many times a graph node's weight was
// pointed into a buffer (a weight of a layer not yet read whole runs from
// the mapping).
int64_t dragon_stream_pointed(dragon_stream *s);

// dragon_stream_buffer_bytes is what the two layer buffers take.
int64_t dragon_stream_buffer_bytes(dragon_stream *s);

#endif
