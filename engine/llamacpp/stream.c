// O_DIRECT, pread, strdup and posix_memalign
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "stream.h"

// Direct reads must start, end and land on the device's block size; 4 KiB
// covers the usual ones. Chunks are what one reader reads at a time.
#define DRAGON_ALIGN 4096
#define DRAGON_CHUNK_BYTES (2 << 20)

typedef struct {
    int32_t layer;
    int64_t off, len; // the file's bytes (aligned, for a layer's buffer)
    int64_t pos;      // where in the layer's buffer
    int64_t useful;   // the tensors' bytes among them
} dragon_chunk;

// A streamed tensor: pos is where its data lies in its layer's buffer.
typedef struct {
    char *name;
    int32_t layer;
    int64_t pos;
} dragon_weight;

// A graph's leaf seen by the eval callback: w is its streamed tensor (-1:
// not one), orig the data pointer the model gave it (into the mapping).
typedef struct {
    struct ggml_tensor *t;
    int32_t w;
    void *orig;
    bool redirected;
} dragon_seen;

typedef struct {
    int32_t chunk;
    int32_t slot;
    uint32_t gen; // the slot's generation when queued: older is dropped
} dragon_job;

struct dragon_stream {
    int fd;        // O_DIRECT when the file system allows it
    int fd_cached; // through the page cache, where O_DIRECT is refused
    bool direct;
    int64_t file_size;
    int32_t n_layers;

    // chunks[first[l] .. first[l+1]) read layer l.
    dragon_chunk *chunks;
    int32_t *first;
    // rank[l] is layer l's place among the layers with chunks (-1: none);
    // its buffer is rank % 2.
    int32_t *rank;
    dragon_weight *weights;
    int32_t n_weights;
    int32_t *wfirst; // weights[wfirst[l] .. wfirst[l+1]) are layer l's
    dragon_seen *seen;
    int32_t seen_cap;

    char *slot[2];
    int64_t slot_bytes;
    // Per slot: the layer it holds or is reading, its chunks not yet
    // read, readers inside a read into it, whether a read failed, and its
    // generation (bumped when it is given another layer, so that chunks
    // queued for the last one are dropped).
    int32_t slot_layer[2];
    int32_t slot_pending[2];
    int32_t slot_busy[2];
    bool slot_failed[2];
    uint32_t slot_gen[2];

    pthread_mutex_t mu;
    pthread_cond_t work, done;
    dragon_job *jobs; // a ring of capacity jobs_cap
    int32_t jobs_cap, jobs_head, jobs_len;
    int quit;
    int32_t n_threads;
    pthread_t *threads;
    int64_t read_bytes;
    int64_t pointed; // weights a node ran from a buffer, under mu
};

// Passes of contexts of a streamed model run one at a time: while one
// runs, its weights point into its buffers.
static pthread_mutex_t dragon_pass_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t align_down(int64_t x) { return x & ~(int64_t)(DRAGON_ALIGN - 1); }
static int64_t align_up(int64_t x) { return align_down(x + DRAGON_ALIGN - 1); }

// read_chunk reads ch into to. It succeeds when every byte up to the
// file's end was read.
static bool read_chunk(dragon_stream *s, const dragon_chunk *ch, char *to) {
    int fd = s->direct ? s->fd : s->fd_cached;
    int64_t want = ch->off + ch->len > s->file_size ? s->file_size - ch->off : ch->len;
    int64_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, to + got, (size_t)(ch->len - got), (off_t)(ch->off + got));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno == EINVAL && fd == s->fd) {
            fd = s->fd_cached; // this file system refuses direct reads here
            continue;
        }
        if (n <= 0) {
            return false;
        }
        got += n;
    }
    return true;
}

static void *dragon_stream_reader(void *arg) {
    dragon_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && s->jobs_len == 0) {
            pthread_cond_wait(&s->work, &s->mu);
        }
        if (s->quit) {
            break;
        }
        dragon_job j = s->jobs[s->jobs_head];
        s->jobs_head = (s->jobs_head + 1) % s->jobs_cap;
        s->jobs_len--;
        if (j.gen != s->slot_gen[j.slot]) {
            continue; // queued for what the slot no longer reads
        }
        const dragon_chunk *ch = &s->chunks[j.chunk];
        s->slot_busy[j.slot]++;
        pthread_mutex_unlock(&s->mu);
        bool ok = read_chunk(s, ch, s->slot[j.slot] + ch->pos);
        pthread_mutex_lock(&s->mu);
        s->slot_busy[j.slot]--;
        if (j.gen == s->slot_gen[j.slot]) {
            s->slot_pending[j.slot]--;
            s->slot_failed[j.slot] |= !ok;
            if (ok) {
                s->read_bytes += ch->useful;
            }
        }
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// layer_of parses "blk.<n>." at the start of a tensor's name (-1: none).
static int32_t layer_of(const char *name, int32_t n_layers) {
    if (strncmp(name, "blk.", 4) != 0) {
        return -1;
    }
    char *end;
    long l = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && l >= 0 && l < n_layers ? (int32_t)l : -1;
}

