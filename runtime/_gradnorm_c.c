/* The gradient guard's healthy CPU step in one call: the norm of an optimizer's gradients and
 * the guard's history update (runtime/stabilizer.py).
 *
 * Why: the guard runs between backward() and step() of every training step. On a small model
 * each torch op there costs more than its arithmetic (microseconds of dispatch, most of it cold
 * code and data after backward), and torch._foreach_norm on CPU is one op per tensor plus one
 * .item() each: about 6% of a 17-64-64-6 MLP's Adam step, the Python bookkeeping around it
 * another 2%. This reads the gradients' memory directly, with no torch op, and keeps the history
 * in C members. Optional: without it (no compiler at install) the guard measures with torch ops
 * and keeps the history in Python, with the same arithmetic.
 *
 *     sumsq(params, tensor_type, dtype, is_double) -> float | None
 *
 * params: a list of parameters. For each one whose .grad is not None the gradient must be exactly
 * of type tensor_type (torch.Tensor: no subclass), on the CPU, of dtype ``dtype`` (float32, or
 * float64 with is_double true), and contiguous; its elements are squared and summed in double
 * (a float32 gradient cannot overflow it, and NaN/inf propagate). Returns the sum, -1.0 when no
 * parameter has a gradient, and None as soon as one gradient is anything else (sparse,
 * strided, another device or dtype, a subclass): the caller then uses torch. Everything about a
 * gradient is read on each call (nothing cached here: .grad may be a new tensor each step, and
 * ``p.data = ...`` may move a parameter under the same object).
 *
 * Reads only: the gradients are never written. The GIL is held throughout (the tensors stay
 * alive and unchanged by other Python threads while they are read).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>

/* bumped whenever sumsq's contract changes; stabilizer.py refuses a stale build */
#define GRADNORM_VERSION 2

static PyObject *s_grad, *s_dtype, *s_is_cpu, *s_is_contiguous, *s_numel, *s_data_ptr;

/* eight partial sums: gcc vectorises them into four independent chains of two doubles (one
 * chain is bound by the add latency, about one element per cycle) */
#define DEFINE_SUMSQ(TYPE, SUF)                                                       \
    static double sumsq_##SUF(const TYPE *x, Py_ssize_t m)                             \
    {                                                                                  \
        double a[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                        \
        Py_ssize_t k = 0;                                                              \
        int j;                                                                         \
        for (; k + 8 <= m; k += 8)                                                     \
            for (j = 0; j < 8; j++) {                                                  \
                double v = x[k + j];                                                   \
                a[j] += v * v;                                                         \
            }                                                                          \
        for (; k < m; k++) {                                                           \
            double v = x[k];                                                           \
            a[0] += v * v;                                                             \
        }                                                                              \
        return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));      \
    }

DEFINE_SUMSQ(float, f)
DEFINE_SUMSQ(double, d)

/* 1: added this gradient's squares to *total; 0: no gradient; -1: not one this module reads */
static int add_grad(PyObject *param, PyObject *ttype, PyObject *dtype, int is_double, double *total)
{
    PyObject *g = PyObject_GetAttr(param, s_grad), *r = NULL;
    Py_ssize_t m;
    void *x;
    int ok = -1;
    if (g == NULL)
        return -1;
    if (g == Py_None) {
        Py_DECREF(g);
        return 0;
    }
    if ((PyObject *)Py_TYPE(g) != ttype)
        goto done;
    r = PyObject_GetAttr(g, s_is_cpu);
    if (r != Py_True)
        goto done;
    Py_CLEAR(r);
    r = PyObject_GetAttr(g, s_dtype);
    if (r != dtype)
        goto done;
    Py_CLEAR(r);
    r = PyObject_CallMethodNoArgs(g, s_is_contiguous); /* sparse layouts: False */
    if (r != Py_True)
        goto done;
    Py_CLEAR(r);
    r = PyObject_CallMethodNoArgs(g, s_numel);
    if (r == NULL || (m = PyLong_AsSsize_t(r)) < 0)
        goto done;
    Py_CLEAR(r);
    if (m > 0) {
        r = PyObject_CallMethodNoArgs(g, s_data_ptr);
        if (r == NULL || (x = PyLong_AsVoidPtr(r)) == NULL)
            goto done;
        *total += is_double ? sumsq_d((const double *)x, m) : sumsq_f((const float *)x, m);
    }
    ok = 1;
done:
    Py_XDECREF(r);
    Py_DECREF(g);
    return ok;
}

