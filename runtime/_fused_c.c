/* A whole backward affine recurrence in one call: the loop body's arithmetic, then the loop.
 *
 * Why: the rewrite of a GAE loop used to run a dozen small torch ops per call (each 5-10 us of
 * dispatch on a CPU, whatever the size) around the exact recurrence kernel. This module takes the
 * body as a small program (runtime/fused.py compiles it from the loop's own statements) and runs
 * it over blocks of rows, then the recurrence, then the output stores: one call, no temporaries
 * allocated by torch.
 *
 *     run(kind, T, R, code, npre, seqs, consts, a, b, init, p0, outs, ns, last) -> None
 *
 * kind 'f' (float32) or 'd' (float64). Every array is given as a raw address (torch's data_ptr())
 * of contiguous CPU memory of that dtype; the caller (fused.py) checks the tensors.
 *   code: a tuple of int tuples, one instruction each (op, dst, x, y), see the OP_ constants; the
 *         first npre compute a block's coefficients, the rest (the post phase) run on the block
 *         once its carried values are known (OP_LOADS reads them: stores of `gae + values[t]`).
 *         Registers hold a block of rows, R elements per row; dst / x / y are register numbers,
 *         constant slots (for the *_S ops) or, for LOAD, a sequence number and a row offset k.
 *   seqs: a tuple of (address, width, tail address) -- width R (one row per step) or 1 (a number
 *         per step, broadcast over the row); tail 0 or the row read in place of row T.
 *   consts: a tuple of Python floats (rounded to the dtype here, as torch rounds a Python number
 *         meeting a tensor).
 *   a, b: (is_register, index): the coefficients of x[t] = b[t] + a[t] * x[t + 1].
 *   init: (address or 0, width, scalar): x[T] (a Python number when the address is 0).
 *   p0: None, or the first step's product a * x[T] already computed in Python (a constant a and a
 *       Python-number x[T]: the loop multiplies those in double precision).
 *   outs: output addresses (T rows of R from each); the first ns take the carried value x[t] at
 *         row t, the others are written by STORE instructions (dst: the output's slot).
 *   last: the address x[0] (R elements) is stored to, or 0 (not needed).
 *   rows, nrt (optional): an update that is not one multiply and one add, as written: its
 *         instructions over one row at a time (see rows_), with nrt row temporaries; a / b unused.
 * STORE instructions write a register's rows to an output (a temporary stored at [t]).
 *
 * Exactness: each instruction is one IEEE operation per element in the dtype, in the loop's
 * order; the recurrence is one multiply then one add per step. Built with -ffp-contract=off (no
 * FMA) and never fast-math (refused below), the results are bitwise the torch loop's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __FAST_MATH__
#error "_fused_c must not be built with -ffast-math: it would not be exact"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define FUSED_VERSION 3

enum {
    OP_LOAD = 0,  /* dst = seq x read at row t + y */
    OP_ADD,       /* dst = x + y */
    OP_SUB,       /* dst = x - y */
    OP_MUL,       /* dst = x * y */
    OP_DIV,       /* dst = x / y */
    OP_ADD_S,     /* dst = x + c[y] */
    OP_SUB_S,     /* dst = x - c[y] */
    OP_MUL_S,     /* dst = x * c[y] */
    OP_DIV_S,     /* dst = x / c[y] */
    OP_RSUB_S,    /* dst = c[y] - x */
    OP_RECIP,     /* dst = 1 / x */
    OP_NEG,       /* dst = -x */
    OP_STORE,     /* output dst (an address slot) rows t = x's rows */
    OP_LOADS,     /* dst = the carried value's rows (after the recurrence: the post phase only) */
    OP_COUNT
};

#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

/* rows per block: about 1024 elements, at least one row */
#define BLOCK_ELEMS 1024
#define MAX_REGS 64
#define MAX_SEQS 64
#define MAX_OUTS 16

typedef struct {
    int op, dst, x, y;
} Ins;

typedef struct {
    uintptr_t addr, tail;
    Py_ssize_t width;
} Seq;

