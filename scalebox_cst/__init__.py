"""scalebox_cst: rewrite naive PyTorch RL code into fast, stable code, every rewrite committed first."""
from scalebox_cst._version import __version__

__all__ = ["__version__"]