// plan lays out the buffers: each layer's tensors merged into aligned
// spans (tensors that share a block share a span), placed one after the
// other in the layer's buffer and cut into chunks. Returns false on bad
// input.
static bool plan(dragon_stream *s, int32_t n, const int32_t *layer, const char *const *name, const int64_t *off,
                 const int64_t *len) {
    int64_t n_chunks = 0;
    for (int32_t i = 0; i < n; i++) {
        if (layer[i] < 0 || layer[i] >= s->n_layers || (i > 0 && layer[i] < layer[i - 1]) || off[i] < 0 || len[i] <= 0 ||
            name[i] == NULL || layer_of(name[i], s->n_layers) != layer[i]) {
            return false;
        }
        // Each span may add an aligned block at either end.
        n_chunks += (len[i] + 2 * DRAGON_ALIGN) / DRAGON_CHUNK_BYTES + 2;
    }
    s->chunks = calloc((size_t)n_chunks, sizeof(dragon_chunk));
    s->first = calloc((size_t)s->n_layers + 1, sizeof(int32_t));
    s->rank = calloc((size_t)s->n_layers, sizeof(int32_t));
    s->wfirst = calloc((size_t)s->n_layers + 1, sizeof(int32_t));
    s->weights = calloc((size_t)n, sizeof(dragon_weight));
    if (s->chunks == NULL || s->first == NULL || s->rank == NULL || s->wfirst == NULL || s->weights == NULL) {
        return false;
    }
    int32_t k = 0, ranked = 0;
    for (int32_t l = 0, i = 0; l < s->n_layers; l++) {
        s->first[l] = k;
        s->wfirst[l] = s->n_weights;
        int64_t pos = 0; // the layer's buffer so far
        while (i < n && layer[i] == l) {
            // A span: tensors whose aligned ranges touch.
            int64_t a = align_down(off[i]);
            int64_t b = off[i] + len[i];
            int32_t j = i;
            for (; j < n && layer[j] == l && align_down(off[j]) <= b; j++) {
                if (off[j] < a) {
                    return false; // not in file order within the layer
                }
                if (off[j] + len[j] > b) {
                    b = off[j] + len[j];
                }
                s->weights[s->n_weights++] = (dragon_weight){.name = strdup(name[j]), .layer = l, .pos = pos + off[j] - a};
                if (s->weights[s->n_weights - 1].name == NULL) {
                    return false;
                }
            }
            int64_t end = align_up(b);
            for (int64_t o = a; o < end; o += DRAGON_CHUNK_BYTES) {
                int64_t clen = end - o < DRAGON_CHUNK_BYTES ? end - o : DRAGON_CHUNK_BYTES;
                int64_t useful = 0;
                for (int32_t t = i; t < j; t++) {
                    int64_t lo = off[t] > o ? off[t] : o;
                    int64_t hi = off[t] + len[t] < o + clen ? off[t] + len[t] : o + clen;
                    useful += hi > lo ? hi - lo : 0;
                }
                s->chunks[k++] = (dragon_chunk){.layer = l, .off = o, .len = clen, .pos = pos + o - a, .useful = useful};
            }
            pos += end - a;
            i = j;
        }
        s->rank[l] = -1;
        if (k > s->first[l]) {
            s->rank[l] = ranked++;
            if (pos > s->slot_bytes) {
                s->slot_bytes = pos;
            }
        }
    }
    s->first[s->n_layers] = k;
    s->wfirst[s->n_layers] = s->n_weights;
    s->jobs_cap = k + 1;
    s->jobs = calloc((size_t)s->jobs_cap, sizeof(dragon_job));
    // A graph has a few hundred of them to look up, each once a node.
    s->seen_cap = 64;
    while (s->seen_cap < 4 * (s->n_weights + 16)) {
        s->seen_cap *= 2;
    }
    s->seen = calloc((size_t)s->seen_cap, sizeof(dragon_seen));
    return s->jobs != NULL && s->seen != NULL;
}

