/* Antialiased bilinear resize of RGB uint8 images: see _resample.h (the store: _store.c). */
#include "_resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void scratch_free(Scratch *s)
{
    for (int i = 0; i < SCRATCHES; i++) {
        free(s->buf[i]);
        s->buf[i] = NULL;
        s->size[i] = 0;
    }
}

unsigned char *scratch_get(Scratch *s, int which, size_t bytes)
{
    if (s->size[which] < bytes) {
        unsigned char *grown = realloc(s->buf[which], bytes + SCRATCH_PAD);
        if (grown == NULL)
            return NULL;
        s->buf[which] = grown;
        s->size[which] = bytes;
    }
    return s->buf[which];
}

/* One axis of the resize: for each output index, its first input index, how many it reads and
 * their weights (int16, `taps` per output index, scaled by 2^precision). */
typedef struct {
    int out, taps, kstride; /* kstride: weights per output index in `w`, even, zeros past taps */
    unsigned precision;
    int *start, *count;
    int16_t *w;
} Axis;

static double triangle(double x)
{
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* torch's _compute_indices_min_size_weights_aa and _compute_index_ranges_int16_weights for the
 * bilinear filter, align_corners=False and no scale factor given. */
static int axis_init(Axis *a, int in, int out)
{
    double scale = (double)in / (double)out;
    double support = scale >= 1.0 ? scale : 1.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int taps = (int)ceil(support) * 2 + 1;
    double *wf = malloc(sizeof(double) * (size_t)out * (size_t)taps);
    a->out = out;
    a->taps = taps;
    a->kstride = (taps + 2) & ~1;
    a->start = malloc(sizeof(int) * (size_t)out);
    a->count = malloc(sizeof(int) * (size_t)out);
    a->w = calloc((size_t)out * (size_t)a->kstride, sizeof(int16_t));
    if (wf == NULL || a->start == NULL || a->count == NULL || a->w == NULL) {
        free(wf);
        return -1;
    }
    double wt_max = 0.0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5);
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        if (xmax > in)
            xmax = in;
        int64_t xsize = xmax - xmin;
        if (xsize < 0)
            xsize = 0;
        if (xsize > taps)
            xsize = taps;
        double *w = wf + (size_t)i * (size_t)taps, total = 0.0;
        int64_t j = 0;
        for (; j < xsize; j++) {
            w[j] = triangle(((double)(j + xmin) - center + 0.5) * invscale);
            total += w[j];
        }
        if (total != 0.0)
            for (j = 0; j < xsize; j++) {
                w[j] /= total;
                if (w[j] > wt_max)
                    wt_max = w[j];
            }
        for (; j < taps; j++)
            w[j] = 0.0;
        a->start[i] = (int)xmin;
        a->count[i] = (int)xsize;
    }
    unsigned precision = 0;
    for (precision = 0; precision < 22; ++precision) {
        int next_value = (int)(0.5 + wt_max * (1 << (precision + 1)));
        if (next_value >= (1 << 15))
            break;
    }
    a->precision = precision;
    for (size_t i = 0; i < (size_t)out; i++)
        for (size_t k = 0; k < (size_t)taps; k++) {
            double v = wf[i * (size_t)taps + k] * (1 << precision);
            int16_t rounded = (int16_t)((v < 0) ? (int)(-0.5 + v) : (int)(0.5 + v));
            a->w[i * (size_t)a->kstride + k] = rounded;
        }
    free(wf);
    return 0;
}

static void axis_free(Axis *a)
{
    free(a->start);
    free(a->count);
    free(a->w);
}

