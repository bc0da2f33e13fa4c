"""Build of the two optional C extensions (everything else is declared in setup.cfg).

``scalebox_cst.runtime._recurrence_c`` is the exact CPU loop behind ``linear_recurrence``: fast
from a process's first call, where numba takes about 0.4 s to load. ``_fused_c`` runs a whole backward affine recurrence (the loop body's
arithmetic, the loop, the output stores) in one call, for the engine's rewrite of GAE-like loops.
``_gradnorm_c`` is the
stabilizer's healthy step on CPU (the total gradient norm read from the gradients' memory and the
history update), which keeps the guard under 3% of a small network's step. Both are optional:
without a working compiler the install goes on and the runtime uses its torch / numba / numpy
paths instead. Compiled without FMA contraction or fast-math, so that they stay bitwise equal to
the Python arithmetic they replace.
"""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Exactness flags per compiler; a failed optional build says so in one line."""

    def build_extensions(self):
        if self.compiler.compiler_type == "msvc":
            flags = ["/fp:precise"]
        else:  # gcc contracts a * x + b into an FMA by default where the target has one
            flags = ["-ffp-contract=off", "-fno-fast-math", "-O3"]
        for ext in self.extensions:
            ext.extra_compile_args = flags + list(ext.extra_compile_args or [])
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "scalebox_cst.runtime._recurrence_c",
            sources=["runtime/_recurrence_c.c"],
            optional=True,
        ),
        Extension(
            "scalebox_cst.runtime._fused_c",
            sources=["runtime/_fused_c.c"],
            optional=True,
        ),
        Extension(
            "scalebox_cst.runtime._gradnorm_c",
            sources=["runtime/_gradnorm_c.c"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildExt},
)