dragon_stream *dragon_stream_new(const char *path, int32_t n_layers, int32_t n, const int32_t *layer,
                                 const char *const *name, const int64_t *off, const int64_t *len,
                                 int32_t n_threads) {
    if (n_layers <= 0 || n_threads <= 0 || n <= 0) {
        return NULL;
    }
    dragon_stream *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return NULL;
    }
    s->n_layers = n_layers;
    s->fd = -1;
    s->fd_cached = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (s->fd_cached < 0 || fstat(s->fd_cached, &st) != 0 || !plan(s, n, layer, name, off, len)) {
        dragon_stream_free(s);
        return NULL;
    }
    s->file_size = st.st_size;
    // Exact reads: the chunks are already large, and the fd's own
    // readahead would read past them into pages the budget has no room
    // for.
    posix_fadvise(s->fd_cached, 0, 0, POSIX_FADV_RANDOM);
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    s->direct = s->fd >= 0;
    for (int i = 0; i < 2 && s->slot_bytes > 0; i++) {
        void *p = NULL;
        if (posix_memalign(&p, DRAGON_ALIGN, (size_t)s->slot_bytes) != 0) {
            dragon_stream_free(s);
            return NULL;
        }
        // Charged to the process now, not in the middle of a pass.
        memset(p, 0, (size_t)s->slot_bytes);
        s->slot[i] = p;
    }
    s->slot_layer[0] = s->slot_layer[1] = -1;
    s->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (s->threads == NULL) {
        dragon_stream_free(s);
        return NULL;
    }
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
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->done);
        pthread_mutex_destroy(&s->mu);
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
    if (s->fd_cached >= 0) {
        close(s->fd_cached);
    }
    for (int32_t i = 0; i < s->n_weights; i++) {
        free(s->weights[i].name);
    }
    free(s->slot[0]);
    free(s->slot[1]);
    free(s->chunks);
    free(s->first);
    free(s->rank);
    free(s->wfirst);
    free(s->weights);
    free(s->seen);
    free(s->jobs);
    free(s->threads);
    free(s);
}

// give_locked has slot read layer l's chunks (what it was reading before
// is dropped, and the reads in flight into it finish first).
static void give_locked(dragon_stream *s, int32_t slot, int32_t l) {
    s->slot_gen[slot]++;
    while (s->slot_busy[slot] > 0) {
        pthread_cond_wait(&s->done, &s->mu);
    }
    s->slot_layer[slot] = l;
    s->slot_pending[slot] = s->first[l + 1] - s->first[l];
    s->slot_failed[slot] = false;
    if (s->jobs_len + s->slot_pending[slot] > s->jobs_cap) {
        // Jobs dropped by a slot given another layer before the readers
        // reached them (after an aborted pass) make room: what is live
        // is at most one layer a slot, and the ring holds every chunk.
        int32_t kept = 0;
        for (int32_t i = 0; i < s->jobs_len; i++) {
            dragon_job j = s->jobs[(s->jobs_head + i) % s->jobs_cap];
            if (j.gen == s->slot_gen[j.slot]) {
                s->jobs[(s->jobs_head + kept++) % s->jobs_cap] = j;
            }
        }
        s->jobs_len = kept;
    }
    for (int32_t c = s->first[l]; c < s->first[l + 1]; c++) {
        s->jobs[(s->jobs_head + s->jobs_len) % s->jobs_cap] = (dragon_job){.chunk = c, .slot = slot, .gen = s->slot_gen[slot]};
        s->jobs_len++;
    }
    pthread_cond_broadcast(&s->work);
}

// ensure_locked has layer l (one with chunks) in its buffer or on its way
// there; a failed read is tried again.
static void ensure_locked(dragon_stream *s, int32_t l) {
    int32_t slot = s->rank[l] % 2;
    if (s->slot_layer[slot] != l || s->slot_failed[slot]) {
        give_locked(s, slot, l);
    }
}

// ready_locked reports whether layer l's buffer holds it whole.
static bool ready_locked(const dragon_stream *s, int32_t l) {
    int32_t slot = s->rank[l] % 2;
    return s->slot_layer[slot] == l && s->slot_pending[slot] == 0 && !s->slot_failed[slot];
}

