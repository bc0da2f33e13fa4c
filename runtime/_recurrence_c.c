/* The exact backward / forward linear recurrence as a small C extension.
 *
 * Why: the CPU backend of scalebox_cst.runtime.recurrence.linear_recurrence must be fast from
 * the first call of a process. numba costs about 0.4 s to load; this module loads in well under
 * a millisecond and is built at install time (setup.py, optional: without a compiler the numba /
 * numpy path is used).
 *
 *     rec(a, b, init, out, reverse) -> None
 *
 * computes, for t = T-1 .. 0 (reverse) or t = 0 .. T-1, out[t, j] = b[t, j] + a[t, j] * x[j] with
 * x[j] = init[j] before the first step and x[j] = out[t, j] after each: the signature of the numba
 * kernel. b, out: 2-D [T, M]; init: 1-D [M]; a: 2-D [T, M] (any strides, 0 included) or a number
 * (a Python float / numpy scalar, rounded to the array dtype as numpy rounds it). All arrays share
 * one dtype, float32 ("f") or float64 ("d"), native byte order, aligned; anything else raises
 * TypeError / ValueError (the caller then uses another backend). Arrays are read through the
 * buffer protocol (no numpy headers at build time), with any element strides.
 *
 * Exactness: each step is one rounded multiply, then one rounded add, in the array dtype: the
 * naive loop's arithmetic, so the result is bitwise identical to it. The build passes
 * -ffp-contract=off (no FMA contraction); fast-math is refused below. The columns j are
 * independent, so vectorising over them changes no column's arithmetic.
 *
 * The GIL is released around the loop.
 *
 *     rec_ptr(kind, T, M, reverse, a, sa0, sa1, a_scalar, b, sb0, sb1, init, si, init_scalar,
 *             out, so0, so1) -> None
 *
 * is the same loop on raw addresses (torch's data_ptr(), element strides), for torch tensors,
 * which have no buffer protocol: going through numpy costs a first call about 150 us of
 * one-time bridge set-up in torch and every call a few microseconds. kind is 'f' or 'd';
 * a == 0 means the scalar a_scalar, init == 0 the scalar init_scalar (both rounded to the dtype).
 * The caller guarantees the addresses and strides describe live CPU memory of that dtype
 * (recurrence.py checks the tensors; nothing is checked here beyond alignment).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifdef __FAST_MATH__
#error "_recurrence_c must not be built with -ffast-math: it would not be exact"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* bumped whenever rec's contract changes; recurrence.py refuses a stale build */
#define REC_VERSION 2

/* the fixed-width kernels are kept out of line: inlined into rec, gcc schedules them worse */
#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

/* column block of the strided path and of wide contiguous inputs */
#define CH 64

/* ---- kernels, one per dtype: W columns with unit column stride, row strides lda / ldb / ldo
 * (in elements, lda may be 0); init with element stride si; a_arr == 0: the scalar as. */
#define DEFINE_FIXED(TYPE, SUF, W)                                                              \
    static NOINLINE void fixed_##SUF##_##W(const TYPE *a, Py_ssize_t lda, int a_arr, TYPE as,            \
                                  const TYPE *b, Py_ssize_t ldb, const TYPE *init, Py_ssize_t si, \
                                  TYPE *out, Py_ssize_t ldo, Py_ssize_t T, int reverse)          \
    {                                                                                           \
        TYPE x[W];                                                                              \
        int j;                                                                                  \
        Py_ssize_t k, t = reverse ? T - 1 : 0, dt = reverse ? -1 : 1;                           \
        for (j = 0; j < W; j++)                                                                 \
            x[j] = init[j * si];                                                                \
        if (a_arr) {                                                                            \
            for (k = 0; k < T; k++, t += dt) {                                                  \
                const TYPE *at = a + t * lda, *bt = b + t * ldb;                                \
                TYPE *ot = out + t * ldo, av[W], bv[W];                                         \
                for (j = 0; j < W; j++) { /* loads before stores: vectorisable */               \
                    av[j] = at[j];                                                              \
                    bv[j] = bt[j];                                                              \
                }                                                                               \
                for (j = 0; j < W; j++) {                                                       \
                    TYPE p = av[j] * x[j];                                                      \
                    x[j] = bv[j] + p;                                                           \
                }                                                                               \
                for (j = 0; j < W; j++)                                                         \
                    ot[j] = x[j];                                                               \
            }                                                                                   \
        } else {                                                                                \
            for (k = 0; k < T; k++, t += dt) {                                                  \
                const TYPE *bt = b + t * ldb;                                                   \
                TYPE *ot = out + t * ldo, bv[W];                                                \
                for (j = 0; j < W; j++)                                                         \
                    bv[j] = bt[j];                                                              \
                for (j = 0; j < W; j++) {                                                       \
                    TYPE p = as * x[j];                                                         \
                    x[j] = bv[j] + p;                                                           \
                }                                                                               \
                for (j = 0; j < W; j++)                                                         \
                    ot[j] = x[j];                                                               \
            }                                                                                   \
        }                                                                                       \
    }

