/* One decode query per head against a run of cached keys and values, float32, GQA.
 *
 * Built at first use by kernels/cpu/build.py. For each KV head the run is
 * [tokens, d] of K and of V, contiguous (the CPU cache is laid out heads first); the `group`
 * query heads that share it are computed together, so each key and value is read once, not once
 * per query head. Work is split into chunks of CHUNK tokens per head, each with its own max,
 * sum and weighted values, merged per head in chunk order: the result does not depend on the
 * thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "horizontal_sum.h"

#define CHUNK 256
#define MAX_GROUP 16
#define MAX_D 256

static inline float horizontal_max(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 (scores less their max), ~2 ulp: x = n ln2 + r, a degree-6 polynomial in r
 * (Cephes' coefficients), scaled by 2^n. */
static inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                     _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i exponent = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

/* One chunk of one KV head: for each of its query heads, the chunk's max score, sum of
 * e^(score - max) and the values weighted by those, into partial[g] = {max, sum, d values}. */
static void attend_chunk(const float *q, const float *k, const float *v, int64_t group,
                         int64_t d, int64_t tokens, float scale, float *partial) {
    float scores[MAX_GROUP][CHUNK] __attribute__((aligned(32)));
    const int64_t padded = (tokens + 7) / 8 * 8;
    for (int64_t t = 0; t < tokens; t++) {
        const float *key = k + t * d;
        for (int64_t g = 0; g < group; g++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t i = 0; i < d; i += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i), _mm256_loadu_ps(key + i), acc);
            scores[g][t] = horizontal_sum(acc) * scale;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *s = scores[g];
        for (int64_t t = tokens; t < padded; t++) s[t] = -INFINITY;
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (int64_t t = 0; t < padded; t += 8) vmax = _mm256_max_ps(vmax, _mm256_load_ps(s + t));
        const float max = horizontal_max(vmax);
        __m256 vsum = _mm256_setzero_ps();
        for (int64_t t = 0; t < padded; t += 8) {
            const __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_load_ps(s + t),
                                                           _mm256_set1_ps(max)));
            _mm256_store_ps(s + t, p);
            vsum = _mm256_add_ps(vsum, p);
        }
        float *out = partial + g * (d + 2);
        out[0] = max;
        out[1] = horizontal_sum(vsum);
        for (int64_t i0 = 0; i0 < d; i0 += 64) {       /* up to 8 independent FMA chains */
            const int lanes = d - i0 < 64 ? (int)(d - i0) / 8 : 8;
            __m256 acc[8];
            for (int j = 0; j < lanes; j++) acc[j] = _mm256_setzero_ps();
            for (int64_t t = 0; t < tokens; t++) {
                const __m256 p = _mm256_set1_ps(s[t]);
                for (int j = 0; j < lanes; j++)
                    acc[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + t * d + i0 + 8 * j), acc[j]);
            }
            for (int j = 0; j < lanes; j++) _mm256_storeu_ps(out + 2 + i0 + 8 * j, acc[j]);
        }
    }
}

/* out [hkv * group, d] and lse [hkv * group] (natural log of the softmax's denominator, with the
 * scale applied, as torch's flash kernel gives it) of q [hkv * group, d] against `tokens` keys
 * and values per KV head h at k + h * head_stride, v + h * head_stride ([tokens, d] each).
 * Returns 0, or -1 for a shape this file does not take. */
int decode_attention(const float *q, const float *k, const float *v, int64_t head_stride,
                     int64_t hkv, int64_t group, int64_t d, int64_t tokens, float scale,
                     float *out, float *lse, int threads) {
    if (d % 8 || d > MAX_D || group > MAX_GROUP || tokens <= 0) return -1;
    const int64_t chunks = (tokens + CHUNK - 1) / CHUNK;
    float *partials = malloc(sizeof(float) * hkv * chunks * group * (d + 2));
    if (!partials) return -1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < hkv * chunks; task++) {
        const int64_t h = task / chunks, c = task % chunks;
        const int64_t first = c * CHUNK;
        const int64_t count = tokens - first < CHUNK ? tokens - first : CHUNK;
        attend_chunk(q + h * group * d, k + h * head_stride + first * d,
                     v + h * head_stride + first * d, group, d, count, scale,
                     partials + task * group * (d + 2));
    }
    for (int64_t h = 0; h < hkv; h++)
        for (int64_t g = 0; g < group; g++) {
            float max = -INFINITY;
            for (int64_t c = 0; c < chunks; c++)
                max = fmaxf(max, partials[((h * chunks + c) * group + g) * (d + 2)]);
            float sum = 0.0f;
            float *o = out + (h * group + g) * d;
            for (int64_t i = 0; i < d; i++) o[i] = 0.0f;
            for (int64_t c = 0; c < chunks; c++) {
                const float *part = partials + ((h * chunks + c) * group + g) * (d + 2);
                const float weight = expf(part[0] - max);
                sum += part[1] * weight;
                for (int64_t i = 0; i < d; i++) o[i] += part[2 + i] * weight;
            }
            for (int64_t i = 0; i < d; i++) o[i] /= sum;
            lse[h * group + g] = max + logf(sum);
        }
    free(partials);
    return 0;
}
