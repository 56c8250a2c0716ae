// cpuprobe measures the two ceilings a quantized matrix kernel runs
// against on this machine: int8 multiply-accumulate throughput per thread
// (AVX2 vpmaddubsw/vpmaddwd on registers, no memory traffic) and streaming
// read bandwidth from DRAM. docs/BENCHMARKS.md compares ggml's kernels
// with them. Build and run: make cpuprobe.
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { MAC_ITERS = 100000000, CHAINS = 8, BUF_BYTES = 256 << 20, READ_PASSES = 4 };

// Eight independent accumulator chains keep the multiply ports busy.
static void *macs(void *out) {
    __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
    __m256i acc[CHAINS];
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_setzero_si256();
    for (long i = 0; i < MAC_ITERS; i++) {
        for (int j = 0; j < CHAINS; j++)
            acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
        a = _mm256_add_epi8(a, b);
    }
    __m256i s = acc[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_epi32(s, acc[i]);
    *(int *)out = _mm256_extract_epi32(s, 0);  // keeps the loop alive
    return NULL;
}

static uint8_t *buf;
static int nthreads;

struct part { int id; long long sum; };

static void *reads(void *arg) {
    struct part *p = arg;
    size_t per = BUF_BYTES / nthreads;
    __m256i s = _mm256_setzero_si256();
    for (int pass = 0; pass < READ_PASSES; pass++)
        for (size_t i = p->id * per; i < (p->id + 1) * per; i += 32)
            s = _mm256_add_epi8(s, _mm256_load_si256((const __m256i *)(buf + i)));
    p->sum = _mm256_extract_epi64(s, 0);
    return NULL;
}

static double run(int n, void *(*fn)(void *), void *args, size_t argsize) {
    pthread_t th[64];
    double t = now();
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fn, (char *)args + i * argsize);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    return now() - t;
}

int main(int argc, char **argv) {
    int maxThreads = argc > 1 ? atoi(argv[1]) : 2;
    if (maxThreads < 1 || maxThreads > 64) {
        fprintf(stderr, "usage: cpuprobe [threads 1..64]\n");
        return 2;
    }
    int sink[64];
    struct part parts[64];
    buf = aligned_alloc(64, BUF_BYTES);
    if (buf == NULL) {
        fprintf(stderr, "cpuprobe: out of memory\n");
        return 1;
    }
    memset(buf, 1, BUF_BYTES);
    for (int n = 1; n <= maxThreads; n++) {
        double dt = run(n, macs, sink, sizeof sink[0]);
        double gmac = (double)MAC_ITERS * CHAINS * 32 / dt / 1e9;  // 32 int8 products per instruction
        nthreads = n;
        for (int i = 0; i < n; i++) parts[i].id = i;
        double rt = run(n, reads, parts, sizeof parts[0]);
        printf("%d thread(s): int8 MAC %.0f GMAC/s per thread, DRAM read %.1f GB/s in all\n",
               n, gmac, (double)BUF_BYTES * READ_PASSES / rt / 1e9);
    }
    free(buf);
    return 0;
}
