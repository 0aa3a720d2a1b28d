/* Decode only the rows and columns of a JPEG that a crop needs (libjpeg-turbo's partial
 * decompression: jpeg_crop_scanline and jpeg_skip_scanlines), at a DCT scale of M/8.
 *
 * decode_region(data, scale, top, bottom, left, right, margin) -> bytearray
 *   RGB pixels of rows [top, bottom) and columns [left, right), in pixels of the image decoded at
 *   scale/8, rows back to back. `margin` more columns are decoded on each side where the image
 *   has them (libjpeg upsamples chroma at the edge of a cropped row from the edge itself).
 * Every row below the crop is still entropy-decoded (skipped, not dropped) and the file is read
 * to its end, so a damaged or truncated JPEG raises its libjpeg warning as a full decode would:
 * any warning is a ValueError. The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

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

static PyObject *decode_region(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    int scale, top, bottom, left, right, margin;
    if (!PyArg_ParseTuple(args, "y*iiiiii", &buf, &scale, &top, &bottom, &left, &right, &margin))
        return NULL;
    if (scale < 1 || scale > 8 || top < 0 || left < 0 || bottom <= top || right <= left ||
        margin < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "decode_region: bad scale or region");
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    PyObject *volatile out = NULL;
    PyThreadState *volatile saved = NULL;
    unsigned char *volatile row_buffer = NULL;
    JDIMENSION x_offset = 0, width = 0;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.warned = 0;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        if (saved != NULL)
            PyEval_RestoreThread(saved);
        jpeg_destroy_decompress(&cinfo);
        free(row_buffer);
        PyBuffer_Release(&buf);
        Py_XDECREF(out);
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "cannot decode JPEG");
        return NULL;
    }
    saved = PyEval_SaveThread();
    jpeg_mem_src(&cinfo, (const unsigned char *)buf.buf, (unsigned long)buf.len);
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
    JSAMPROW line = (JSAMPROW)malloc((size_t)width * 3);
    row_buffer = line;
    if (line == NULL) {
        snprintf(err.message, JMSG_LENGTH_MAX, "out of memory");
        longjmp(err.jump, 1);
    }
    PyEval_RestoreThread(saved);
    saved = NULL;
    size_t stride = (size_t)(right - left) * 3, skip = (size_t)((JDIMENSION)left - x_offset) * 3;
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(stride * (size_t)(bottom - top)));
    if (out == NULL) {
        free(line);
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&buf);
        return NULL;
    }
    unsigned char *pixels = (unsigned char *)PyByteArray_AS_STRING(out);
    saved = PyEval_SaveThread();
    if (top > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
    while (cinfo.output_scanline < (JDIMENSION)bottom) {
        unsigned char *to = pixels + stride * (cinfo.output_scanline - (JDIMENSION)top);
        jpeg_read_scanlines(&cinfo, &line, 1);
        memcpy(to, line + skip, stride);
    }
    /* Rows below: entropy-decoded but not converted (skipping to the very bottom would stop
     * reading), then the last row read, so the whole file is checked as by a full decode. */
    JDIMENSION left_over = cinfo.output_height - cinfo.output_scanline;
    if (left_over > 1)
        jpeg_skip_scanlines(&cinfo, left_over - 1);
    if (left_over > 0)
        jpeg_read_scanlines(&cinfo, &line, 1);
    jpeg_finish_decompress(&cinfo);
    PyEval_RestoreThread(saved);
    saved = NULL;
    free(line);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&buf);
    if (err.warned) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale, top, bottom, left, right, margin) -> bytearray: RGB pixels of "
     "rows [top, bottom) and columns [left, right) of a JPEG decoded at scale/8."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg_region",
    "libjpeg-turbo's partial decompression: only the rows and columns a crop needs.", -1, methods,
};

PyMODINIT_FUNC PyInit__jpeg_region(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
