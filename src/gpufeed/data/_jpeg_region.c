/* Decode only the rows and columns of a JPEG that a crop needs (libjpeg-turbo's partial
 * decompression: jpeg_crop_scanline and jpeg_skip_scanlines), at a DCT scale of M/8; and a whole
 * batch in one call: each crop decoded, resized (_resample.c), flipped and written into its
 * place in the batch slot.
 *
 * decode_region(data, scale, top, bottom, left, right, margin) -> bytearray
 *   RGB pixels of rows [top, bottom) and columns [left, right), in pixels of the image decoded at
 *   scale/8, rows back to back. `margin` more columns are decoded on each side where the image
 *   has them (libjpeg upsamples chroma at the edge of a cropped row from the edge itself).
 * fill_batch(datas, plan, out, height, width, nchw, norm, margin, threads) -> list
 *   For image i: plan row i (int32: dest, scale, top, bottom, left, right, hflip, vflip) says
 *   which region to decode; it is resized to height x width, flipped, and written as image
 *   `dest` of `out` (a writable buffer of uint8 images, or float32 ones normalized as
 *   x * norm[c] - norm[3 + c] when `norm` is 6 float32), in N x 3 x H x W (`nchw`) or
 *   N x H x W x 3 memory. Returns, per image, None or the reason it could not be decoded (the
 *   caller decodes those another way). `threads` threads share the images.
 * Every row below a crop is still entropy-decoded (skipped, not dropped) and the file is read
 * to its end, so a damaged or truncated JPEG raises its libjpeg warning as a full decode would:
 * any warning fails the image. The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#include "_resample.h"

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int warned;
} ErrorManager;

static void on_error(j_common_ptr cinfo)
{
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (level < 0 && !err->warned) { /* a warning: corrupt or missing data */
        (*cinfo->err->format_message)(cinfo, err->message);
        err->warned = 1;
    }
}

/* Where a decoded region is: rows `stride` bytes apart (in the decoder's scratch). */
typedef struct {
    const unsigned char *pixels;
    size_t stride;
} Rows;

/* Decode the region into the scratch (`rows`, valid until the scratch is used again); 0, or -1
 * with the reason in `message` (JMSG_LENGTH_MAX bytes). Needs no Python: runs without the GIL.
 * Rows go straight from libjpeg into the scratch, many per call, decoded iMCU-aligned as wide as
 * jpeg_crop_scanline makes them; `rows` starts at the region's first column. */
static int decode_rows(const unsigned char *data, size_t len, int scale, int top, int bottom,
                       int left, int right, int margin, Scratch *scratch, Rows *rows,
                       char *message)
{
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    JDIMENSION x_offset = 0, width = 0;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.warned = 0;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        const char *why = err.message[0] ? err.message : "cannot decode JPEG";
        snprintf(message, JMSG_LENGTH_MAX, "%s", why);
        return -1;
    }
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.scale_num = (unsigned int)scale;
    cinfo.scale_denom = 8;
    cinfo.out_color_space = JCS_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    if ((JDIMENSION)bottom > cinfo.output_height || (JDIMENSION)right > cinfo.output_width) {
        snprintf(err.message, JMSG_LENGTH_MAX, "region %d:%d x %d:%d outside the %ux%u image",
                 top, bottom, left, right, cinfo.output_height, cinfo.output_width);
        longjmp(err.jump, 1);
    }
    x_offset = (JDIMENSION)(left > margin ? left - margin : 0);
    width = (JDIMENSION)(right + margin) - x_offset;
    if (x_offset + width > cinfo.output_width)
        width = cinfo.output_width - x_offset;
    if (width < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &x_offset, &width); /* x_offset to an iMCU boundary */
    size_t stride = (size_t)width * 3, count = (size_t)(bottom - top);
    unsigned char *pixels = scratch_get(scratch, SCRATCH_REGION, count * stride);
    JSAMPROW *pointers = (JSAMPROW *)scratch_get(scratch, SCRATCH_LINE,
                                                 count * sizeof(JSAMPROW) + stride);
    if (pixels == NULL || pointers == NULL) {
        snprintf(err.message, JMSG_LENGTH_MAX, "out of memory");
        longjmp(err.jump, 1);
    }
    for (size_t i = 0; i < count; i++)
        pointers[i] = pixels + i * stride;
    if (top > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
    while (cinfo.output_scanline < (JDIMENSION)bottom) {
        JDIMENSION done = cinfo.output_scanline - (JDIMENSION)top;
        jpeg_read_scanlines(&cinfo, pointers + done, (JDIMENSION)count - done);
    }
    /* Rows below: entropy-decoded but not converted (skipping to the very bottom would stop
     * reading), then the last row read, so the whole file is checked as by a full decode. */
    JDIMENSION left_over = cinfo.output_height - cinfo.output_scanline;
    if (left_over > 1)
        jpeg_skip_scanlines(&cinfo, left_over - 1);
    if (left_over > 0) {
        JSAMPROW last = (unsigned char *)(pointers + count);
        jpeg_read_scanlines(&cinfo, &last, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err.warned) {
        snprintf(message, JMSG_LENGTH_MAX, "%s", err.message);
        return -1;
    }
    rows->pixels = pixels + (size_t)((JDIMENSION)left - x_offset) * 3;
    rows->stride = stride;
    return 0;
}

static int region_ok(int scale, int top, int bottom, int left, int right)
{
    return scale >= 1 && scale <= 8 && top >= 0 && left >= 0 && bottom > top && right > left;
}

static PyObject *decode_region(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    int scale, top, bottom, left, right, margin;
    if (!PyArg_ParseTuple(args, "y*iiiiii", &buf, &scale, &top, &bottom, &left, &right, &margin))
        return NULL;
    if (!region_ok(scale, top, bottom, left, right) || margin < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "decode_region: bad scale or region");
        return NULL;
    }
    Scratch scratch = {0};
    Rows rows;
    char message[JMSG_LENGTH_MAX];
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = decode_rows(buf.buf, (size_t)buf.len, scale, top, bottom, left, right, margin,
                         &scratch, &rows, message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject *out = NULL;
    if (failed)
        PyErr_SetString(PyExc_ValueError, message);
    else {
        size_t row = (size_t)(right - left) * 3;
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(row * (size_t)(bottom - top)));
        for (int y = 0; out != NULL && y < bottom - top; y++)
            memcpy(PyByteArray_AS_STRING(out) + row * (size_t)y,
                   rows.pixels + rows.stride * (size_t)y, row);
    }
    scratch_free(&scratch);
    return out;
}

