#ifndef DRAGON_VECMATH_H
#define DRAGON_VECMATH_H

#include <stddef.h>

// Adds w·softmax(logits[0:n]) into acc[0:n] and returns log Σ exp(logits),
// or NaN, leaving acc untouched, when the logits hold a NaN or +Inf or are
// all -Inf.
double dragon_softmax_mix(float *acc, const float *logits, size_t n, float w);

// Returns log Σ exp(logits[0:n]), the same value dragon_softmax_mix returns,
// or NaN when the logits hold a NaN or +Inf or are all -Inf.
double dragon_log_sum_exp(const float *logits, size_t n);

#endif
