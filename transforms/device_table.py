"""The swap table's former import path: this name is :mod:`scalebox_cst.transforms.device.table`
itself (one module object, so code that reads or patches either sees the same table)."""
import sys

from .device import table as _table

sys.modules[__name__] = _table