static inline unsigned char clip8(int32_t v)
{
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

/* Each of `h` rows of `src` resized along its width: h x a->out x 3 into `dst`. */
static void horizontal_scalar(const unsigned char *src, int h, size_t stride, const Axis *a,
                              int mirror, unsigned char *dst)
{
    const int32_t init = (int32_t)1 << (a->precision - 1);
    const int shift = (int)a->precision, out = a->out;
    for (int y = 0; y < h; y++) {
        const unsigned char *row = src + (size_t)y * stride;
        unsigned char *o = dst + (size_t)y * (size_t)out * 3;
        for (int x = 0; x < out; x++) {
            const int16_t *k = a->w + (size_t)x * (size_t)a->kstride;
            const unsigned char *p = row + (size_t)a->start[x] * 3;
            int32_t r = init, g = init, b = init;
            for (int j = 0, n = a->count[x]; j < n; j++, p += 3) {
                r += k[j] * p[0];
                g += k[j] * p[1];
                b += k[j] * p[2];
            }
            size_t at = 3 * (size_t)(mirror ? out - 1 - x : x);
            o[at] = clip8(r >> shift);
            o[at + 1] = clip8(g >> shift);
            o[at + 2] = clip8(b >> shift);
        }
    }
}

/* Rows of `src` (each `n` bytes, `stride` apart) resized along the height into a->out rows of
 * `dst`, `n` bytes each; `acc` holds n int32. */
static void vertical_scalar(const unsigned char *src, size_t n, size_t stride, const Axis *a,
                            int mirror, unsigned char *dst, int32_t *acc)
{
    const int32_t init = (int32_t)1 << (a->precision - 1);
    const int shift = (int)a->precision;
    for (int y = 0; y < a->out; y++) {
        const int16_t *k = a->w + (size_t)y * (size_t)a->kstride;
        const unsigned char *rows = src + (size_t)a->start[y] * stride;
        for (size_t i = 0; i < n; i++)
            acc[i] = init;
        for (int j = 0; j < a->count[y]; j++) {
            const int32_t kj = k[j];
            const unsigned char *row = rows + (size_t)j * stride;
            for (size_t i = 0; i < n; i++)
                acc[i] += kj * row[i];
        }
        unsigned char *o = dst + (size_t)(mirror ? a->out - 1 - y : y) * n;
        for (size_t i = 0; i < n; i++)
            o[i] = clip8(acc[i] >> shift);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* The pair of weights k[j], k[j + 1] in every 32-bit element (k[j] in the low half). */
static inline int32_t weight_pair(const int16_t *k)
{
    int32_t pair;
    memcpy(&pair, k, sizeof(pair));
    return pair;
}

/* `horizontal_scalar`, two rows at a time (one per 128-bit lane) and two taps per multiply-add:
 * the same integer sums. Reads up to 16 bytes from a tap's first pixel: `src` must have that
 * much readable memory after its last pixel. */
__attribute__((target("avx2"))) static void horizontal_avx2(const unsigned char *src, int h,
                                                            size_t stride, const Axis *a,
                                                            int mirror, unsigned char *dst)
{
    /* bytes r0 g0 b0 r1 g1 b1 -> int16 (r0, r1), (g0, g1), (b0, b1), (0, 0) in each lane */
    const __m256i pick = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    const __m256i init = _mm256_set1_epi32((int32_t)1 << (a->precision - 1));
    const int shift = (int)a->precision, out = a->out;
    const size_t row_out = (size_t)out * 3;
    int y = 0;
    for (; y + 1 < h; y += 2) {
        const unsigned char *row0 = src + (size_t)y * stride, *row1 = row0 + stride;
        unsigned char *o0 = dst + (size_t)y * row_out, *o1 = o0 + row_out;
        for (int x = 0; x < out; x++) {
            const int16_t *k = a->w + (size_t)x * (size_t)a->kstride;
            size_t at = (size_t)a->start[x] * 3;
            __m256i sum = init;
            for (int j = 0, n = a->count[x]; j < n; j += 2, at += 6) {
                __m256i px = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row0 + at))),
                    _mm_loadu_si128((const __m128i *)(row1 + at)), 1);
                px = _mm256_shuffle_epi8(px, pick);
                const __m256i w = _mm256_set1_epi32(weight_pair(k + j));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(px, w));
            }
            sum = _mm256_srai_epi32(sum, shift);
            sum = _mm256_packus_epi16(_mm256_packs_epi32(sum, sum), sum);
            uint32_t p0 = (uint32_t)_mm256_extract_epi32(sum, 0);
            uint32_t p1 = (uint32_t)_mm256_extract_epi32(sum, 4);
            size_t to = 3 * (size_t)(mirror ? out - 1 - x : x);
            memcpy(o0 + to, &p0, 3);
            memcpy(o1 + to, &p1, 3);
        }
    }
    if (y < h)
        horizontal_scalar(src + (size_t)y * stride, h - y, stride, a, mirror,
                          dst + (size_t)y * row_out);
}

