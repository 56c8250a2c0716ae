// clock_gettime and sched_yield under -std=c11
#define _POSIX_C_SOURCE 200112L

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"
#include "_cgo_export.h"

struct dragon_ctx {
    struct llama_context *ctx;
    struct llama_batch batch;
    int32_t batch_cap;
    int32_t seq_cap;
    atomic_int abort;
    bool yield;
    int64_t last_yield_ns;
    int64_t last_decode_ns;

    // The decode worker: passes run on a thread of their own, and Go waits
    // on done (an eventfd) through its netpoller, not in a cgo call. A cgo
    // call of 20 ms looks like a blocking syscall to Go's sysmon, which
    // then polls every 20 us on the daemon's one core (2-3% of its time).
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending; // a batch waits for the worker
    bool quit;
    int done;     // eventfd, written once per finished pass (Go owns it)
    atomic_int result;
    dragon_stream *stream; // reads a streamed model's layers into its buffers; owned
    bool turns;            // passes take turns with other streamed contexts'
};

// How often a one-thread pass yields its core: a message that arrives
// mid-pass is read within this, not within a scheduler slice (milliseconds).
// Yielding at every graph node cost 3-11% of a one-row pass; this costs a
// clock read per node and a syscall per interval.
#define DRAGON_YIELD_NS 250000

static int64_t dragon_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static bool dragon_abort_cb(void *data) {
    dragon_ctx *c = data;
    // With one compute thread the daemon shares its core with its own
    // network goroutines (ggml calls this on that thread, between nodes).
    if (c->yield) {
        int64_t now = dragon_now_ns();
        if (now - c->last_yield_ns >= DRAGON_YIELD_NS) {
            sched_yield();
            c->last_yield_ns = now;
        }
    }
    return atomic_load_explicit(&c->abort, memory_order_relaxed) != 0;
}

static void *dragon_worker(void *arg) {
    dragon_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->pending && !c->quit) {
            pthread_cond_wait(&c->cv, &c->mu);
        }
        if (c->quit) {
            break;
        }
        c->pending = false;
        pthread_mutex_unlock(&c->mu);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (c->turns) {
            dragon_stream_pass_begin(c->stream);
        }
        int32_t code = llama_decode(c->ctx, c->batch);
        if (c->turns) {
            dragon_stream_pass_end(c->stream);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        c->last_decode_ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
        atomic_store(&c->result, code);
        uint64_t one = 1;
        while (write(c->done, &one, sizeof one) < 0) {
            // EAGAIN only past 2^64-2 unread passes; EINTR: try again
        }
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

dragon_ctx *dragon_ctx_new(struct llama_model *model, uint32_t n_ctx, uint32_t n_batch,
                           uint32_t n_ubatch, uint32_t n_seq_max, int32_t n_threads, int embeddings,
                           int unified, dragon_stream *stream, int turns) {
    struct llama_context_params p = llama_context_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_ubatch = n_ubatch;
    p.n_seq_max = n_seq_max;
    p.n_threads = n_threads;
    p.n_threads_batch = n_threads;
    p.embeddings = embeddings != 0;
    if (embeddings == 1) {
        p.pooling_type = LLAMA_POOLING_TYPE_NONE;
    }
    p.kv_unified = unified != 0;
    // CPU flash attention accumulates in f16 in the order of the cells and
    // of the prompt's pieces, so a prompt prefilled in two parts, or
    // restored from a saved state, would not continue exactly as one
    // prefilled whole; the plain path does (docs/DESIGN-NOTES.md).
    p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    p.no_perf = true;
    if (stream != NULL) {
        p.cb_eval = dragon_stream_eval;
        p.cb_eval_user_data = stream;
    }

    dragon_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->ctx = llama_init_from_model(model, p);
    if (c->ctx == NULL) {
        free(c);
        return NULL;
    }
    c->done = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->done < 0) {
        llama_free(c->ctx);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->worker, NULL, dragon_worker, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        close(c->done);
        llama_free(c->ctx);
        free(c);
        return NULL;
    }
    c->batch = llama_batch_init((int32_t)n_batch, 0, (int32_t)n_seq_max);
    c->batch_cap = (int32_t)n_batch;
    c->seq_cap = (int32_t)n_seq_max;
    atomic_init(&c->abort, 0);
    c->yield = n_threads == 1;
    llama_set_abort_callback(c->ctx, dragon_abort_cb, c);
    c->stream = stream;
    c->turns = stream != NULL || turns != 0;
    return c;
}