// next_streamed is the first layer after l with chunks (-1: none).
static int32_t next_streamed(const dragon_stream *s, int32_t l) {
    for (int32_t n = l + 1; n < s->n_layers; n++) {
        if (s->rank[n] >= 0) {
            return n;
        }
    }
    return -1;
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

// seen_of finds (or adds) a leaf's entry; NULL when the table is full (the
// leaf then stays on the mapping).
static dragon_seen *seen_of(dragon_stream *s, struct ggml_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < s->seen_cap; i++) {
        dragon_seen *e = &s->seen[(h + (uint64_t)i) & (uint64_t)(s->seen_cap - 1)];
        if (e->t == t) {
            return e;
        }
        if (e->t == NULL) {
            e->t = t;
            e->w = -1;
            // Only a weight the model maps from the file as it lies there
            // (not one repacked into another layout) can be read into a
            // buffer from the file.
            int32_t l = layer_of(t->name, s->n_layers);
            if (t->buffer == NULL || t->extra != NULL || ggml_backend_buffer_get_usage(t->buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS ||
                strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(t->buffer)), "CPU_Mapped") != 0) {
                l = -1;
            }
            for (int32_t w = l >= 0 ? s->wfirst[l] : 0; l >= 0 && w < s->wfirst[l + 1]; w++) {
                if (strcmp(s->weights[w].name, t->name) == 0) {
                    e->w = w;
                }
            }
            return e;
        }
    }
    return NULL;
}

// point sets a streamed weight's data: into its buffer when its layer is
// read whole, else the model's mapping (a weight of a layer still being
// read, or whose read failed, is read by the pass's page faults there).
static void point(dragon_stream *s, struct ggml_tensor *t) {
    if (t == NULL || t->op != GGML_OP_NONE || strncmp(t->name, "blk.", 4) != 0) {
        return;
    }
    dragon_seen *e = seen_of(s, t);
    if (e == NULL || e->w < 0) {
        return;
    }
    if (!e->redirected) {
        e->orig = t->data;
    }
    const dragon_weight *w = &s->weights[e->w];
    pthread_mutex_lock(&s->mu);
    bool ready = ready_locked(s, w->layer);
    s->pointed += ready;
    pthread_mutex_unlock(&s->mu);
    t->data = ready ? s->slot[s->rank[w->layer] % 2] + w->pos : e->orig;
    e->redirected = ready;
}

bool dragon_stream_eval(struct ggml_tensor *t, bool ask, void *data) {
    dragon_stream *s = data;
    int32_t l = starts_layer(s, t->name);
    if (ask) {
        // Asked of every node, in order, before the part of the graph
        // that holds it is computed.
        for (int i = 0; i < GGML_MAX_SRC; i++) {
            point(s, t->src[i]);
        }
        return l >= 0;
    }
    if (l < 0) {
        return true;
    }
    pthread_mutex_lock(&s->mu);
    if (l < s->n_layers) {
        // Layer l is about to run: it is read (most often it already is:
        // it was queued when the layer before it started), the next
        // layer is queued into the other buffer, which the layer before
        // this one has finished with, and l waits for its reads.
        int32_t n = next_streamed(s, l);
        if (s->rank[l] >= 0) {
            ensure_locked(s, l);
        }
        if (n >= 0) {
            ensure_locked(s, n);
        }
        int32_t slot = s->rank[l] >= 0 ? s->rank[l] % 2 : -1;
        while (slot >= 0 && s->slot_layer[slot] == l && s->slot_pending[slot] > 0) {
            pthread_cond_wait(&s->done, &s->mu);
        }
    } else {
        // The output head: every layer has run, so both buffers are free,
        // and the next graph's first two layers are read while the head
        // runs and the caller drafts (every graph runs the layers again).
        int32_t a = next_streamed(s, -1);
        int32_t b = a >= 0 ? next_streamed(s, a) : -1;
        if (a >= 0) {
            ensure_locked(s, a);
        }
        if (b >= 0) {
            ensure_locked(s, b);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return true;
}

void dragon_stream_pass_begin(dragon_stream *s) {
    (void)s;
    pthread_mutex_lock(&dragon_pass_mu);
}

void dragon_stream_pass_end(dragon_stream *s) {
    for (int32_t i = 0; s != NULL && i < s->seen_cap; i++) {
        dragon_seen *e = &s->seen[i];
        if (e->t != NULL && e->redirected) {
            e->t->data = e->orig;
            e->redirected = false;
        }
    }
    pthread_mutex_unlock(&dragon_pass_mu);
}

int64_t dragon_stream_read_bytes(dragon_stream *s) {
    pthread_mutex_lock(&s->mu);
    int64_t n = s->read_bytes;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int64_t dragon_stream_pointed(dragon_stream *s) {
    pthread_mutex_lock(&s->mu);
    int64_t n = s->pointed;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int64_t dragon_stream_buffer_bytes(dragon_stream *s) { return 2 * s->slot_bytes; }
