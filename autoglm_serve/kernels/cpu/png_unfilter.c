/* PNG scanlines back to pixels (multimodal/png_decode.py): the row filters of an 8-bit RGB or
   RGBA image undone, the pixels written as RGB. The inflate before it is libdeflate's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The Paeth predictor without branches (photographs pick a or b or c at random, which a branch
   mispredicts; with the pixel loop below, 14.9 -> 10.5 ms for a screenshot of 977 Paeth rows). */
static inline int paeth(int a, int b, int c) {
    int pa = abs(b - c), pb = abs(a - c), pc = abs(a + b - 2 * c);
    int b_or_c = pb <= pc ? b : c;
    return pa <= pb && pa <= pc ? a : b_or_c;
}

/* Paeth rows a pixel at a time, BPP a constant: the channels' dependency chains interleave. */
#define PAETH_ROW(BPP)                                                                      \
    for (int64_t i = 0; i < BPP; i++) row[i] = src[i] + up[i];                              \
    for (int64_t i = BPP; i < stride; i += BPP)                                             \
        for (int k = 0; k < BPP; k++)                                                       \
            row[i + k] = src[i + k] + paeth(row[i + k - BPP], up[i + k], up[i + k - BPP]);

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
        if (bpp == 3) {
            PAETH_ROW(3)
        } else {
            PAETH_ROW(4)
        }
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