/* `vertical_scalar`, 32 bytes and two rows per multiply-add: the same integer sums. */
__attribute__((target("avx2"))) static void vertical_avx2(const unsigned char *src, size_t n,
                                                          size_t stride, const Axis *a,
                                                          int mirror, unsigned char *dst)
{
    const __m256i init = _mm256_set1_epi32((int32_t)1 << (a->precision - 1));
    const __m256i zero = _mm256_setzero_si256();
    const int shift = (int)a->precision;
    for (int y = 0; y < a->out; y++) {
        const int16_t *k = a->w + (size_t)y * (size_t)a->kstride;
        const unsigned char *rows = src + (size_t)a->start[y] * stride;
        const int count = a->count[y];
        unsigned char *o = dst + (size_t)(mirror ? a->out - 1 - y : y) * n;
        size_t i = 0;
        for (; i + 32 <= n; i += 32) {
            __m256i s0 = init, s1 = init, s2 = init, s3 = init;
            for (int j = 0; j < count; j += 2) {
                const __m256i w = _mm256_set1_epi32(weight_pair(k + j));
                const unsigned char *row = rows + (size_t)j * stride + i;
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)row);
                const __m256i a1 = j + 1 < count
                    ? _mm256_loadu_si256((const __m256i *)(rows + (size_t)(j + 1) * stride + i))
                    : zero;
                __m256i lo = _mm256_unpacklo_epi8(a0, a1), hi = _mm256_unpackhi_epi8(a0, a1);
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w));
                s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w));
                s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w));
                s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w));
            }
            s0 = _mm256_packs_epi32(_mm256_srai_epi32(s0, shift), _mm256_srai_epi32(s1, shift));
            s2 = _mm256_packs_epi32(_mm256_srai_epi32(s2, shift), _mm256_srai_epi32(s3, shift));
            _mm256_storeu_si256((__m256i *)(o + i), _mm256_packus_epi16(s0, s2));
        }
        for (; i < n; i++) {
            int32_t sum = (int32_t)1 << (a->precision - 1);
            for (int j = 0; j < count; j++)
                sum += k[j] * rows[(size_t)j * stride + i];
            o[i] = clip8(sum >> shift);
        }
    }
}

static int vector_passes = -1; /* -1: ask the CPU; a benign race, every thread gets one answer */

static int has_avx2(void)
{
    if (vector_passes < 0)
        vector_passes = __builtin_cpu_supports("avx2") ? 1 : 0;
    return vector_passes;
}
#endif

int use_vector_passes(int on)
{
#ifdef HAVE_AVX2_PATH
    int was = has_avx2();
    vector_passes = on && __builtin_cpu_supports("avx2");
    return was;
#else
    (void)on;
    return 0;
#endif
}

int fast_resample(void)
{
#ifdef HAVE_AVX2_PATH
    return has_avx2();
#else
    return 0;
#endif
}

static void horizontal(const unsigned char *src, int h, size_t stride, const Axis *a, int mirror,
                       unsigned char *dst)
{
#ifdef HAVE_AVX2_PATH
    if (has_avx2()) {
        horizontal_avx2(src, h, stride, a, mirror, dst);
        return;
    }
#endif
    horizontal_scalar(src, h, stride, a, mirror, dst);
}

static void vertical(const unsigned char *src, size_t n, size_t stride, const Axis *a, int mirror,
                     unsigned char *dst, int32_t *acc)
{
#ifdef HAVE_AVX2_PATH
    if (has_avx2()) {
        vertical_avx2(src, n, stride, a, mirror, dst);
        return;
    }
#endif
    vertical_scalar(src, n, stride, a, mirror, dst, acc);
}

const unsigned char *resize_rgb(const unsigned char *src, int h, int w, size_t src_stride,
                                int out_h, int out_w, int *flips, Scratch *s, size_t *stride)
{
    Axis ax = {0}, ay = {0};
    const unsigned char *cur = src;
    size_t cur_stride = src_stride;
    int ok = 1;
    if (w != out_w) {
        unsigned char *dst = scratch_get(s, SCRATCH_WIDTH, (size_t)h * (size_t)out_w * 3);
        ok = dst != NULL && axis_init(&ax, w, out_w) == 0;
        if (ok) {
            horizontal(cur, h, cur_stride, &ax, *flips & FLIP_WIDTH, dst);
            *flips &= ~FLIP_WIDTH;
            cur = dst;
            cur_stride = (size_t)out_w * 3;
        }
    }
    if (ok && h != out_h) {
        size_t n = (size_t)out_w * 3;
        unsigned char *dst = scratch_get(s, SCRATCH_HEIGHT, (size_t)out_h * n);
        int32_t *acc = (int32_t *)scratch_get(s, SCRATCH_SUMS, n * sizeof(int32_t));
        ok = dst != NULL && acc != NULL && axis_init(&ay, h, out_h) == 0;
        if (ok) {
            vertical(cur, n, cur_stride, &ay, *flips & FLIP_HEIGHT, dst, acc);
            *flips &= ~FLIP_HEIGHT;
            cur = dst;
            cur_stride = n;
        }
    }
    axis_free(&ax);
    axis_free(&ay);
    *stride = cur_stride;
    return ok ? cur : NULL;
}