void dragon_ctx_free(dragon_ctx *c) {
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->worker, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    llama_batch_free(c->batch);
    llama_free(c->ctx);
    dragon_stream_free(c->stream);
    free(c);
}

struct llama_context *dragon_ctx_llama(dragon_ctx *c) { return c->ctx; }

// How many contexts have their abort flag raised.
static atomic_int dragon_aborting;

void dragon_abort(dragon_ctx *c, int on) {
    int was = atomic_exchange_explicit(&c->abort, on, memory_order_relaxed);
    if (on && !was) {
        atomic_fetch_add(&dragon_aborting, 1);
    } else if (!on && was) {
        atomic_fetch_sub(&dragon_aborting, 1);
    }
}

// dragon_log drops the lines llama.cpp prints for a decode that an abort
// stopped (a rejection making a pass stale is routine; the caller gets
// engine.ErrAborted, and the pass's cells are removed as it says) and
// passes everything else on.
static void dragon_log(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if ((level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) && atomic_load(&dragon_aborting) > 0 &&
        (strstr(text, "graph_compute_async failed") != NULL || strstr(text, "failed to compute graph") != NULL ||
         strstr(text, "failed to decode, ret = 2") != NULL ||
         strstr(text, "removing memory module entries") != NULL)) {
        return;
    }
    dragonLlamaLog((int)level, (char *)text);
}

void dragon_log_install(void) { llama_log_set(dragon_log, NULL); }

int32_t dragon_decode_start(dragon_ctx *c, int32_t n, const int32_t *tokens, const int32_t *pos,
                            const int32_t *nseq, const int32_t *seqs, const int8_t *logits) {
    if (n <= 0 || n > c->batch_cap) {
        return -100;
    }
    struct llama_batch *b = &c->batch;
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        b->token[i] = tokens[i];
        b->pos[i] = pos[i];
        if (nseq[i] <= 0 || nseq[i] > c->seq_cap) {
            return -101;
        }
        b->n_seq_id[i] = nseq[i];
        for (int32_t j = 0; j < nseq[i]; j++) {
            b->seq_id[i][j] = seqs[k++];
        }
        b->logits[i] = logits[i];
    }
    b->n_tokens = n;
    pthread_mutex_lock(&c->mu);
    c->pending = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int dragon_decode_done_fd(dragon_ctx *c) { return c->done; }

int32_t dragon_decode_result(dragon_ctx *c) { return atomic_load(&c->result); }

int64_t dragon_last_decode_ns(dragon_ctx *c) { return c->last_decode_ns; }

#define DRAGON_STR(x) #x
#define DRAGON_XSTR(x) DRAGON_STR(x)
const char *dragon_llama_build(void) {
#ifdef DRAGON_LLAMA_BUILD
    return DRAGON_XSTR(DRAGON_LLAMA_BUILD);
#else
    return "unknown";
#endif
}

static bool dragon_quiet_progress(float progress, void *data) {
    (void)progress;
    (void)data;
    return true;
}

struct llama_model *dragon_model_load(const char *path, int repack) {
    struct llama_model_params p = llama_model_default_params();
    p.use_extra_bufts = repack != 0;
    p.load_mode = LLAMA_LOAD_MODE_MMAP;
    p.n_gpu_layers = 0;
    p.progress_callback = dragon_quiet_progress;  // no dots on stderr
    return llama_model_load_from_file(path, p);
}
