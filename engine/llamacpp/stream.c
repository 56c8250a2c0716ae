// pread, strdup and clock_gettime under -std=c11
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stream.h"

// One read of a layer's bytes: the unit the readers share.
typedef struct {
    int32_t layer;
    int64_t off, len;
} dragon_chunk;

#define DRAGON_CHUNK_BYTES (2 << 20)

struct dragon_stream {
    int fd;
    int32_t n_layers; // layers 0..n_layers-1, and n_layers: the tensors after them
    // chunks[first[l] .. first[l+1]) are layer l's unpinned bytes.
    dragon_chunk *chunks;
    int32_t *first;

    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int32_t next;     // the next chunk a reader takes
    int32_t end;      // chunks before end are queued
    int32_t *pending; // chunks of each layer not yet read
    int32_t queued;   // the next layer to queue
    int32_t busy;     // readers inside a read
    int quit;

    int32_t n_threads;
    pthread_t *threads;
    int64_t read_bytes; // read by the readers, under mu
};

static void *dragon_stream_reader(void *arg) {
    dragon_stream *s = arg;
    char *buf = malloc(DRAGON_CHUNK_BYTES);
    pthread_mutex_lock(&s->mu);
    while (buf != NULL) {
        while (!s->quit && s->next >= s->end) {
            pthread_cond_wait(&s->work, &s->mu);
        }
        if (s->quit) {
            break;
        }
        dragon_chunk ch = s->chunks[s->next++];
        s->busy++;
        pthread_mutex_unlock(&s->mu);
        // Into the page cache, where the pass's faults find it; the copy
        // into buf is thrown away. A failed read only costs the pass its
        // own fault, which reads it again (and reports what it must).
        for (int64_t got = 0; got < ch.len;) {
            ssize_t n = pread(s->fd, buf, (size_t)(ch.len - got), (off_t)(ch.off + got));
            if (n <= 0) {
                break;
            }
            got += n;
        }
        pthread_mutex_lock(&s->mu);
        s->busy--;
        s->read_bytes += ch.len;
        s->pending[ch.layer]--;
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    free(buf);
    return NULL;
}

dragon_stream *dragon_stream_new(const char *path, int32_t n_layers, int32_t n, const int32_t *layer,
                                 const int64_t *off, const int64_t *len, int32_t n_threads) {
    if (n_layers <= 0 || n_threads <= 0) {
        return NULL;
    }
    dragon_stream *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return NULL;
    }
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        free(s);
        return NULL;
    }
    // Exact reads: the chunks are already large, and the fd's own
    // readahead would read past a layer into pages the budget has no room
    // for.
    posix_fadvise(s->fd, 0, 0, POSIX_FADV_RANDOM);
    s->n_layers = n_layers;
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        total += (len[i] + DRAGON_CHUNK_BYTES - 1) / DRAGON_CHUNK_BYTES;
    }
    s->chunks = calloc((size_t)total + 1, sizeof(dragon_chunk));
    s->first = calloc((size_t)n_layers + 2, sizeof(int32_t));
    s->pending = calloc((size_t)n_layers + 1, sizeof(int32_t));
    s->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (s->chunks == NULL || s->first == NULL || s->pending == NULL || s->threads == NULL) {
        dragon_stream_free(s);
        return NULL;
    }
    // Ranges come in layer order; split them into chunks.
    int32_t k = 0;
    for (int32_t l = 0, i = 0; l <= n_layers; l++) {
        s->first[l] = k;
        for (; i < n && layer[i] == l; i++) {
            for (int64_t o = 0; o < len[i]; o += DRAGON_CHUNK_BYTES) {
                s->chunks[k++] = (dragon_chunk){.layer = l, .off = off[i] + o, .len = len[i] - o < DRAGON_CHUNK_BYTES ? len[i] - o : DRAGON_CHUNK_BYTES};
            }
        }
    }
    s->first[n_layers + 1] = k;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    for (int32_t t = 0; t < n_threads; t++) {
        if (pthread_create(&s->threads[t], NULL, dragon_stream_reader, s) != 0) {
            break;
        }
        s->n_threads++;
    }
    if (s->n_threads == 0) {
        dragon_stream_free(s);
        return NULL;
    }
    return s;
}

void dragon_stream_free(dragon_stream *s) {
    if (s == NULL) {
        return;
    }
    if (s->n_threads > 0) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->work);
        pthread_mutex_unlock(&s->mu);
        for (int32_t t = 0; t < s->n_threads; t++) {
            pthread_join(s->threads[t], NULL);
        }
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->done);
        pthread_mutex_destroy(&s->mu);
    }
    if (s->fd >= 0) {
        close(s->fd);
    }
    free(s->chunks);
    free(s->first);
    free(s->pending);
    free(s->threads);
    free(s);
}

// queue_locked queues layers up to and including l (once each per graph).
static void queue_locked(dragon_stream *s, int32_t l) {
    for (; s->queued <= l && s->queued <= s->n_layers; s->queued++) {
        int32_t q = s->queued;
        s->pending[q] = s->first[q + 1] - s->first[q];
        s->end = s->first[q + 1];
    }
    pthread_cond_broadcast(&s->work);
}

// reset_locked starts a graph's reads: what an aborted one left queued is
// dropped, and reads in flight finish first.
static void reset_locked(dragon_stream *s) {
    s->end = s->next;
    while (s->busy > 0) {
        pthread_cond_wait(&s->done, &s->mu);
    }
    s->next = s->end = 0;
    s->queued = 0;
    memset(s->pending, 0, sizeof(int32_t) * ((size_t)s->n_layers + 1));
}

// The layer a graph node starts, or -1: the first node of layer il is its
// attention norm ("attn_norm-<il>" in llama.cpp's graphs), and the output
// head's is "result_norm", after the last layer.
static int32_t starts_layer(const dragon_stream *s, const char *name) {
    static const char prefix[] = "attn_norm-";
    if (strncmp(name, prefix, sizeof prefix - 1) == 0) {
        char *end;
        long il = strtol(name + sizeof prefix - 1, &end, 10);
        if (*end == '\0' && il >= 0 && il < s->n_layers) {
            return (int32_t)il;
        }
        return -1;
    }
    return strcmp(name, "result_norm") == 0 ? s->n_layers : -1;
}

bool dragon_stream_eval(struct ggml_tensor *t, bool ask, void *data) {
    dragon_stream *s = data;
    int32_t l = starts_layer(s, t->name);
    if (ask || l < 0) {
        return l >= 0;
    }
    // Layer l is about to run: its reads are queued, and it waits for
    // them. Not the next layer's too, while this one runs: pages read into
    // the cache and not yet mapped are the first the budget's reclaim
    // takes, and with a layer read ahead, token trees and a draft model
    // (less room) had each pass read its layers about twice (bench lever,
    // docs/BENCHMARKS.md). Every graph (a pass, or one ubatch of a long
    // prefill) starts at layer 0 and reads the layers anew.
    pthread_mutex_lock(&s->mu);
    if (l == 0) {
        reset_locked(s);
    }
    queue_locked(s, l);
    while (s->pending[l] > 0 && s->queued > l) {
        pthread_cond_wait(&s->done, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return true;
}

int64_t dragon_stream_read_bytes(dragon_stream *s) {
    pthread_mutex_lock(&s->mu);
    int64_t n = s->read_bytes;
    pthread_mutex_unlock(&s->mu);
    return n;
}
