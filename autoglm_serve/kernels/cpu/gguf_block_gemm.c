/* y[M, N] = x[M, K] @ W^T in float32, W [N, K] held in GGUF's own Q4_1 or Q8_0 blocks of 32.
 *
 * Built at first use by kernels/cpu/build.py (gcc -O3 -mavx2 -mfma -fopenmp
 * -ffp-contract=off). Two promises the engine relies on:
 *  - A weight is dequantized as the GGUF reader does it (d * q, then + m: two roundings, no
 *    FMA), so the products are those of the float32 weights the model loaded.
 *  - Every y[r, n] is summed in one order whatever M is and however rows are blocked: eight
 *    lanes of FMAs along k, ascending, then one fixed horizontal sum. A row's bits therefore do
 *    not depend on the rows beside it, and the few-row path (dequantize on the fly) and the
 *    many-row path (dequantize a tile, then reuse it across rows) give the same bits.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "horizontal_sum.h"

#define GROUP 32
/* Blocks as the loader repacks them (their scales widened from GGUF's fp16 to float32, which
 * is exact and saves a conversion per block). Q4_1: float d, float m, 16 bytes whose byte j
 * holds element j in its low nibble and element j + 16 in its high one (GGUF's order). Q8_0:
 * float d, 32 int8. */
#define Q4_1_BLOCK 24
#define Q8_0_BLOCK 36
#define FEW_ROWS 4    /* up to this many rows: dequantize each group once, in registers */
#define TILE_COLS 12  /* many rows: this many weight rows dequantized into a tile at a time */

enum { Q4_1 = 0, Q8_0 = 1 };

/* Elements 8v..8v+7 of a block whose scale is d (and offset m, Q4_1), as the GGUF reader rounds
 * them. */
static inline __attribute__((always_inline)) __m256 dequantize_part(
        const int format, const uint8_t *block, int v, __m256 d, __m256 m) {
    if (format == Q4_1) {
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)(block + 8 + 8 * (v & 1)));
        __m256i q = _mm256_cvtepu8_epi32(bytes);
        q = v < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(q, 4);
        return _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m);
    }
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)(block + 4 + 8 * v));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
}

static inline __attribute__((always_inline)) __m256 block_scale(const uint8_t *block) {
    return _mm256_broadcast_ss((const float *)block);
}

static inline __attribute__((always_inline)) __m256 block_offset(const int format,
                                                                 const uint8_t *block) {
    return format == Q4_1 ? _mm256_broadcast_ss((const float *)(block + 4)) : _mm256_setzero_ps();
}

/* ROWS rows of x against COLS weight rows from n, dequantized on the fly: ROWS * COLS
 * independent FMA chains keep the FMA units busy where one row has nothing else to overlap. */
