/* The store of a resized image into its place in a batch slot, normalized where the batch is
 * float32: see _resample.h. */
#include "_resample.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_PATH 1 /* the loops below, compiled again for AVX2 (fast_resample says when) */
#endif

void normalize_table(const float scale[3], const float shift[3], float lut[NORM_TABLE])
{
    memcpy(lut + 3 * 256, scale, 3 * sizeof(float));
    memcpy(lut + 3 * 256 + 3, shift, 3 * sizeof(float));
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            volatile float scaled = (float)v * scale[c]; /* rounded alone, as torch's mul_ */
            lut[256 * c + v] = scaled - shift[c];
        }
}

/* Rows of `w` pixels, no flips, into float32 N x H x W x 3 memory: x * scale - shift, with the
 * rounding of `lut`, as 24 elements (8 pixels) at a time that a compiler vectorizes (always
 * inlined, so that it is compiled again inside the AVX2 wrapper below). */
static inline __attribute__((always_inline)) void normalize_run(const unsigned char *src,
                                                                size_t n, const float *lut,
                                                                float *o)
{
    float scale[24], shift[24];
    for (int j = 0; j < 24; j++) {
        scale[j] = lut[3 * 256 + j % 3];
        shift[j] = lut[3 * 256 + 3 + j % 3];
    }
    size_t i = 0;
    for (; i + 24 <= n; i += 24)
        for (int j = 0; j < 24; j++) {
            float scaled = (float)src[i + j] * scale[j];
            o[i + j] = scaled - shift[j];
        }
    for (; i < n; i++)
        o[i] = lut[256 * (i % 3) + src[i]];
}

/* One row of `w` pixels, no flips, into the three float32 planes of N x 3 x H x W memory. */
static inline __attribute__((always_inline)) void normalize_planes(const unsigned char *src,
                                                                   int w, const float *lut,
                                                                   float *r, float *g, float *b)
{
    enum { PART = 256 }; /* pixels split into planes at a time, then converted plane by plane */
    const float *scale = lut + 3 * 256, *shift = scale + 3;
    float *planes[3] = {r, g, b};
    unsigned char part[3][PART];
    for (int x0 = 0; x0 < w; x0 += PART) {
        int n = w - x0 < PART ? w - x0 : PART;
        const unsigned char *p = src + 3 * (size_t)x0;
        for (int x = 0; x < n; x++) {
            part[0][x] = p[3 * x];
            part[1][x] = p[3 * x + 1];
            part[2][x] = p[3 * x + 2];
        }
        for (int c = 0; c < 3; c++) {
            float *o = planes[c] + x0;
            const float sc = scale[c], sh = shift[c];
            for (int x = 0; x < n; x++) {
                float scaled = (float)part[c][x] * sc;
                o[x] = scaled - sh;
            }
        }
    }
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2"))) static void normalize_planes_avx2(const unsigned char *src, int w,
                                                                  const float *lut, float *r,
                                                                  float *g, float *b)
{
    normalize_planes(src, w, lut, r, g, b);
}

__attribute__((target("avx2"))) static void normalize_run_avx2(const unsigned char *src, size_t n,
                                                               const float *lut, float *o)
{
    normalize_run(src, n, lut, o);
}
#endif

/* One pixel at a time: any layout, type and flips. */
static void store_any(const unsigned char *src, int h, int w, size_t stride, const Store *to)
{
    const float(*lut)[256] = (const float(*)[256])to->lut;
    size_t plane = (size_t)h * (size_t)w;
    for (int y = 0; y < h; y++) {
        const unsigned char *row = src + (size_t)y * stride;
        size_t oy = (size_t)(to->flips & FLIP_HEIGHT ? h - 1 - y : y) * (size_t)w;
        for (int x = 0; x < w; x++) {
            size_t at = oy + (size_t)(to->flips & FLIP_WIDTH ? w - 1 - x : x);
            const unsigned char *p = row + 3 * (size_t)x;
            if (to->lut == NULL) {
                unsigned char *o = to->base;
                if (to->nchw) {
                    o[at] = p[0];
                    o[plane + at] = p[1];
                    o[2 * plane + at] = p[2];
                } else
                    memcpy(o + 3 * at, p, 3);
            } else {
                float *o = to->base;
                if (to->nchw) {
                    o[at] = lut[0][p[0]];
                    o[plane + at] = lut[1][p[1]];
                    o[2 * plane + at] = lut[2][p[2]];
                } else {
                    o[3 * at] = lut[0][p[0]];
                    o[3 * at + 1] = lut[1][p[1]];
                    o[3 * at + 2] = lut[2][p[2]];
                }
            }
        }
    }
}

void store_rgb(const unsigned char *src, int h, int w, size_t stride, const Store *to)
{
    if (to->flips || (to->nchw && to->lut == NULL)) {
        store_any(src, h, w, stride, to);
        return;
    }
    size_t row = (size_t)w * 3, plane = (size_t)h * (size_t)w;
    if (to->nchw) {
        for (int y = 0; y < h; y++) {
            float *r = (float *)to->base + (size_t)y * (size_t)w;
            const unsigned char *from = src + (size_t)y * stride;
#ifdef HAVE_AVX2_PATH
            if (fast_resample()) {
                normalize_planes_avx2(from, w, to->lut, r, r + plane, r + 2 * plane);
                continue;
            }
#endif
            normalize_planes(from, w, to->lut, r, r + plane, r + 2 * plane);
        }
        return;
    }
    for (int y = 0; y < h; y++) {
        const unsigned char *from = src + (size_t)y * stride;
        if (to->lut == NULL) {
            memcpy((unsigned char *)to->base + (size_t)y * row, from, row);
            continue;
        }
        float *o = (float *)to->base + (size_t)y * row;
#ifdef HAVE_AVX2_PATH
        if (fast_resample()) {
            normalize_run_avx2(from, row, to->lut, o);
            continue;
        }
#endif
        normalize_run(from, row, to->lut, o);
    }
}
