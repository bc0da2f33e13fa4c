"""Recognising the calls a gradient guard is placed among: what clips, what guards, what scales
gradients (GradScaler, accelerate), and whose ``step()`` is an optimizer's.

By qualified name through the module's imports first; by name only where no import says (a clip
by its ``clip_grad`` prefix, an optimizer by ``opt``/``optimizer`` in its name), because guessing
wrong must err towards leaving the code alone.
"""
from __future__ import annotations

import ast
import re
from typing import Optional

from ..names import ast_dotted

#: the runtime's fixed clip and guard: inserted by this transform, and recognised by a second pass
RUNTIME_QUALNAME = "scalebox_cst.runtime.clip.clip_grad_norm"
GUARD_QUALNAME = "scalebox_cst.runtime.stabilizer.stabilize"

#: calls that clip gradients, by qualified name (our own helper included: rewriting is idempotent)
CLIP_QUALNAMES = frozenset(
    f"torch.nn.utils.{mod}{name}"
    for mod in ("", "clip_grad.")
    for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grads_with_norm_")
) | {RUNTIME_QUALNAME}
#: the guard is no clip (healthy steps pass untouched): a second rewrite must see its own guard
GUARD_QUALNAMES = frozenset({GUARD_QUALNAME})
#: a call whose name starts so and that is not some other torch function also counts as clipping
#: (``accelerator.clip_grad_norm_``, FSDP's ``model.clip_grad_norm_``, a star import, a user
#: helper): wrongly leaving code alone is safe, wrongly clipping twice is not what the user wrote.
CLIP_NAME_PREFIX = "clip_grad"

GRAD_SCALERS = frozenset(
    {
        "torch.GradScaler",
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.cuda.amp.grad_scaler.GradScaler",
        "torch.cpu.amp.GradScaler",
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
    }
)
ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
NOT_OPTIMIZER_PREFIXES = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")

#: the last name of a receiver that reads like an optimizer: opt, optim, optimizer, q_optimizer,
#: actor_optim, optimizer2, optimizerD, opt_d, actorOptimizer, optimizers[i]
_OPT_NAME = re.compile(
    r"(?:^|_)(?:opt|optim|optimizer|optimiser)s?(?:_|\d|[A-Z]|$)"
    r"|(?:^|_|(?<=[a-z0-9]))(?:Opt|Optim|Optimizer|Optimiser)s?(?:_|\d|[A-Z]|$)"
)


def looks_like_optimizer(name: str) -> bool:
    return "sched" not in name.lower() and bool(_OPT_NAME.search(name))


def last_name(expr: ast.AST) -> Optional[str]:
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None


def scaler_step_optimizer(call: ast.Call) -> Optional[ast.expr]:
    """The optimizer argument of ``scaler.step(optimizer, *args, **kwargs)``."""
    if call.args and not isinstance(call.args[0], ast.Starred):
        return call.args[0]
    for kw in call.keywords:
        if kw.arg == "optimizer":
            return kw.value
    return None


def scaler_of(backward: ast.Call) -> Optional[str]:
    """``X`` for ``X.scale(loss).backward()``."""
    func = backward.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
        inner = func.value.func
        if isinstance(inner, ast.Attribute) and inner.attr == "scale":
            return ast_dotted(inner.value)
    return None


def plain_text(source: str, expr: ast.AST) -> Optional[str]:
    """Text of a side-effect-free reference: ``a.b.c`` or ``a.b[i]`` with a simple index."""
    text = ast_dotted(expr)
    if text is not None:
        return text
    if isinstance(expr, ast.Subscript):
        base, index = ast_dotted(expr.value), expr.slice
        simple = (isinstance(index, ast.Constant) and isinstance(index.value, (int, str))
                  and not isinstance(index.value, bool)) or ast_dotted(index) is not None
        if base is not None and simple:
            return f"{base}[{ast.get_source_segment(source, index)}]"
    return None