#if defined(__GNUC__)
#define RESTRICT __restrict__
#else
#define RESTRICT
#endif

/* columns per step of the recurrence kernel: fixed, so that the compiler keeps them in registers */
#define W 8

#define DEFINE_RUN(TYPE, SUF)                                                                    \
    /* the rows t0 + k .. of a sequence: in place where they are its own contiguous rows,        \
     * else copied into the register's buffer (its tail row, a number per step broadcast) */     \
    static const TYPE *load_##SUF(TYPE *RESTRICT dst, const Seq *s, Py_ssize_t t0, Py_ssize_t n, \
                                  Py_ssize_t k, Py_ssize_t T, Py_ssize_t R)                      \
    {                                                                                            \
        Py_ssize_t r, j;                                                                         \
        if (s->width == R && !(s->tail && t0 + k + n > T))                                      \
            return (const TYPE *)s->addr + (t0 + k) * R;                                         \
        for (r = 0; r < n; r++) {                                                                \
            Py_ssize_t row = t0 + r + k;                                                         \
            const TYPE *src = (row == T && s->tail) ? (const TYPE *)s->tail                      \
                                                    : (const TYPE *)s->addr + row * s->width;    \
            TYPE *d = dst + r * R;                                                               \
            if (s->width == R)                                                                   \
                memcpy(d, src, (size_t)R * sizeof(TYPE));                                        \
            else                                                                                 \
                for (j = 0; j < R; j++)                                                          \
                    d[j] = src[0];                                                               \
        }                                                                                        \
        return dst;                                                                              \
    }                                                                                            \
                                                                                                 \
    static NOINLINE void vv_##SUF(int op, TYPE *RESTRICT d, const TYPE *RESTRICT x,              \
                                  const TYPE *RESTRICT y, Py_ssize_t m)                          \
    {                                                                                            \
        Py_ssize_t i;                                                                            \
        switch (op) {                                                                            \
        case OP_ADD: for (i = 0; i < m; i++) d[i] = x[i] + y[i]; break;                          \
        case OP_SUB: for (i = 0; i < m; i++) d[i] = x[i] - y[i]; break;                          \
        case OP_MUL: for (i = 0; i < m; i++) d[i] = x[i] * y[i]; break;                          \
        default: for (i = 0; i < m; i++) d[i] = x[i] / y[i]; break;                              \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    static NOINLINE void vs_##SUF(int op, TYPE *RESTRICT d, const TYPE *RESTRICT x, TYPE c,      \
                                  Py_ssize_t m)                                                  \
    {                                                                                            \
        Py_ssize_t i;                                                                            \
        switch (op) {                                                                            \
        case OP_ADD_S: for (i = 0; i < m; i++) d[i] = x[i] + c; break;                           \
        case OP_SUB_S: for (i = 0; i < m; i++) d[i] = x[i] - c; break;                           \
        case OP_MUL_S: for (i = 0; i < m; i++) d[i] = x[i] * c; break;                           \
        case OP_DIV_S: for (i = 0; i < m; i++) d[i] = x[i] / c; break;                           \
        case OP_RSUB_S: for (i = 0; i < m; i++) d[i] = c - x[i]; break;                          \
        case OP_RECIP: for (i = 0; i < m; i++) d[i] = (TYPE)1 / x[i]; break;                     \
        default: for (i = 0; i < m; i++) d[i] = -x[i]; break;                                    \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* one block of rows; reg[r] points at register r's values for this block (its own buffer   \
     * own[r], or a sequence's rows read in place) */                                            \
    static void exec_##SUF(const Ins *code, int ncode, TYPE **own, const TYPE **reg,             \
                           const TYPE *c, const Seq *seqs, TYPE **outs, Py_ssize_t t0,           \
                           Py_ssize_t n, Py_ssize_t T, Py_ssize_t R, const TYPE *xblk)           \
    {                                                                                            \
        Py_ssize_t m = n * R;                                                                    \
        int p;                                                                                   \
        for (p = 0; p < ncode; p++) {                                                            \
            const Ins *in = code + p;                                                            \
            if (in->op == OP_STORE) {                                                            \
                memcpy(outs[in->dst] + t0 * R, reg[in->x], (size_t)m * sizeof(TYPE));            \
                continue;                                                                        \
            }                                                                                    \
            if (in->op == OP_LOADS) {                                                            \
                reg[in->dst] = xblk;                                                             \
                continue;                                                                        \
            }                                                                                    \
            TYPE *d = own[in->dst];                                                              \
            if (in->op == OP_LOAD) {                                                             \
                reg[in->dst] = load_##SUF(d, seqs + in->x, t0, n, in->y, T, R);                  \
                continue;                                                                        \
            }                                                                                    \
            if (in->op <= OP_DIV)                                                                \
                vv_##SUF(in->op, d, reg[in->x], reg[in->y], m);                                  \
            else                                                                                 \
                vs_##SUF(in->op, d, reg[in->x], in->op <= OP_RSUB_S ? c[in->y] : (TYPE)0, m);    \
            reg[in->dst] = d;                                                                    \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* one block's rows t = n-1 .. 0 (relative): x[t] = b[t] + a[t] * x[t + 1], columns j0 ..      \
     * j0 + w (w <= W); a / b: the block's [n, R] values or the scalars as / bs; v0: x[n] */     \
    static NOINLINE void recur_##SUF(const TYPE *a, TYPE as, const TYPE *b, TYPE bs, TYPE *x,    \
                                     const TYPE *v0, Py_ssize_t n, Py_ssize_t R, Py_ssize_t j0,  \
                                     Py_ssize_t w)                                               \
    {                                                                                            \
        TYPE v[W];                                                                               \
        Py_ssize_t t, j;                                                                         \
        for (j = 0; j < w; j++)                                                                  \
            v[j] = v0[j0 + j];                                                                   \
        if (w == W && a && b) {                                                                  \
            for (t = n - 1; t >= 0; t--) {                                                       \
                const TYPE *aa = a + t * R + j0, *bb = b + t * R + j0;                           \
                TYPE *xo = x + t * R + j0;                                                       \
                for (j = 0; j < W; j++) {                                                        \
                    TYPE p = aa[j] * v[j];                                                       \
                    v[j] = bb[j] + p;                                                            \
                }                                                                                \
                for (j = 0; j < W; j++)                                                          \
                    xo[j] = v[j];                                                                \
            }                                                                                    \
            return;                                                                              \
        }                                                                                        \
        for (t = n - 1; t >= 0; t--) {                                                           \
            TYPE *xo = x + t * R + j0;                                                           \
            for (j = 0; j < w; j++) {                                                            \
                TYPE p = (a ? a[t * R + j0 + j] : as) * v[j];                                    \
                v[j] = (b ? b[t * R + j0 + j] : bs) + p;                                         \
                xo[j] = v[j];                                                                    \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* the block's rows into x (n rows of R), carry: x[n] on entry, x[0] on return; first: the   \
     * block holds the loop's first step t = T-1 (its last row), which meets the value before    \
     * the loop (init, or the number is; p0: the product a * x[T] computed in Python) */         \
    static void block_##SUF(const TYPE *a, TYPE as, const TYPE *b, TYPE bs, TYPE *x, TYPE *carry, \
                            Py_ssize_t n, Py_ssize_t R, int first, const TYPE *init,             \
                            Py_ssize_t iw, TYPE is, int have_p0, TYPE p0)                        \
    {                                                                                            \
        Py_ssize_t j;                                                                            \
        if (first) {                                                                             \
            TYPE *xt = x + (n - 1) * R;                                                          \
            const TYPE *at = a ? a + (n - 1) * R : NULL, *bt = b ? b + (n - 1) * R : NULL;       \
            for (j = 0; j < R; j++) {                                                            \
                TYPE prev = init ? init[iw == R ? j : 0] : is;                                   \
                TYPE p = have_p0 ? p0 : (at ? at[j] : as) * prev;                                \
                xt[j] = (bt ? bt[j] : bs) + p;                                                   \
            }                                                                                    \
            memcpy(carry, xt, (size_t)R * sizeof(TYPE));                                         \
            n -= 1;                                                                              \
        }                                                                                        \
        if (n > 0) {                                                                             \
            for (j = 0; j < R; j += W)                                                           \
                recur_##SUF(a, as, b, bs, x, carry, n, R, j, R - j < W ? R - j : W);             \
            memcpy(carry, x, (size_t)R * sizeof(TYPE));                                          \
        }                                                                                        \
    }

#define DEFINE_ROWS(TYPE, SUF)                                                                   \
    /* the update as written, row by row (an update that is not one multiply and one add of the  \
     * carried value): rc[i] = (op, dst, x, y) over rows of R; an operand >= 0 is a block          \
     * register (its row r), -1 the carried value before the step, -(k + 1) the row temporary k;  \
     * _S ops take the constant c[y]; the last instruction gives the new carried value.           \
     * carry: x[n] on entry (the value before the loop in the first block), x[0] on return. */    \
    static void rows_##SUF(const Ins *rc, int nrc, const TYPE **reg, const TYPE *c, TYPE *tmp,   \
                           TYPE *x, TYPE *carry, Py_ssize_t n, Py_ssize_t R)                     \
    {                                                                                            \
        Py_ssize_t r, i;                                                                         \
        int p;                                                                                   \
        for (r = n - 1; r >= 0; r--) {                                                           \
            const TYPE *prev = r == n - 1 ? carry : x + (r + 1) * R;                             \
            TYPE *d = tmp;                                                                       \
            for (p = 0; p < nrc; p++) {                                                          \
                const Ins *in = rc + p;                                                          \
                const TYPE *a = in->x >= 0 ? reg[in->x] + r * R : in->x == -1 ? prev : tmp + (Py_ssize_t)(-in->x - 1) * R; \
                d = p == nrc - 1 ? x + r * R : tmp + (Py_ssize_t)(-in->dst - 1) * R;            \
                if (in->op <= OP_DIV) {                                                          \
                    const TYPE *b = in->y >= 0 ? reg[in->y] + r * R : in->y == -1 ? prev : tmp + (Py_ssize_t)(-in->y - 1) * R; \
                    switch (in->op) {                                                            \
                    case OP_ADD: for (i = 0; i < R; i++) d[i] = a[i] + b[i]; break;              \
                    case OP_SUB: for (i = 0; i < R; i++) d[i] = a[i] - b[i]; break;              \
                    case OP_MUL: for (i = 0; i < R; i++) d[i] = a[i] * b[i]; break;              \
                    default: for (i = 0; i < R; i++) d[i] = a[i] / b[i]; break;                  \
                    }                                                                            \
                } else {                                                                         \
                    TYPE cy = in->op <= OP_RSUB_S ? c[in->y] : (TYPE)0;                          \
                    switch (in->op) {                                                            \
                    case OP_ADD_S: for (i = 0; i < R; i++) d[i] = a[i] + cy; break;              \
                    case OP_SUB_S: for (i = 0; i < R; i++) d[i] = a[i] - cy; break;              \
                    case OP_MUL_S: for (i = 0; i < R; i++) d[i] = a[i] * cy; break;              \
                    case OP_DIV_S: for (i = 0; i < R; i++) d[i] = a[i] / cy; break;              \
                    case OP_RSUB_S: for (i = 0; i < R; i++) d[i] = cy - a[i]; break;             \
                    case OP_RECIP: for (i = 0; i < R; i++) d[i] = (TYPE)1 / a[i]; break;         \
                    default: for (i = 0; i < R; i++) d[i] = -a[i]; break;                        \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        memcpy(carry, x, (size_t)R * sizeof(TYPE));                                              \
    }

DEFINE_RUN(float, f32)
DEFINE_RUN(double, f64)
DEFINE_ROWS(float, f32)
DEFINE_ROWS(double, f64)

static int
parse_pair(PyObject *o, int *is_reg, Py_ssize_t *idx)
{
    int r;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(o, "pn", &r, &i))
        return -1;
    *is_reg = r;
    *idx = i;
    return 0;
}

static PyObject *
run(PyObject *self, PyObject *args)
{
    int kind;
    Py_ssize_t T, R;
    PyObject *code_o, *seqs_o, *consts_o, *a_o, *b_o, *init_o, *p0_o, *outs_o;
    unsigned long long last;
    Py_ssize_t ns, npre, nrt = 0;
    PyObject *rows_o = NULL;
    if (!PyArg_ParseTuple(args, "CnnO!nO!O!O!O!O!OO!nK|O!n:run", &kind, &T, &R, &PyTuple_Type, &code_o,
                          &npre, &PyTuple_Type, &seqs_o, &PyTuple_Type, &consts_o, &PyTuple_Type,
                          &a_o, &PyTuple_Type, &b_o, &PyTuple_Type, &init_o, &p0_o, &PyTuple_Type,
                          &outs_o, &ns, &last, &PyTuple_Type, &rows_o, &nrt))
        return NULL;
    Py_ssize_t nrow = rows_o ? PyTuple_GET_SIZE(rows_o) : 0;
    if (nrt < 0 || nrt > MAX_REGS || (nrow && nrt < nrow - 1)) {
        PyErr_SetString(PyExc_ValueError, "run: bad row program");
        return NULL;
    }
    size_t size = kind == 'f' ? 4 : kind == 'd' ? 8 : 0;
    if (!size || T < 1 || R < 1) {
        PyErr_SetString(PyExc_ValueError, "run: bad kind, sizes or address");
        return NULL;
    }
    Py_ssize_t ncode = PyTuple_GET_SIZE(code_o), nseq = PyTuple_GET_SIZE(seqs_o);
    Py_ssize_t nconst = PyTuple_GET_SIZE(consts_o), nout = PyTuple_GET_SIZE(outs_o);
    if (nseq > MAX_SEQS || nout > MAX_OUTS || ns < 0 || ns > nout || npre < 0 || npre > ncode) {
        PyErr_SetString(PyExc_ValueError, "run: too many sequences or outputs");
        return NULL;
    }
    Seq seqs[MAX_SEQS];
    uintptr_t outs[MAX_OUTS];
    Py_ssize_t i;
    for (i = 0; i < nseq; i++) {
        unsigned long long addr, tail;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(seqs_o, i), "KnK", &addr, &seqs[i].width, &tail))
            return NULL;
        seqs[i].addr = (uintptr_t)addr;
        seqs[i].tail = (uintptr_t)tail;
        if (!addr || (seqs[i].width != 1 && seqs[i].width != R) || addr % size || tail % size) {
            PyErr_SetString(PyExc_ValueError, "run: bad sequence");
            return NULL;
        }
    }
    for (i = 0; i < nout; i++) {
        unsigned long long addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(outs_o, i));
        if (PyErr_Occurred())
            return NULL;
        if (!addr || addr % size) {
            PyErr_SetString(PyExc_ValueError, "run: bad output address");
            return NULL;
        }
        outs[i] = (uintptr_t)addr;
    }
    double *cd = (double *)PyMem_Malloc(sizeof(double) * (size_t)(nconst + 1));
    Ins *code = (Ins *)PyMem_Malloc(sizeof(Ins) * (size_t)(ncode + nrow + 1));
    void *scratch = NULL;
    PyObject *result = NULL;
    if (!cd || !code) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < nconst; i++) {
        cd[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(consts_o, i));
        if (cd[i] == -1.0 && PyErr_Occurred())
            goto done;
    }
    int nreg = 0;
    for (i = 0; i < ncode; i++) {
        Ins *in = code + i;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(code_o, i), "iiii", &in->op, &in->dst, &in->x, &in->y))
            goto done;
        int bad = in->op < 0 || in->op >= OP_COUNT || (in->op == OP_LOADS && i < npre);
        if (!bad && in->op == OP_LOADS)
            bad = in->dst < 0 || in->dst >= MAX_REGS;
        if (!bad && in->op == OP_LOADS) {
            if (in->dst + 1 > nreg)
                nreg = in->dst + 1;
        } else if (!bad && in->op == OP_STORE)
            bad = in->dst < ns || in->dst >= nout || in->x < 0 || in->x >= MAX_REGS;
        else if (!bad) {
            bad = in->dst < 0 || in->dst >= MAX_REGS;
            if (in->op == OP_LOAD)
                bad = bad || in->x < 0 || in->x >= nseq || in->y < 0 || in->y > 64;
            else
                bad = bad || in->x < 0 || in->x >= MAX_REGS;
            if (in->op >= OP_ADD && in->op <= OP_DIV)
                bad = bad || in->y < 0 || in->y >= MAX_REGS;
            if (in->op >= OP_ADD_S && in->op <= OP_RSUB_S)
                bad = bad || in->y < 0 || in->y >= nconst;
            if (in->dst + 1 > nreg)
                nreg = in->dst + 1;
        }
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "run: bad instruction");
            goto done;
        }
    }
    for (i = 0; i < ncode; i++) { /* registers read: ones some instruction writes */
        const Ins *in = code + i;
        int rx = in->op != OP_LOAD && in->op != OP_LOADS, ry = in->op >= OP_ADD && in->op <= OP_DIV;
        if ((rx && in->x >= nreg) || (ry && in->y >= nreg)) {
            PyErr_SetString(PyExc_ValueError, "run: bad instruction");
            goto done;
        }
    }
    Ins *rowc = code + ncode;
    for (i = 0; i < nrow; i++) { /* the row program: operands checked against nreg / nrt */
        Ins *in = rowc + i;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(rows_o, i), "iiii", &in->op, &in->dst, &in->x, &in->y))
            goto done;
        int two = in->op >= OP_ADD && in->op <= OP_DIV, one = in->op >= OP_ADD_S && in->op <= OP_NEG;
        int bad = !(two || one) || in->x >= nreg || in->x < -1 - (int)nrt ||
                  (i < nrow - 1 && (in->dst > -2 || in->dst < -1 - (int)nrt));
        if (two)
            bad = bad || in->y >= nreg || in->y < -1 - (int)nrt;
        if (in->op >= OP_ADD_S && in->op <= OP_RSUB_S)
            bad = bad || in->y < 0 || in->y >= nconst;
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "run: bad row instruction");
            goto done;
        }
    }
    int a_reg, b_reg;
    Py_ssize_t a_idx, b_idx;
    if (parse_pair(a_o, &a_reg, &a_idx) < 0 || parse_pair(b_o, &b_reg, &b_idx) < 0)
        goto done;
    if ((a_reg && (a_idx < 0 || a_idx >= nreg)) || (!a_reg && (a_idx < 0 || a_idx >= nconst)) ||
        (b_reg && (b_idx < 0 || b_idx >= nreg)) || (!b_reg && (b_idx < 0 || b_idx >= nconst)) ||
        (!a_reg && !b_reg && !nrow)) {
        PyErr_SetString(PyExc_ValueError, "run: bad coefficients");
        goto done;
    }
    unsigned long long init_addr;
    Py_ssize_t init_w;
    double init_s;
    if (!PyArg_ParseTuple(init_o, "Knd", &init_addr, &init_w, &init_s))
        goto done;
    if (init_addr && ((init_w != 1 && init_w != R) || init_addr % size)) {
        PyErr_SetString(PyExc_ValueError, "run: bad initial value");
        goto done;
    }
    int have_p0 = p0_o != Py_None;
    double p0 = 0.0;
    if (have_p0) {
        p0 = PyFloat_AsDouble(p0_o);
        if (p0 == -1.0 && PyErr_Occurred())
            goto done;
    }
    {
        Py_ssize_t rows = R >= BLOCK_ELEMS ? 1 : BLOCK_ELEMS / R;
        if (rows > T)
            rows = T;
        size_t blk = (size_t)(rows * R);
        size_t nr = (size_t)(nreg ? nreg : 1);
        /* constants, registers, the carried rows of a block (when no output takes them), a row */
        scratch = PyMem_Malloc(size * ((size_t)nconst + blk * nr + (ns ? 0 : blk) + (size_t)R * (2 + (size_t)nrt)));
        if (!scratch) {
            PyErr_NoMemory();
            goto done;
        }
        int release = T * R >= 2048;
        PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
        Py_ssize_t t0, j;
        /* blocks from the last rows down: the recurrence runs backward through each block as soon
         * as its coefficients are computed */
#define BODY(TYPE, SUF)                                                                          \
        {                                                                                        \
            TYPE *cs = (TYPE *)scratch, *base = cs + nconst, *own[MAX_REGS], *ob[MAX_OUTS];      \
            const TYPE *reg[MAX_REGS];                                                           \
            TYPE *xs = base + blk * nr, *carry = xs + (ns ? 0 : blk);                            \
            for (j = 0; j < nreg; j++)                                                           \
                reg[j] = own[j] = base + blk * (size_t)j;                                        \
            for (j = 0; j < nconst; j++)                                                         \
                cs[j] = (TYPE)cd[j];                                                             \
            for (j = 0; j < nout; j++)                                                           \
                ob[j] = (TYPE *)outs[j];                                                         \
            Py_ssize_t nb = (T + rows - 1) / rows, k;                                            \
            for (k = nb - 1; k >= 0; k--) {                                                      \
                t0 = k * rows;                                                                   \
                Py_ssize_t n = T - t0 < rows ? T - t0 : rows;                                    \
                exec_##SUF(code, (int)npre, own, reg, cs, seqs, ob, t0, n, T, R, NULL);          \
                TYPE *x = ns ? ob[0] + t0 * R : xs;                                              \
                if (nrow) { /* the update as written, row by row */                              \
                    if (k == nb - 1) { /* the value before the loop (a row, or one number) */     \
                        const TYPE *ip = (const TYPE *)(uintptr_t)init_addr;                     \
                        for (j = 0; j < R; j++)                                                  \
                            carry[j] = ip ? ip[init_w == R ? j : 0] : (TYPE)init_s;              \
                    }                                                                            \
                    rows_##SUF(rowc, (int)nrow, reg, cs, carry + R, x, carry, n, R);             \
                } else                                                                           \
                    block_##SUF(a_reg ? reg[a_idx] : NULL, a_reg ? (TYPE)0 : cs[a_idx],          \
                                b_reg ? reg[b_idx] : NULL, b_reg ? (TYPE)0 : cs[b_idx], x, carry, \
                                n, R, k == nb - 1, (const TYPE *)(uintptr_t)init_addr, init_w,   \
                                (TYPE)init_s, have_p0, (TYPE)p0);                                \
                for (j = 1; j < ns; j++)                                                         \
                    memcpy(ob[j] + t0 * R, x, (size_t)(n * R) * sizeof(TYPE));                   \
                if (npre < ncode) /* the post phase: stores of expressions of the carried value */ \
                    exec_##SUF(code + npre, (int)(ncode - npre), own, reg, cs, seqs, ob, t0, n,  \
                               T, R, x);                                                         \
            }                                                                                    \
            if (last)                                                                            \
                memcpy((TYPE *)(uintptr_t)last, carry, (size_t)R * sizeof(TYPE));                \
        }
        if (kind == 'f')
            BODY(float, f32)
        else
            BODY(double, f64)
#undef BODY
        if (release)
            PyEval_RestoreThread(ts);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(cd);
    PyMem_Free(code);
    PyMem_Free(scratch);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(kind, T, R, code, npre, seqs, consts, a, b, init, p0, outs, ns, last): the body's program over "
     "blocks of rows, then x[t] = b[t] + a[t] * x[t + 1] for t = T-1..0 (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fused_c",
    "A backward affine recurrence and the arithmetic that feeds it, in one exact pass.", -1, methods,
};

PyMODINIT_FUNC
PyInit__fused_c(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "VERSION", FUSED_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