/* ------------------------------------------------------------------ a whole batch in one call */

enum { DEST, SCALE, TOP, BOTTOM, LEFT, RIGHT, HFLIP, VFLIP, PLAN_COLUMNS };

typedef struct {
    Py_buffer *datas;
    const int32_t *plan;
    unsigned char *out;
    size_t image_bytes;
    int height, width, nchw, margin, n, step;
    const float *lut;
    char (*messages)[JMSG_LENGTH_MAX];
    int *failed;
} Batch;

/* Image i: its region decoded, resized, flipped and stored; 0 or -1 with messages[i] set. */
static int fill_one(const Batch *b, int i, Scratch *scratch)
{
    const int32_t *p = b->plan + (size_t)i * PLAN_COLUMNS;
    int h = p[BOTTOM] - p[TOP], w = p[RIGHT] - p[LEFT];
    Rows region;
    if (decode_rows(b->datas[i].buf, (size_t)b->datas[i].len, p[SCALE], p[TOP], p[BOTTOM],
                    p[LEFT], p[RIGHT], b->margin, scratch, &region, b->messages[i]) != 0)
        return -1;
    size_t stride;
    int flips = (p[HFLIP] ? FLIP_WIDTH : 0) | (p[VFLIP] ? FLIP_HEIGHT : 0);
    const unsigned char *pixels =
        resize_rgb(region.pixels, h, w, region.stride, b->height, b->width, &flips, scratch,
                   &stride);
    if (pixels == NULL) {
        snprintf(b->messages[i], JMSG_LENGTH_MAX, "out of memory");
        return -1;
    }
    Store to = {b->out + (size_t)p[DEST] * b->image_bytes, b->nchw, b->lut, flips};
    store_rgb(pixels, b->height, b->width, stride, &to);
    return 0;
}

typedef struct {
    const Batch *batch;
    int first;
} Share;

static void *fill_share(void *arg)
{
    const Share *share = arg;
    const Batch *b = share->batch;
    Scratch scratch = {0};
    for (int i = share->first; i < b->n; i += b->step)
        b->failed[i] = fill_one(b, i, &scratch) != 0;
    scratch_free(&scratch);
    return NULL;
}

/* Image i goes to thread i % threads; this thread is thread 0, and takes over the share of any
 * thread that could not be started. */
static void fill_all(Batch *b, int threads)
{
    enum { MOST = 64 };
    threads = threads < 1 ? 1 : (threads > b->n ? b->n : threads);
    threads = threads > MOST ? MOST : (threads < 1 ? 1 : threads);
    b->step = threads;
    pthread_t ids[MOST];
    Share shares[MOST];
    int started[MOST] = {0};
    for (int t = 0; t < threads; t++)
        shares[t] = (Share){b, t};
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&ids[t], NULL, fill_share, &shares[t]) == 0;
    fill_share(&shares[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            fill_share(&shares[t]);
    }
}