/* the sum of squares of params' gradients: 1 and *total, 0: no gradient at all, -1: refused */
static int sum_grads(PyObject *params, PyObject *ttype, PyObject *dtype, int is_double, double *total)
{
    Py_ssize_t i, n = PyList_GET_SIZE(params);
    int any = 0;
    *total = 0.0;
    for (i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(params, i);
        int got;
        Py_INCREF(p); /* a .grad getter may run Python code that mutates the list */
        got = add_grad(p, ttype, dtype, is_double, total);
        Py_DECREF(p);
        if (got < 0) {
            PyErr_Clear();
            return -1;
        }
        any |= got;
        if (PyList_GET_SIZE(params) != n) /* mutated under us: let torch do it */
            return -1;
    }
    return any;
}

static PyObject *sumsq(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    double total;
    int is_double, got;
    (void)self;
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "sumsq(params: list, tensor_type: type, dtype, is_double: bool)");
        return NULL;
    }
    is_double = PyObject_IsTrue(args[3]);
    if (is_double < 0)
        return NULL;
    got = sum_grads(args[0], args[1], args[2], is_double, &total);
    if (got < 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(got ? total : -1.0);
}

/* ---------------------------------------------------------------- the healthy step, whole
 *
 * State: the base of stabilizer._Guard when this module is built. Its members are the guard's
 * history and cached parameter list, read and written by the Python code as plain attributes
 * and here by ``step``.
 *
 *     step(guard, optimizer, spike, z, ratio, warmup) -> float | None
 *     fast(optimizer, site, spike, z, ratio, warmup) -> float | None
 *
 * The guard's healthy CPU step in one call: checks that guard.ref is the optimizer and that its
 * param_groups are still the cached ones (guard.key: a (params list, length) pair per group), sums
 * the gradients' squares (sum_grads), and when the norm is finite and no spike (z, ratio, warmup:
 * stabilizer._threshold's rule, once guard.count >= warmup) updates the window maximum (wmax, wn),
 * the call count and the exponentially weighted history (mean, var, count) with the arithmetic of
 * stabilizer._update and _host_step (each operation one rounded double operation, in the same
 * order; built without FMA contraction) and returns the norm. None for anything else (another
 * optimizer or changed groups, no gradient, a gradient it does not read, a non-finite norm, a
 * spike): nothing is changed then and the Python guard decides. ``fast`` finds the guard in the
 * configured table (stabilizer._known) by (id(optimizer), site) first, and calls the configured
 * window callback (stabilizer._window) on a window's first and last step, as stabilize() does.
 */
typedef struct {
    PyObject_HEAD
    PyObject *ref;     /* weakref to the optimizer, or the optimizer itself (no weak references) */
    PyObject *key;     /* tuple of (params list, length) per group, or None */
    PyObject *params;  /* the distinct parameters (list) */
    PyObject *c_dtype; /* dtype of the gradients read here, None: not read here */
    char c_double;
    long long count, wn, calls;
    double mean, var, wmax;
} State;

static PyObject *g_ttype = NULL; /* torch.Tensor */
static double g_alpha = 0.97;
static PyObject *s_param_groups, *s_params;

static int state_traverse(State *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ref);
    Py_VISIT(self->key);
    Py_VISIT(self->params);
    Py_VISIT(self->c_dtype);
    return 0;
}

static int state_clear(State *self)
{
    Py_CLEAR(self->ref);
    Py_CLEAR(self->key);
    Py_CLEAR(self->params);
    Py_CLEAR(self->c_dtype);
    return 0;
}

