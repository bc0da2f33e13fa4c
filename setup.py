"""Build of the one optional C extension (everything else is declared in setup.cfg).

``scalebox_cst.runtime._recurrence_c`` is the exact CPU loop behind ``linear_recurrence``: fast
from a process's first call, where numba takes about 0.4 s to load. It is optional: without a
working compiler the install goes on and the runtime uses its numba / numpy path instead.
Compiled without FMA contraction or fast-math, so that it stays bitwise equal to the naive loop.
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
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
