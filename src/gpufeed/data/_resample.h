/* Antialiased bilinear resize of RGB uint8 images and the store into a batch slot, in plain C
 * (no Python): the arithmetic of torch's uint8 `interpolate(mode="bilinear", antialias=True)`
 * (Pillow's filter, int16 weights at torch's precision, width first, rounded to uint8 between
 * passes), so its pixels are torch's, bit for bit. */
#ifndef GPUFEED_RESAMPLE_H
#define GPUFEED_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* Memory a thread reuses from image to image (grown as needed, freed by scratch_free). */
enum { SCRATCH_WIDTH, SCRATCH_HEIGHT, SCRATCH_SUMS, SCRATCH_REGION, SCRATCH_LINE, SCRATCHES };
typedef struct {
    unsigned char *buf[SCRATCHES];
    size_t size[SCRATCHES];
} Scratch;

/* Bytes readable past the end of every scratch buffer (vector loads may reach past the end). */
#define SCRATCH_PAD 32

void scratch_free(Scratch *s);
unsigned char *scratch_get(Scratch *s, int which, size_t bytes);

enum { FLIP_WIDTH = 1, FLIP_HEIGHT = 2 };

/* Resize `src` (h x w x 3, rows `src_stride` bytes apart, SCRATCH_PAD bytes readable after it)
 * to out_h x out_w x 3; returns the result (in `s`, rows out_w * 3 apart, or `src` itself when
 * the sizes are equal) and sets *stride; NULL when out of memory. `flips` (FLIP_WIDTH |
 * FLIP_HEIGHT) are mirrored by the passes that run; those left to do stay set in *flips. */
const unsigned char *resize_rgb(const unsigned char *src, int h, int w, size_t src_stride,
                                int out_h, int out_w, int *flips, Scratch *s, size_t *stride);

/* Where and how one image of a batch is written. */
typedef struct {
    void *base;        /* the image's first element in the batch */
    int nchw;          /* 1: 3 planes of H x W; 0: H x W x 3 */
    const float *lut;  /* NULL: uint8 elements; else float32, lut[256 * c + x] (normalize_table) */
    int flips; /* FLIP_WIDTH | FLIP_HEIGHT */
} Store;

/* Whether this CPU runs the vectorized (AVX2) passes; without them the plain C passes are
 * slower than torch's own resize. */
int fast_resample(void);

/* Run the vectorized passes where the CPU has them (on), or the plain C ones (off: for tests);
 * returns whether they ran before. */
int use_vector_passes(int on);

/* The float32 value of x in channel c, x * scale[c] - shift[c] rounded as torch's mul_ then
 * sub_ round it, at lut[256 * c + x]; then scale and shift themselves. */
#define NORM_TABLE (3 * 256 + 6)
void normalize_table(const float scale[3], const float shift[3], float lut[NORM_TABLE]);

/* Write h x w x 3 `src` (rows `stride` bytes apart) into the batch as `to` says. */
void store_rgb(const unsigned char *src, int h, int w, size_t stride, const Store *to);

#endif