/* any strides: n <= CH columns */
#define DEFINE_STRIDED(TYPE, SUF)                                                               \
    static void strided_##SUF(const TYPE *a, Py_ssize_t sat, Py_ssize_t saj, int a_arr, TYPE as, \
                              const TYPE *b, Py_ssize_t sbt, Py_ssize_t sbj,                    \
                              const TYPE *init, Py_ssize_t si, TYPE *out, Py_ssize_t sot,        \
                              Py_ssize_t soj, Py_ssize_t T, Py_ssize_t n, int reverse)           \
    {                                                                                           \
        TYPE x[CH];                                                                             \
        Py_ssize_t j, k, t = reverse ? T - 1 : 0, dt = reverse ? -1 : 1;                        \
        for (j = 0; j < n; j++)                                                                 \
            x[j] = init[j * si];                                                                \
        for (k = 0; k < T; k++, t += dt) {                                                      \
            for (j = 0; j < n; j++) {                                                           \
                TYPE p = (a_arr ? a[t * sat + j * saj] : as) * x[j];                            \
                TYPE v = b[t * sbt + j * sbj] + p;                                              \
                x[j] = v;                                                                       \
                out[t * sot + j * soj] = v;                                                     \
            }                                                                                   \
        }                                                                                       \
    }

#define DEFINE_DRIVER(TYPE, SUF)                                                                \
    DEFINE_FIXED(TYPE, SUF, 64)                                                                 \
    DEFINE_FIXED(TYPE, SUF, 8)                                                                  \
    DEFINE_FIXED(TYPE, SUF, 4)                                                                  \
    DEFINE_FIXED(TYPE, SUF, 2)                                                                  \
    DEFINE_FIXED(TYPE, SUF, 1)                                                                  \
    DEFINE_STRIDED(TYPE, SUF)                                                                   \
    static void run_##SUF(const void *a_, const Py_ssize_t *sa, int a_arr, double a_scalar,     \
                          const void *b_, const Py_ssize_t *sb, const void *i_, Py_ssize_t si,  \
                          void *o_, const Py_ssize_t *so, Py_ssize_t T, Py_ssize_t M,            \
                          int reverse)                                                          \
    {                                                                                           \
        const TYPE *a = (const TYPE *)a_, *b = (const TYPE *)b_, *init = (const TYPE *)i_;      \
        TYPE *out = (TYPE *)o_;                                                                 \
        TYPE as = (TYPE)a_scalar;                                                               \
        Py_ssize_t j = 0;                                                                       \
        if (sb[1] == 1 && so[1] == 1 && (!a_arr || sa[1] == 1)) {                               \
            Py_ssize_t lda = a_arr ? sa[0] : 0;                                                 \
            const TYPE *aj = a_arr ? a : &as;                                                   \
            for (; j + 64 <= M; j += 64)                                                        \
                fixed_##SUF##_64(aj + (a_arr ? j : 0), lda, a_arr, as, b + j, sb[0],            \
                                 init + j * si, si, out + j, so[0], T, reverse);                \
            for (; j + 8 <= M; j += 8)                                                          \
                fixed_##SUF##_8(aj + (a_arr ? j : 0), lda, a_arr, as, b + j, sb[0],             \
                                init + j * si, si, out + j, so[0], T, reverse);                 \
            if (j + 4 <= M) {                                                                   \
                fixed_##SUF##_4(aj + (a_arr ? j : 0), lda, a_arr, as, b + j, sb[0],             \
                                init + j * si, si, out + j, so[0], T, reverse);                 \
                j += 4;                                                                         \
            }                                                                                   \
            if (j + 2 <= M) {                                                                   \
                fixed_##SUF##_2(aj + (a_arr ? j : 0), lda, a_arr, as, b + j, sb[0],             \
                                init + j * si, si, out + j, so[0], T, reverse);                 \
                j += 2;                                                                         \
            }                                                                                   \
            if (j < M)                                                                          \
                fixed_##SUF##_1(aj + (a_arr ? j : 0), lda, a_arr, as, b + j, sb[0],             \
                                init + j * si, si, out + j, so[0], T, reverse);                 \
            return;                                                                             \
        }                                                                                       \
        for (; j < M; j += CH) {                                                                \
            Py_ssize_t n = M - j < CH ? M - j : CH;                                             \
            strided_##SUF(a_arr ? a + j * sa[1] : a, a_arr ? sa[0] : 0, a_arr ? sa[1] : 0,      \
                          a_arr, as, b + j * sb[1], sb[0], sb[1], init + j * si, si,             \
                          out + j * so[1], so[0], so[1], T, n, reverse);                        \
        }                                                                                       \
    }

