"""scalebox_cst: rewrite naive PyTorch RL code into fast, stable code, every rewrite committed first."""
from scalebox_cst._version import __version__

__all__ = ["__version__", "install_import_hook"]


def __getattr__(name: str):
    # Lazy, so ``import scalebox_cst`` stays cheap: the hook's module loads on first use.
    if name == "install_import_hook":
        from scalebox_cst.importhook import install_import_hook

        return install_import_hook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
