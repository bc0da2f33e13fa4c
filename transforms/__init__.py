"""Transform families, in the fixed order the pipeline runs them.

Loops are vectorized first (they read the user's original code), then distributions and tensors
from lists are rewritten (hot.distribution_args, hot.tensor_from_arrays, then hot.fresh_on_device on what
those leave), then clipping is inserted, then acting forwards are put under no_grad (hot.no_grad) and target
networks' graphs are cut (hot.target_graph_cut), then (opt in, level "reassociated") module methods are compiled
(accelerate.compile) and logged numbers are read after their loop (accelerate.defer_sync); on CPU Adam is built
fused, Categorical as a leaner subclass and small nets get one intra-op thread (accelerate.fused_optim,
accelerate.fast_categorical, accelerate.threads); then device ops are swapped (they may also touch what
earlier transforms emitted).
"""
from __future__ import annotations

from typing import Dict, List, Type

from .base import Example, FileContext, Transform
from .grad_clip import GradClip
from .hot.no_grad import HotNoGrad
from .hot.target_cut import HotTargetGraphCut
from .precision import AutocastTransform
from .accelerate.compile import AccelerateCompile
from .accelerate.defer_sync import AccelerateDeferSync
from .accelerate.fused_optim import AccelerateFusedOptim
from .accelerate.fast_categorical import AccelerateFastCategorical
from .accelerate.threads import AccelerateThreads
from .device import DEVICE_TRANSFORMS
from .vectorize.recurrence import VectorizeRecurrence
from .vectorize.elementwise import VectorizeElementwise
from .vectorize.reduction import VectorizeReduction
from .vectorize.target_update import VectorizeTargetUpdate
from .hot.distributions import HotDistributionArgs
from .hot.arrays import HotTensorFromArrays
from .hot.fresh_device import HotFreshOnDevice

#: every transform class, in pipeline order
REGISTRY: List[Type[Transform]] = [
    VectorizeRecurrence,
    VectorizeTargetUpdate,
    VectorizeReduction,
    VectorizeElementwise,
    HotDistributionArgs,
    HotTensorFromArrays,
    HotFreshOnDevice,
    GradClip,
    HotNoGrad,
    HotTargetGraphCut,
    AutocastTransform,  # off by default (not in DEFAULT_TRANSFORMS): --transform or [precision] mode
    AccelerateCompile,
    AccelerateDeferSync,
    AccelerateFusedOptim,
    AccelerateFastCategorical,
    AccelerateThreads,
    *DEVICE_TRANSFORMS,
]


def all_transforms() -> List[Transform]:
    return [cls() for cls in REGISTRY]


def transform_ids() -> List[str]:
    return [cls.id for cls in REGISTRY]


def versions() -> Dict[str, str]:
    return {cls.id: cls.version for cls in REGISTRY}


__all__ = ["Example", "FileContext", "Transform", "REGISTRY", "all_transforms", "transform_ids", "versions"]