DEFINE_DRIVER(float, f32)
DEFINE_DRIVER(double, f64)

/* ---- argument handling */

static int
little_endian(void)
{
    const unsigned int one = 1;
    return *(const unsigned char *)&one == 1;
}

/* 'f' / 'd' for a native-order float32 / float64 buffer, else 0 */
static char
kind_of(const Py_buffer *v)
{
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && little_endian()) || (*f == '>' && !little_endian()))
        f++;
    if (f[0] == 'f' && f[1] == '\0' && v->itemsize == 4)
        return 'f';
    if (f[0] == 'd' && f[1] == '\0' && v->itemsize == 8)
        return 'd';
    return 0;
}

/* element strides of a buffer of ndim dims (C-contiguous when the exporter gives none);
 * -1 when a byte stride is not a multiple of the item size or the data is misaligned */
static int
elem_strides(const Py_buffer *v, Py_ssize_t *st)
{
    int d;
    Py_ssize_t acc = 1;
    if ((size_t)v->buf % (size_t)v->itemsize)
        return -1;
    for (d = v->ndim - 1; d >= 0; d--) {
        if (v->strides) {
            if (v->strides[d] % v->itemsize)
                return -1;
            st[d] = v->strides[d] / v->itemsize;
        } else {
            st[d] = acc;
        }
        acc *= v->shape[d];
    }
    return 0;
}

