/* PNG scanlines back to pixels (multimodal/png_decode.py): the row filters of an 8-bit RGB or
   RGBA image undone, the pixels written as RGB. The inflate before it is libdeflate's. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A Paeth row a pixel at a time, its channels in the 16-bit lanes of one SSE register: the
   predictor's choice by compares and blends (photographs pick left, up or up-left at random,
   which a branch mispredicts), the chain from one pixel to the next a few instructions long. */
static void paeth_row(const uint8_t *src, const uint8_t *up, uint8_t *row, int64_t stride,
                      int bpp) {
    const __m128i zero = _mm_setzero_si128(), low_byte = _mm_set1_epi16(0xFF);
    __m128i left = zero, up_left = zero;        /* zeros before a row's first pixel */
    for (int64_t i = 0; i < stride; i += bpp) {
        /* 4-byte loads and stores, an RGB pixel's fourth lane unused (its store is overwritten
           by the next pixel's); a row's last RGB pixel moves its 3 bytes alone */
        int whole = i + 4 <= stride;
        uint32_t above = 0, filtered = 0, out;
        if (whole) {
            memcpy(&above, up + i, 4);
            memcpy(&filtered, src + i, 4);
        } else {
            memcpy(&above, up + i, 3);
            memcpy(&filtered, src + i, 3);
        }
        __m128i b = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)above), zero);
        __m128i x = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)filtered), zero);
        __m128i b_c = _mm_sub_epi16(b, up_left), a_c = _mm_sub_epi16(left, up_left);
        __m128i pa = _mm_abs_epi16(b_c), pb = _mm_abs_epi16(a_c);
        __m128i pc = _mm_abs_epi16(_mm_add_epi16(b_c, a_c));
        __m128i smallest = _mm_min_epi16(pc, _mm_min_epi16(pa, pb));
        /* left where pa is smallest, else up where pb is, else up-left: the spec's tie order */
        __m128i pred = _mm_blendv_epi8(up_left, b, _mm_cmpeq_epi16(smallest, pb));
        pred = _mm_blendv_epi8(pred, left, _mm_cmpeq_epi16(smallest, pa));
        left = _mm_and_si128(_mm_add_epi16(x, pred), low_byte);
        out = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(left, left));
        if (whole)
            memcpy(row + i, &out, 4);
        else
            memcpy(row + i, &out, 3);
        up_left = b;
    }
}

/* One row's bytes from its filtered bytes and the row above (zeros above the first). */
static int unfilter_row(int filter, const uint8_t *src, const uint8_t *up, uint8_t *row,
                        int64_t stride, int bpp) {
    switch (filter) {
    case 0:
        memcpy(row, src, stride);
        return 0;
    case 1:
        for (int64_t i = 0; i < stride; i++) row[i] = src[i] + (i >= bpp ? row[i - bpp] : 0);
        return 0;
    case 2:
        for (int64_t i = 0; i < stride; i++) row[i] = src[i] + up[i];
        return 0;
    case 3:
        for (int64_t i = 0; i < stride; i++)
            row[i] = src[i] + (((i >= bpp ? row[i - bpp] : 0) + up[i]) >> 1);
        return 0;
    case 4:
        paeth_row(src, up, row, stride, bpp);
        return 0;
    default:
        return -1;
    }
}

/* data: height rows of a filter byte and width * bpp bytes (bpp 3: RGB, 4: RGBA). Writes
   height * width * 3 RGB bytes to out; rows: 2 * width * bpp bytes of scratch. Returns the
   smallest alpha (255 for RGB), or -1 at a filter type PNG does not define. */
int png_unfilter_rgb(const uint8_t *data, int64_t height, int64_t width, int bpp, uint8_t *out,
                     uint8_t *rows) {
    int64_t stride = width * bpp;
    uint8_t *up = rows, *row = rows + stride;
    memset(up, 0, stride);
    int min_alpha = 255;
    for (int64_t y = 0; y < height; y++) {
        const uint8_t *src = data + y * (stride + 1);
        uint8_t *dst = out + y * width * 3;
        if (bpp == 3) {         /* straight into the output row */
            if (unfilter_row(src[0], src + 1, y ? dst - stride : up, dst, stride, 3)) return -1;
            continue;
        }
        if (unfilter_row(src[0], src + 1, up, row, stride, 4)) return -1;
        for (int64_t x = 0; x < width; x++) {
            dst[3 * x] = row[4 * x];
            dst[3 * x + 1] = row[4 * x + 1];
            dst[3 * x + 2] = row[4 * x + 2];
            min_alpha = row[4 * x + 3] < min_alpha ? row[4 * x + 3] : min_alpha;
        }
        uint8_t *t = up;
        up = row;
        row = t;
    }
    return min_alpha;
}