static inline __attribute__((always_inline)) void few_rows(
        const int format, int rows, int cols, const float *x, int64_t k, const uint8_t *w,
        int64_t row_bytes, int block_bytes, float *y, int64_t n_total, int64_t n) {
    __m256 acc[FEW_ROWS][4];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / GROUP; g++) {
        const uint8_t *block[4];
        __m256 d[4], m[4];
        for (int c = 0; c < cols; c++) {
            block[c] = w + (n + c) * row_bytes + g * block_bytes;
            d[c] = block_scale(block[c]);
            m[c] = block_offset(format, block[c]);
        }
        for (int v = 0; v < 4; v++) {
            __m256 xv[FEW_ROWS];
            for (int r = 0; r < rows; r++) xv[r] = _mm256_loadu_ps(x + r * k + g * GROUP + 8 * v);
            for (int c = 0; c < cols; c++) {
                const __m256 wv = dequantize_part(format, block[c], v, d[c], m[c]);
                for (int r = 0; r < rows; r++) acc[r][c] = _mm256_fmadd_ps(wv, xv[r], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[r * n_total + n + c] = horizontal_sum(acc[r][c]);
}

/* Up to four rows of x against up to three dequantized weight rows of the tile. */
static inline __attribute__((always_inline)) void tile_kernel(
        int rows, int cols, const float *x, int64_t k, const float *tile, float *y,
        int64_t n_total, int64_t n) {
    __m256 acc[FEW_ROWS][3];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8) {
        __m256 w[3];
        for (int c = 0; c < cols; c++) w[c] = _mm256_loadu_ps(tile + c * k + i);
        for (int r = 0; r < rows; r++) {
            const __m256 xv = _mm256_loadu_ps(x + r * k + i);
            for (int c = 0; c < cols; c++) acc[r][c] = _mm256_fmadd_ps(w[c], xv, acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[r * n_total + n + c] = horizontal_sum(acc[r][c]);
}

#define DISPATCH_ROWS(rows, call) \
    switch (rows) { case 1: call(1); break; case 2: call(2); break; \
                    case 3: call(3); break; default: call(4); }

/* Columns n.. (up to `step`) against all m <= FEW_ROWS rows; `format` a constant here. */
static inline __attribute__((always_inline)) void few_rows_pass(
        const int format, const float *x, int64_t m, int64_t k, const uint8_t *w,
        int64_t row_bytes, int block_bytes, int64_t n_total, float *y, int64_t n, int cols) {
#define FEW(R, C) few_rows(format, R, C, x, k, w, row_bytes, block_bytes, y, n_total, n)
    switch (m * 8 + cols) {
        case 1 * 8 + 4: FEW(1, 4); break;
        case 2 * 8 + 4: FEW(2, 4); break;
        case 3 * 8 + 2: FEW(3, 2); break;
        case 4 * 8 + 2: FEW(4, 2); break;
        default:
            for (int c = 0; c < cols; c++) {
#define ONE(R) few_rows(format, R, 1, x, k, w, row_bytes, block_bytes, y, n_total, n + c)
                DISPATCH_ROWS(m, ONE)
#undef ONE
            }
    }
#undef FEW
}

static void few_rows_gemm(int format, const float *x, int64_t m, int64_t k, const uint8_t *w,
                          int block_bytes, int64_t n_total, float *y, int threads) {
    const int64_t row_bytes = k / GROUP * block_bytes;
    /* columns a pass: eight FMA chains in all, fewer columns where more rows take registers */
    const int64_t step = m <= 2 ? 4 : 2;
    const int64_t passes = (n_total + step - 1) / step;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < passes; p++) {
        const int64_t n = p * step;
        const int cols = n_total - n < step ? (int)(n_total - n) : (int)step;
        if (format == Q4_1)
            few_rows_pass(Q4_1, x, m, k, w, row_bytes, block_bytes, n_total, y, n, cols);
        else
            few_rows_pass(Q8_0, x, m, k, w, row_bytes, block_bytes, n_total, y, n, cols);
    }
}

/* Weight rows n0..n0+cols-1 as float32 rows of `tile`; `format` a constant here. */
static inline __attribute__((always_inline)) void dequantize_tile(
        const int format, const uint8_t *w, int64_t row_bytes, int block_bytes, int64_t k,
        int64_t n0, int64_t cols, float *tile) {
    for (int64_t c = 0; c < cols; c++)
        for (int64_t g = 0; g < k / GROUP; g++) {
            const uint8_t *block = w + (n0 + c) * row_bytes + g * block_bytes;
            const __m256 d = block_scale(block), m = block_offset(format, block);
            for (int v = 0; v < 4; v++)
                _mm256_storeu_ps(tile + c * k + g * GROUP + 8 * v,
                                 dequantize_part(format, block, v, d, m));
        }
}

static void tiled_gemm(int format, const float *x, int64_t m, int64_t k, const uint8_t *w,
                       int block_bytes, int64_t n_total, float *y, int threads) {
    const int64_t row_bytes = k / GROUP * block_bytes;
    const int64_t tiles = (n_total + TILE_COLS - 1) / TILE_COLS;
#pragma omp parallel num_threads(threads)
    {
        float *tile = aligned_alloc(64, TILE_COLS * k * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t n0 = t * TILE_COLS;
            const int64_t cols = n_total - n0 < TILE_COLS ? n_total - n0 : TILE_COLS;
            if (format == Q4_1)
                dequantize_tile(Q4_1, w, row_bytes, block_bytes, k, n0, cols, tile);
            else
                dequantize_tile(Q8_0, w, row_bytes, block_bytes, k, n0, cols, tile);
            for (int64_t r0 = 0; r0 < m; r0 += FEW_ROWS) {
                const int64_t rows = m - r0 < FEW_ROWS ? m - r0 : FEW_ROWS;
                const float *xr = x + r0 * k;
                float *yr = y + r0 * n_total;
                int64_t c = 0;
                for (; c + 3 <= cols; c += 3) {
#define THREE(R) tile_kernel(R, 3, xr, k, tile + c * k, yr, n_total, n0 + c)
                    DISPATCH_ROWS(rows, THREE)
#undef THREE
                }
                for (; c < cols; c++) {
#define ONE(R) tile_kernel(R, 1, xr, k, tile + c * k, yr, n_total, n0 + c)
                    DISPATCH_ROWS(rows, ONE)
#undef ONE
                }
            }
        }
        free(tile);
    }
}

/* Returns 0, or -1 for a shape this file does not take (K not a multiple of 32). */
int gguf_block_gemm(int format, const float *x, int64_t m, int64_t k, const uint8_t *w,
                    int64_t n, float *y, int threads) {
    if (k % GROUP || (format != Q4_1 && format != Q8_0)) return -1;
    const int block_bytes = format == Q4_1 ? Q4_1_BLOCK : Q8_0_BLOCK;
    if (m == 0) return 0;
    if (m <= FEW_ROWS)
        few_rows_gemm(format, x, m, k, w, block_bytes, n, y, threads);
    else
        tiled_gemm(format, x, m, k, w, block_bytes, n, y, threads);
    return 0;
}