static PyObject *fill_batch(PyObject *self, PyObject *args)
{
    PyObject *datas_arg, *norm_arg;
    Py_buffer plan, out, norm = {0};
    int height, width, nchw, margin, threads;
    if (!PyArg_ParseTuple(args, "Oy*w*iipOii", &datas_arg, &plan, &out, &height, &width, &nchw,
                          &norm_arg, &margin, &threads))
        return NULL;
    PyObject *result = NULL;
    PyObject *seq = PySequence_Fast(datas_arg, "fill_batch: datas must be a sequence");
    Py_buffer *datas = NULL;
    int *failed = NULL, n = 0, held = 0;
    char(*messages)[JMSG_LENGTH_MAX] = NULL;
    float lut[NORM_TABLE];
    if (seq == NULL)
        goto done;
    n = (int)PySequence_Fast_GET_SIZE(seq);
    int has_norm = norm_arg != Py_None;
    if (has_norm && PyObject_GetBuffer(norm_arg, &norm, PyBUF_SIMPLE) < 0)
        goto done;
    size_t element = has_norm ? sizeof(float) : 1;
    size_t image_bytes = (size_t)height * (size_t)width * 3 * element;
    if (height < 1 || width < 1 || margin < 0 || (has_norm && norm.len != 6 * sizeof(float)) ||
        plan.len != (Py_ssize_t)((size_t)n * PLAN_COLUMNS * sizeof(int32_t))) {
        PyErr_SetString(PyExc_ValueError, "fill_batch: bad sizes, plan or norm");
        goto done;
    }
    const int32_t *rows = plan.buf;
    for (int i = 0; i < n; i++) {
        const int32_t *p = rows + (size_t)i * PLAN_COLUMNS;
        if (!region_ok(p[SCALE], p[TOP], p[BOTTOM], p[LEFT], p[RIGHT]) || p[DEST] < 0 ||
            (size_t)(p[DEST] + 1) * image_bytes > (size_t)out.len) {
            PyErr_Format(PyExc_ValueError, "fill_batch: bad plan row %d", i);
            goto done;
        }
    }
    if (has_norm) {
        const float *f = norm.buf;
        normalize_table(f, f + 3, lut);
    }
    datas = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    failed = PyMem_Calloc((size_t)n + 1, sizeof(int));
    messages = PyMem_Calloc((size_t)n + 1, JMSG_LENGTH_MAX);
    if (datas == NULL || failed == NULL || messages == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &datas[held], PyBUF_SIMPLE) < 0)
            goto done;
    Batch batch = {datas, rows, out.buf, image_bytes, height, width, nchw, margin, n, 1,
                   has_norm ? lut : NULL, messages, failed};
    Py_BEGIN_ALLOW_THREADS
    fill_all(&batch, threads);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (int i = 0; result != NULL && i < n; i++) {
        PyObject *why = Py_None;
        if (failed[i])
            why = PyUnicode_DecodeUTF8(messages[i], (Py_ssize_t)strlen(messages[i]), "replace");
        else
            Py_INCREF(why);
        if (why == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, why);
    }
done:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&datas[i]);
    PyMem_Free(datas);
    PyMem_Free(failed);
    PyMem_Free(messages);
    if (norm.obj != NULL)
        PyBuffer_Release(&norm);
    PyBuffer_Release(&plan);
    PyBuffer_Release(&out);
    Py_XDECREF(seq);
    return result;
}

static PyObject *vector_passes(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(use_vector_passes(on));
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale, top, bottom, left, right, margin) -> bytearray: RGB pixels of "
     "rows [top, bottom) and columns [left, right) of a JPEG decoded at scale/8."},
    {"fill_batch", fill_batch, METH_VARARGS,
     "fill_batch(datas, plan, out, height, width, nchw, norm, margin, threads) -> list: each "
     "JPEG's region decoded, resized, flipped and written into the batch `out`; per image None "
     "or why it failed."},
    {"vector_passes", vector_passes, METH_O,
     "vector_passes(on) -> bool: resize with the vectorized passes where the CPU has them (on) "
     "or the plain C ones (off, for tests); returns the setting before."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg_region",
    "libjpeg-turbo's partial decompression: only the rows and columns a crop needs.", -1, methods,
};

PyMODINIT_FUNC PyInit__jpeg_region(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0 ||
                      PyModule_AddIntConstant(m, "FAST_RESAMPLE", fast_resample()) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