static void state_dealloc(State *self)
{
    PyObject_GC_UnTrack(self);
    state_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    State *self = (State *)type->tp_alloc(type, 0);
    (void)args;
    (void)kwds;
    if (self == NULL)
        return NULL;
    Py_INCREF(Py_None); self->ref = Py_None;
    Py_INCREF(Py_None); self->key = Py_None;
    self->params = PyList_New(0);
    Py_INCREF(Py_None); self->c_dtype = Py_None;
    self->wmax = -Py_HUGE_VAL;
    if (self->params == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyMemberDef state_members[] = {
    {"ref", T_OBJECT, offsetof(State, ref), 0, "weakref to the optimizer (or the optimizer)"},
    {"key", T_OBJECT, offsetof(State, key), 0, "(params list, length) per group, or None"},
    {"params", T_OBJECT, offsetof(State, params), 0, "the distinct parameters"},
    {"c_dtype", T_OBJECT, offsetof(State, c_dtype), 0, "dtype read here, None: torch measures"},
    {"c_double", T_BOOL, offsetof(State, c_double), 0, "c_dtype is float64"},
    {"count", T_LONGLONG, offsetof(State, count), 0, "steps in the history"},
    {"wn", T_LONGLONG, offsetof(State, wn), 0, "steps in the current window"},
    {"calls", T_LONGLONG, offsetof(State, calls), 0, "guard calls"},
    {"mean", T_DOUBLE, offsetof(State, mean), 0, "EW mean of the norm"},
    {"var", T_DOUBLE, offsetof(State, var), 0, "EW variance of the norm"},
    {"wmax", T_DOUBLE, offsetof(State, wmax), 0, "window maximum"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scalebox_cst.runtime._gradnorm_c.State",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "History and cached parameters of one guard (the base of stabilizer._Guard).",
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_new = state_new,
    .tp_members = state_members,
};

/* 1: the optimizer's groups are the cached ones; 0: not (or unreadable) */
static int same_groups(State *g, PyObject *optimizer)
{
    PyObject *groups, *key = g->key;
    Py_ssize_t i, n;
    int same = 0;
    if (!PyTuple_CheckExact(key))
        return 0;
    groups = PyObject_GetAttr(optimizer, s_param_groups);
    if (groups == NULL) {
        PyErr_Clear();
        return 0;
    }
    n = PyTuple_GET_SIZE(key);
    if (!PyList_CheckExact(groups) || PyList_GET_SIZE(groups) != n)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *group = PyList_GET_ITEM(groups, i), *pair = PyTuple_GET_ITEM(key, i), *plist;
        if (!PyDict_CheckExact(group) || !PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            goto done;
        plist = PyDict_GetItemWithError(group, s_params); /* borrowed */
        if (plist == NULL || plist != PyTuple_GET_ITEM(pair, 0) || !PyList_CheckExact(plist) ||
            PyList_GET_SIZE(plist) != PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_Clear();
            goto done;
        }
    }
    same = 1;
done:
    Py_DECREF(groups);
    return same;
}

/* the healthy step on guard g for optimizer; 1: done, *value the norm; 0: not (nothing changed) */
static int do_step(State *g, PyObject *optimizer, PyObject *spike_o, PyObject *z_o, PyObject *ratio_o,
                   PyObject *warmup_o, double *value_out)
{
    PyObject *owner;
    double total, value, z, ratio, w, delta;
    long long warmup;
    int spike;
    if (g_ttype == NULL || g->c_dtype == Py_None || !PyList_CheckExact(g->params))
        return 0;
    if (PyWeakref_Check(g->ref)) {
#if PY_VERSION_HEX >= 0x030D0000
        if (PyWeakref_GetRef(g->ref, &owner) < 0) {
            PyErr_Clear();
            return 0;
        }
        Py_XDECREF(owner); /* only compared: the caller's reference keeps the optimizer alive */
#else
        owner = PyWeakref_GET_OBJECT(g->ref); /* borrowed; None once dead */
#endif
    } else {
        owner = g->ref;
    }
    if (owner != optimizer || !same_groups(g, optimizer))
        return 0;
    spike = PyObject_IsTrue(spike_o);
    z = PyFloat_AsDouble(z_o);
    ratio = PyFloat_AsDouble(ratio_o);
    warmup = PyLong_AsLongLong(warmup_o);
    if (spike < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (sum_grads(g->params, g_ttype, g->c_dtype, g->c_double, &total) <= 0)
        return 0;
    value = sqrt(total);
    if (!(value < Py_HUGE_VAL))
        return 0; /* NaN or inf: the step is skipped by the Python guard */
    if (spike && g->count >= warmup) {
        double var = 0.0 > g->var ? 0.0 : g->var; /* _threshold: max(mean + z * sqrt(max(var, 0)), ratio * mean), as Python's max picks */
        double a = g->mean + z * sqrt(var), b = ratio * g->mean;
        double thr = b > a ? b : a;
        if (value > thr)
            return 0; /* a spike: clipped by the Python guard */
    }
    g->calls += 1;
    if (g->wmax == g->wmax && !(value <= g->wmax))
        g->wmax = value;
    g->wn += 1;
    /* _update: w = max(1 - alpha, 1 / (count + 1)) */
    w = 1.0 / (double)(g->count + 1);
    if (!(w > 1.0 - g_alpha))
        w = 1.0 - g_alpha;
    delta = value - g->mean;
    g->mean += w * delta;
    g->var = (1.0 - w) * (g->var + w * delta * delta);
    g->count += 1;
    *value_out = value;
    return 1;
}

static PyObject *step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    double value;
    (void)self;
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &StateType)) {
        PyErr_SetString(PyExc_TypeError, "step(guard: State, optimizer, spike, z, ratio, warmup)");
        return NULL;
    }
    if (!do_step((State *)args[0], args[1], args[2], args[3], args[4], args[5], &value))
        Py_RETURN_NONE;
    return PyFloat_FromDouble(value);
}

static PyObject *g_known = NULL;  /* stabilizer._known: (id(optimizer), site) -> guard */
static PyObject *g_window = NULL; /* stabilizer._window(guard): a window's first or last step */
static long long g_record_every = 8;

/* fast(optimizer, site, spike, z, ratio, warmup) -> float | None: step() on the guard that
 * stabilizer._known holds for (id(optimizer), site), then _window(guard) on a window's first
 * and last step, as stabilize() does */
static PyObject *fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *id, *key, *guard;
    double value;
    int done;
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "fast(optimizer, site, spike, z, ratio, warmup)");
        return NULL;
    }
    if (g_known == NULL || !PyDict_CheckExact(g_known))
        Py_RETURN_NONE;
    id = PyLong_FromVoidPtr(args[0]); /* what id() returns */
    if (id == NULL)
        return NULL;
    key = PyTuple_Pack(2, id, args[1]);
    Py_DECREF(id);
    if (key == NULL)
        return NULL;
    guard = PyDict_GetItemWithError(g_known, key); /* borrowed */
    Py_DECREF(key);
    if (guard == NULL) {
        if (PyErr_Occurred())
            return NULL; /* an unhashable site: as the Python lookup would */
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(guard, &StateType))
        Py_RETURN_NONE;
    Py_INCREF(guard); /* .grad getters and param_groups may run Python code */
    done = do_step((State *)guard, args[0], args[2], args[3], args[4], args[5], &value);
    if (done && g_window != NULL) {
        State *g = (State *)guard;
        if (g->wn == 1 || g->wn >= g_record_every) {
            PyObject *r = PyObject_CallOneArg(g_window, guard);
            if (r == NULL) {
                Py_DECREF(guard);
                return NULL;
            }
            Py_DECREF(r);
        }
    }
    Py_DECREF(guard);
    if (!done)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(value);
}

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5 || !PyType_Check(args[0]) || !PyDict_CheckExact(args[2]) || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "configure(tensor_type: type, alpha: float, known: dict, window: callable, record_every: int)");
        return NULL;
    }
    g_alpha = PyFloat_AsDouble(args[1]);
    if (PyErr_Occurred())
        return NULL;
    g_record_every = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(g_ttype, args[0]);
    Py_INCREF(args[2]);
    Py_XSETREF(g_known, args[2]);
    Py_INCREF(args[3]);
    Py_XSETREF(g_window, args[3]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sumsq", (PyCFunction)(void (*)(void))sumsq, METH_FASTCALL,
     "sumsq(params, tensor_type, dtype, is_double) -> sum of squares of the CPU gradients, -1.0 "
     "without any, None where torch must do it"},
    {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
     "step(guard, optimizer, spike, z, ratio, warmup) -> the norm of a healthy step (history "
     "updated), None: the Python guard decides"},
    {"fast", (PyCFunction)(void (*)(void))fast, METH_FASTCALL,
     "fast(optimizer, site, spike, z, ratio, warmup) -> step() on the guard of (id(optimizer), site) "
     "in the configured table, and the window callback; None: the Python guard decides"},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(tensor_type, alpha, known, window, record_every): the gradients' exact type, the "
     "history's alpha, the guard table, the window callback and the window length"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gradnorm_c",
                                    "Sum of squares of CPU gradients, for the gradient guard.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gradnorm_c(void)
{
    PyObject *m;
    s_grad = PyUnicode_InternFromString("grad");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_numel = PyUnicode_InternFromString("numel");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_param_groups = PyUnicode_InternFromString("param_groups");
    s_params = PyUnicode_InternFromString("params");
    if (!s_grad || !s_dtype || !s_is_cpu || !s_is_contiguous || !s_numel || !s_data_ptr || !s_param_groups || !s_params)
        return NULL;
    if (PyType_Ready(&StateType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StateType);
    if (PyModule_AddObject(m, "State", (PyObject *)&StateType) < 0 ||
        PyModule_AddIntConstant(m, "VERSION", GRADNORM_VERSION) < 0) {
        Py_DECREF(&StateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
