#include "vecmath.h"

#include <math.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

// Entries this many nats below the maximum weigh under 1e-13 relative to
// it: below float32 resolution of a distribution, so they are zero.
#define NEGLIGIBLE_NATS 30.0f

// e^x for -NEGLIGIBLE_NATS < x <= 0: 2^(x·log2 e) as an integer power built in
// the exponent bits times e^g, |g| <= ln2/2, from a degree-6 Taylor
// polynomial (tail below 2e-7). The vector version below computes the same.
static inline float exp_neg(float x) {
    float t = x * 1.44269504088896341f;
    float n = nearbyintf(t);
    float g = (t - n) * 0.693147180559945309f;
    float p = 1.0f + g * (1.0f + g * (0.5f + g * (0.166666667f + g * (0.0416666667f + g * (0.00833333333f + g * 0.00138888889f)))));
    union { float f; int i; } s = { .i = ((int)n + 127) << 23 };
    return p * s.f;
}

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 exp_neg8(__m256 x) {
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 g = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));
    __m256 p = _mm256_set1_ps(0.00138888889f);
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(0.00833333333f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(0.0416666667f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(0.166666667f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    // Flush negligible entries (and keep the exponent trick in range).
    return _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(-NEGLIGIBLE_NATS), _CMP_GT_OQ));
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

static inline float exp_or_zero(float x) {
    return x > -NEGLIGIBLE_NATS ? exp_neg(x) : 0.0f;
}

// log_partition sets *maxv to the largest logit and returns Σ exp(logit - *maxv)
// (negligible entries flushed to zero), or NaN when a logit is NaN.
static double log_partition(const float *logits, size_t n, float *maxv_out) {
    size_t i = 0;
    float maxv = logits[0];
#if defined(__AVX2__) && defined(__FMA__)
    __m256 vmax = _mm256_set1_ps(logits[0]);
    for (; i + 8 <= n; i += 8) {
        vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(logits + i));
    }
    maxv = hmax8(vmax);
#endif
    for (; i < n; i++) {
        maxv = logits[i] > maxv ? logits[i] : maxv;
    }

    // Summed in float32 lanes over short blocks, the blocks in float64:
    // a float32 running sum over a 49k vocabulary drifts by 1e-4.
    double sum = 0.0;
    i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 vm = _mm256_set1_ps(maxv);
    __m256 nan = _mm256_setzero_ps();
    __m256d total = _mm256_setzero_pd();
    while (i + 16 <= n) {
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        size_t end = i + 512 < n ? i + 512 : n;
        for (; i + 16 <= end; i += 16) {
            __m256 a = _mm256_loadu_ps(logits + i), b = _mm256_loadu_ps(logits + i + 8);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
            s0 = _mm256_add_ps(s0, exp_neg8(_mm256_sub_ps(a, vm)));
            s1 = _mm256_add_ps(s1, exp_neg8(_mm256_sub_ps(b, vm)));
        }
        __m256 s = _mm256_add_ps(s0, s1);
        total = _mm256_add_pd(total, _mm256_cvtps_pd(_mm256_castps256_ps128(s)));
        total = _mm256_add_pd(total, _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1)));
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(logits + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        __m256 e = exp_neg8(_mm256_sub_ps(a, vm));
        total = _mm256_add_pd(total, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        total = _mm256_add_pd(total, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, total);
    sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    if (!_mm256_testz_ps(nan, nan)) {
        return NAN;
    }
#endif
    for (; i < n; i++) {
        if (isnan(logits[i])) {
            return NAN;
        }
        sum += exp_or_zero(logits[i] - maxv);
    }
    *maxv_out = maxv;
    return sum;
}

double dragon_log_sum_exp(const float *logits, size_t n) {
    float maxv;
    double sum = log_partition(logits, n, &maxv);
    if (isnan(sum) || !isfinite(maxv) || !(sum > 0.0) || !isfinite(sum)) {
        return NAN;
    }
    return (double)maxv + log(sum);
}

double dragon_softmax_mix(float *acc, const float *logits, size_t n, float w) {
    float maxv;
    double sum = log_partition(logits, n, &maxv);
    // A NaN or +Inf logit, or a row of -Inf: no distribution. acc is left
    // untouched.
    if (isnan(sum) || !isfinite(maxv) || !(sum > 0.0) || !isfinite(sum)) {
        return NAN;
    }

    // The exponentials are computed again rather than stored by
    // log_partition: recomputing costs less than a vocabulary-sized store
    // and reload.
    const float scale = (float)(w / sum);
    size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 vm = _mm256_set1_ps(maxv);
    const __m256 vs = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vm));
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vs, e, _mm256_loadu_ps(acc + i)));
    }
#endif
    for (; i < n; i++) {
        acc[i] += scale * exp_or_zero(logits[i] - maxv);
    }
    return (double)maxv + log(sum);
}