static PyObject *
rec(PyObject *self, PyObject *args)
{
    PyObject *a_obj, *b_obj, *i_obj, *o_obj;
    int reverse;
    Py_buffer a = {0}, b = {0}, in = {0}, out = {0};
    int have_a = 0, have_b = 0, have_i = 0, have_o = 0, a_arr = 0;
    double a_scalar = 0.0;
    Py_ssize_t sa[2] = {0, 0}, sb[2], si[1], so[2], T, M;
    char k;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OOOOp:rec", &a_obj, &b_obj, &i_obj, &o_obj, &reverse))
        return NULL;
    if (PyObject_GetBuffer(b_obj, &b, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        goto done;
    have_b = 1;
    if (PyObject_GetBuffer(i_obj, &in, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        goto done;
    have_i = 1;
    if (PyObject_GetBuffer(o_obj, &out, PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        goto done;
    have_o = 1;
    k = kind_of(&b);
    if (!k || kind_of(&in) != k || kind_of(&out) != k) {
        PyErr_SetString(PyExc_TypeError, "rec: b, init and out must all be float32 or all float64");
        goto done;
    }
    if (b.ndim != 2 || out.ndim != 2 || in.ndim != 1) {
        PyErr_SetString(PyExc_ValueError, "rec: b and out must be 2-D, init 1-D");
        goto done;
    }
    T = b.shape[0];
    M = b.shape[1];
    if (out.shape[0] != T || out.shape[1] != M || in.shape[0] != M) {
        PyErr_SetString(PyExc_ValueError, "rec: shapes of b, init and out differ");
        goto done;
    }
    if (elem_strides(&b, sb) < 0 || elem_strides(&in, si) < 0 || elem_strides(&out, so) < 0) {
        PyErr_SetString(PyExc_ValueError, "rec: misaligned or odd strides");
        goto done;
    }
    if (PyObject_CheckBuffer(a_obj)) {
        if (PyObject_GetBuffer(a_obj, &a, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
            goto done;
        have_a = 1;
        if (kind_of(&a) != k) {
            PyErr_SetString(PyExc_TypeError, "rec: a must have the dtype of b");
            goto done;
        }
        if (a.ndim == 0) {
            a_scalar = k == 'f' ? (double)*(const float *)a.buf : *(const double *)a.buf;
        } else if (a.ndim == 2 && a.shape[0] == T && a.shape[1] == M) {
            if (elem_strides(&a, sa) < 0) {
                PyErr_SetString(PyExc_ValueError, "rec: misaligned or odd strides");
                goto done;
            }
            a_arr = 1;
        } else {
            PyErr_SetString(PyExc_ValueError, "rec: a must be a number or have the shape of b");
            goto done;
        }
    } else if (PyFloat_Check(a_obj) || PyLong_Check(a_obj)) {
        a_scalar = PyFloat_AsDouble(a_obj);
        if (a_scalar == -1.0 && PyErr_Occurred())
            goto done;
        if (k == 'f')  /* rounded to float32 once, as numpy's float32(a) rounds it */
            a_scalar = (double)(float)a_scalar;
    } else {
        PyErr_SetString(PyExc_TypeError, "rec: a must be a number or an array");
        goto done;
    }
    if (T > 0 && M > 0) {
        int release = T * M >= 2048;
        PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
        if (k == 'f')
            run_f32(a_arr ? a.buf : NULL, sa, a_arr, a_scalar, b.buf, sb, in.buf, si[0], out.buf,
                    so, T, M, reverse);
        else
            run_f64(a_arr ? a.buf : NULL, sa, a_arr, a_scalar, b.buf, sb, in.buf, si[0], out.buf,
                    so, T, M, reverse);
        if (release)
            PyEval_RestoreThread(ts);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    if (have_a)
        PyBuffer_Release(&a);
    if (have_b)
        PyBuffer_Release(&b);
    if (have_i)
        PyBuffer_Release(&in);
    if (have_o)
        PyBuffer_Release(&out);
    return result;
}

static PyObject *
rec_ptr(PyObject *self, PyObject *args)
{
    int kind, reverse;
    Py_ssize_t T, M, sa[2], sb[2], si, so[2];
    unsigned long long a, b, in, out;
    double a_scalar, i_scalar;
    if (!PyArg_ParseTuple(args, "CnnpKnndKnnKndKnn:rec_ptr", &kind, &T, &M, &reverse, &a, &sa[0],
                          &sa[1], &a_scalar, &b, &sb[0], &sb[1], &in, &si, &i_scalar, &out, &so[0],
                          &so[1]))
        return NULL;
    size_t size = kind == 'f' ? 4 : kind == 'd' ? 8 : 0;
    if (!size) {
        PyErr_SetString(PyExc_TypeError, "rec_ptr: kind must be 'f' or 'd'");
        return NULL;
    }
    if (T < 0 || M < 0 || !b || !out || (a % size) || (b % size) || (in % size) || (out % size)) {
        PyErr_SetString(PyExc_ValueError, "rec_ptr: bad sizes or misaligned addresses");
        return NULL;
    }
    if (T == 0 || M == 0)
        Py_RETURN_NONE;
    {
        double ibuf_d[1];
        float ibuf_f[1];
        const void *ip = (const void *)(uintptr_t)in;
        Py_ssize_t sip = si;
        if (!in) { /* a scalar carry: one element, stride 0 */
            ibuf_d[0] = i_scalar;
            ibuf_f[0] = (float)i_scalar;
            ip = kind == 'f' ? (const void *)ibuf_f : (const void *)ibuf_d;
            sip = 0;
        }
        if (kind == 'f')
            a_scalar = (double)(float)a_scalar;
        int release = T * M >= 2048;
        PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
        if (kind == 'f')
            run_f32((const void *)(uintptr_t)a, sa, a != 0, a_scalar, (const void *)(uintptr_t)b, sb,
                    ip, sip, (void *)(uintptr_t)out, so, T, M, reverse);
        else
            run_f64((const void *)(uintptr_t)a, sa, a != 0, a_scalar, (const void *)(uintptr_t)b, sb,
                    ip, sip, (void *)(uintptr_t)out, so, T, M, reverse);
        if (release)
            PyEval_RestoreThread(ts);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rec", rec, METH_VARARGS,
     "rec(a, b, init, out, reverse): out[t] = b[t] + a[t] * x, x = init then out[t], "
     "for t = T-1..0 (reverse) or 0..T-1; exact (one multiply, one add per step)."},
    {"rec_ptr", rec_ptr, METH_VARARGS,
     "rec_ptr(kind, T, M, reverse, a, sa0, sa1, a_scalar, b, sb0, sb1, init, si, init_scalar, out, "
     "so0, so1): rec on raw addresses and element strides (a / init == 0: the scalars)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recurrence_c",
    "Exact sequential linear recurrence over [T, M] float32 / float64 buffers (see rec).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__recurrence_c(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "VERSION", REC_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
