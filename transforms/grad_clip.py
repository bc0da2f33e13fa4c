"""Insert a gradient guard (or a fixed clip) between ``backward()`` and each optimizer ``step()``.

RL training loops are prone to exploding gradients and rarely clip. ``[grad_clip] mode``:

- ``"guard"`` (default): ``runtime.stabilizer.stabilize`` measures and records the total norm,
  skips a step whose gradients are non-finite and clips a spike far above the norm's own history;
  otherwise it writes nothing, so healthy runs are bitwise the original's
  (``exact-until-intervention``). Inserted also where the code clips already (measuring and
  skipping only: the code's clip stays its own).
- ``"fixed"``: ``clip_grad_norm_(max_norm)`` on every step (``changes-semantics``), only where the
  code does not clip.
``skip_nonfinite = true`` (what hot-fix branches set) decides on the host on every backend, so a
non-finite step is skipped for any optimizer (on CUDA/NPU without it, only optimizers that take
``found_inf`` skip on device); in fixed mode the clip then comes from the guard, which also skips.

Each scope (module level,
each function, each class body) is read as its calls in source order: a ``step()`` is paired with
the run of ``backward()`` calls before it and is clipped only when nothing in that window already
clips. Traps handled: AMP (``scaler.unscale_`` first), clipping before ``backward()`` (warned),
conditional clipping, several optimizers after one backward, backward in a loop with the step
after it, gradient accumulation, ``step(closure)``, schedulers and ``env.step(action)``.

The analysis reads the stdlib ``ast`` of the same source (about 20 times faster than walking the
libcst tree, and it carries line numbers without PositionProvider); the edits are made in the
libcst tree, reached by the statement's structural path, so every other byte stays as it was.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from scalebox_cst.report import CHANGES_SEMANTICS, EXACT_UNTIL_INTERVENTION, REWRITTEN, SKIPPED, WARNING, Site

from .base import Example, FileContext, Transform
from .names import ImportMap, ast_dotted

ID = "grad_clip"
RUNTIME_QUALNAME = "scalebox_cst.runtime.clip.clip_grad_norm"
RUNTIME_ALIAS = "_scalebox_clip_grad_norm"
GUARD_QUALNAME = "scalebox_cst.runtime.stabilizer.stabilize"
GUARD_ALIAS = "_scalebox_stabilize"
MODES = ("guard", "fixed")
#: guard options written into the call only when they differ from the runtime's defaults
GUARD_DEFAULTS = {"z": 10.0, "ratio": 100.0, "warmup": 25}

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


def _last_name(expr: ast.AST) -> Optional[str]:
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None


# --------------------------------------------------------------------------- events

#: where a statement sits inside its scope: (compound statement, branch) pairs, outermost first
Path = Tuple[Tuple[ast.AST, str], ...]
#: how to reach a statement from the module: (field, index in the ast statement list) pairs
Loc = Tuple[Tuple[str, int], ...]

_COMPOUND = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match,
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_TRY = (ast.Try,) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


@dataclasses.dataclass
class _Event:
    kind: str  # "backward" | "clip" | "guard" | "unscale" | "step"
    call: ast.Call
    stmt: ast.stmt  # the statement holding the call (a compound one when the call is in its header)
    loc: Optional[Loc]  # None when the call is in a compound statement's header
    path: Path
    # filled in for steps
    role: str = ""  # "optimizer" | "scaler" | "scheduler" | "unknown"
    opt_text: Optional[str] = None
    recv_text: Optional[str] = None

    @property
    def is_opt_step(self) -> bool:
        return self.kind == "step" and self.role in ("optimizer", "scaler")

    @property
    def direct(self) -> bool:
        """The call is its statement's whole value, so a statement put before it runs right before it."""
        stmt = self.stmt
        return (
            self.loc is not None
            and isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return))
            and stmt.value is self.call
        )


def _exclusive(a: Path, b: Path) -> bool:
    """Whether two places can never both run in one pass (different arms of one if/match/try)."""
    for (na, ka), (nb, kb) in zip(a, b):
        if na is not nb:
            return False
        if ka != kb:
            if isinstance(na, (ast.If, ast.Match)):
                return True
            if isinstance(na, _TRY):
                return ka not in ("body", "finalbody") and kb not in ("body", "finalbody")
            return False
    return False


def _dominates(a: Path, b: Path) -> bool:
    """Whether code at path ``a`` (earlier in source) runs whenever code at ``b`` runs."""
    return len(a) <= len(b) and all(x[0] is y[0] and x[1] == y[1] for x, y in zip(a, b))


def _scaler_step_optimizer(call: ast.Call) -> Optional[ast.expr]:
    """The optimizer argument of ``scaler.step(optimizer, *args, **kwargs)``."""
    if call.args and not isinstance(call.args[0], ast.Starred):
        return call.args[0]
    for kw in call.keywords:
        if kw.arg == "optimizer":
            return kw.value
    return None


def _scaler_of(backward: ast.Call) -> Optional[str]:
    """``X`` for ``X.scale(loss).backward()``."""
    func = backward.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
        inner = func.value.func
        if isinstance(inner, ast.Attribute) and inner.attr == "scale":
            return ast_dotted(inner.value)
    return None


def _calls(node: ast.AST) -> List[ast.Call]:
    """Calls under ``node`` in source order, not descending into lambdas."""
    found: List[ast.Call] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Lambda):
            continue
        if isinstance(n, ast.Call):
            found.append(n)
        stack.extend(ast.iter_child_nodes(n))
    found.sort(key=lambda c: (c.lineno, c.col_offset, -(c.end_lineno or 0), -(c.end_col_offset or 0)))
    return found


class _Module:
    """One pass over the module's ast: the events of every scope, and what assignments say."""

    def __init__(self, tree: ast.Module, imports: ImportMap) -> None:
        self.aliases = imports.aliases
        self.assigned: Dict[str, Set[str]] = {}  # dotted target -> qualified names of the calls
        self.by_last: Dict[str, Set[str]] = {}  # last attribute -> qualified names
        self.scalers: Set[str] = set()
        self.accelerators: Set[str] = set()
        self.scopes: List[List[_Event]] = []
        todo: List[Tuple[List[ast.stmt], Loc]] = [(tree.body, ())]
        while todo:
            body, loc = todo.pop(0)
            events: List[_Event] = []
            self._block(body, loc, "body", (), events, todo)
            self.scopes.append(events)

    # -------------------------------------------------------------- names
    def qualify(self, expr: ast.AST) -> Optional[str]:
        text = ast_dotted(expr)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        full = self.aliases.get(head)
        if full is None:
            return None
        return full + ("." + rest if rest else "")

    def _record(self, target: ast.AST, value: Optional[ast.AST]) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) or value is None:
            return
        text = ast_dotted(target)
        if text is None:
            return
        qual = (self.qualify(value.func) or "") if isinstance(value, ast.Call) else ""
        self.assigned.setdefault(text, set()).add(qual)
        self.by_last.setdefault(text.rsplit(".", 1)[-1], set()).add(qual)
        if qual in GRAD_SCALERS:
            self.scalers.add(text)
        if qual in ACCELERATORS:
            self.accelerators.add(text)

    def classify(self, call: ast.Call) -> Optional[str]:
        func = call.func
        qual = self.qualify(func)
        if qual in CLIP_QUALNAMES:
            return "clip"
        if qual in GUARD_QUALNAMES:
            return "guard"
        last = _last_name(func)
        if last is None:
            return None
        if last.startswith(CLIP_NAME_PREFIX) and not (qual or "").startswith("torch."):
            return "clip"
        attr = isinstance(func, ast.Attribute)
        if qual == "torch.autograd.backward" or (attr and last == "backward"):
            scaler = _scaler_of(call)
            if scaler is not None:
                self.scalers.add(scaler)
            return "backward"
        if attr and last == "unscale_":
            return "unscale"
        if attr and last == "step":
            return "step"
        return None

    # -------------------------------------------------------------- walking
    def _header(self, node: Optional[ast.AST], stmt: ast.stmt, path: Path, events: List[_Event]) -> None:
        if node is None:
            return
        for call in _calls(node):
            kind = self.classify(call)
            if kind:
                events.append(_Event(kind, call, stmt, None, path))

    def _block(self, body: List[ast.stmt], loc: Loc, field: str, path: Path, events, todo) -> None:
        for k, stmt in enumerate(body):
            here = loc + ((field, k),)
            if not isinstance(stmt, _COMPOUND):
                if isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        self._record(target, stmt.value)
                elif isinstance(stmt, ast.AnnAssign):
                    self._record(stmt.target, stmt.value)
                for call in _calls(stmt):
                    kind = self.classify(call)
                    if kind:
                        events.append(_Event(kind, call, stmt, here, path))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo.append((stmt.body, here))  # a scope of its own
            elif isinstance(stmt, ast.If):
                self._header(stmt.test, stmt, path, events)
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
                self._block(stmt.orelse, here, "orelse", path + ((stmt, "orelse"),), events, todo)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                self._header(stmt.test if isinstance(stmt, ast.While) else stmt.iter, stmt, path, events)
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
                self._block(stmt.orelse, here, "orelse", path + ((stmt, "orelse"),), events, todo)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    self._header(item.context_expr, stmt, path, events)
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
            elif isinstance(stmt, _TRY):
                self._block(stmt.body, here, "body", path + ((stmt, "body"),), events, todo)
                for i, handler in enumerate(stmt.handlers):
                    self._header(handler.type, stmt, path, events)
                    key = f"handlers.{i}"
                    self._block(handler.body, here, key, path + ((stmt, key),), events, todo)
                self._block(stmt.orelse, here, "orelse", path + ((stmt, "orelse"),), events, todo)
                self._block(stmt.finalbody, here, "finalbody", path + ((stmt, "finalbody"),), events, todo)
            elif isinstance(stmt, ast.Match):
                self._header(stmt.subject, stmt, path, events)
                for i, case in enumerate(stmt.cases):
                    self._header(case.guard, stmt, path, events)
                    key = f"cases.{i}"
                    self._block(case.body, here, key, path + ((stmt, key),), events, todo)


# --------------------------------------------------------------------------- libcst side

_SMALL_TYPES = {
    ast.Expr: cst.Expr, ast.Assign: cst.Assign, ast.AnnAssign: cst.AnnAssign,
    ast.AugAssign: cst.AugAssign, ast.Return: cst.Return,
}


class StructureMismatch(RuntimeError):
    """The ast and libcst trees of one source disagree (never expected; the file is left alone)."""


def _cst_field(node: cst.CSTNode, field: str) -> Sequence[cst.CSTNode]:
    def suite(s: cst.BaseSuite) -> Sequence[cst.CSTNode]:
        return s.body if isinstance(s, cst.IndentedBlock) else [s]

    if isinstance(node, cst.Module):
        return node.body
    if field == "body":
        return suite(node.body)
    if field == "orelse":
        if isinstance(node, cst.If) and isinstance(node.orelse, cst.If):
            return [node.orelse]
        return suite(node.orelse.body) if node.orelse is not None else []
    if field == "finalbody":
        return suite(node.finalbody.body) if node.finalbody is not None else []
    name, _, index = field.partition(".")
    return suite(getattr(node, name)[int(index)].body)


def _cst_line(module: cst.Module, loc: Loc, stmt: ast.stmt, path: Optional[Set[int]] = None) -> Tuple[cst.CSTNode, int]:
    """The libcst line (SimpleStatementLine/Suite) and small-statement index of the ast statement at
    ``loc``; the ids of the compound nodes on the way there are added to ``path``."""
    node: cst.CSTNode = module
    for depth, (field, k) in enumerate(loc):
        if path is not None:
            path.add(id(node))
        offset = 0
        for element in _cst_field(node, field):
            simple = isinstance(element, (cst.SimpleStatementLine, cst.SimpleStatementSuite))
            width = len(element.body) if simple else 1
            if k < offset + width:
                break
            offset += width
        else:
            raise StructureMismatch(f"no statement {k} in {field} at depth {depth}")
        if depth == len(loc) - 1:
            if not simple:
                raise StructureMismatch("expected a simple statement")
            small = element.body[k - offset]
            want = _SMALL_TYPES.get(type(stmt))
            if want is not None and not isinstance(small, want):
                raise StructureMismatch(f"{type(small).__name__} where ast has {type(stmt).__name__}")
            return element, k - offset
        if simple:
            raise StructureMismatch("expected a compound statement")
        node = element
    raise StructureMismatch("empty location")


class _Apply(cst.CSTTransformer):
    """Insert planned statements before the planned small statements of each line.

    Only statement-level nodes are visited: expressions cannot hold a line.
    """

    _DESCEND = (
        cst.Module, cst.IndentedBlock, cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try,
        cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.Match, cst.MatchCase,
        cst.FunctionDef, cst.ClassDef,
    )

    def __init__(self, plans: Dict[cst.CSTNode, Dict[int, List[str]]], path: Optional[Set[int]] = None) -> None:
        self.plans = plans
        self.path = path  # ids of the compound nodes holding a planned line (None: descend into all)
        self._applied = 0  # plans applied so far
        self._marks: List[int] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._marks.append(self._applied)
        # only into the statements on the way to a planned line (a 50k-line file is otherwise
        # visited whole); blocks and clauses are reached only through such a statement
        if not isinstance(node, self._DESCEND):
            return False
        return self.path is None or id(node) in self.path or not isinstance(node, cst.BaseStatement)

    def on_leave(self, original_node, updated_node):
        # A subtree with no plan applied in it is given back as the very original node (libcst
        # rebuilds every node it visits): the pipeline then reuses the code generated for it,
        # instead of generating the whole module again (issue 9, item 13).
        mark = self._marks.pop()
        result = super().on_leave(original_node, updated_node)
        if result is updated_node and self._applied == mark:
            return original_node
        return result

    @staticmethod
    def _splice(body: Sequence[cst.BaseSmallStatement], plan: Dict[int, List[str]], from_index: int):
        out: List[cst.BaseSmallStatement] = []
        for i, small in enumerate(body):
            if i >= from_index and i in plan:
                prev = body[i - 1].semicolon if i > 0 else None
                semi = prev if isinstance(prev, cst.Semicolon) else cst.Semicolon(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" ")
                )
                out.extend(cst.Expr(cst.parse_expression(t), semicolon=semi) for t in plan[i])
            out.append(small)
        return out

    def leave_SimpleStatementLine(self, original_node, updated_node):
        plan = self.plans.get(original_node)
        if not plan:
            return updated_node
        self._applied += 1
        updated_node = updated_node.with_changes(body=self._splice(updated_node.body, plan, 1))
        if 0 not in plan:
            return updated_node
        lines = [cst.SimpleStatementLine(body=[cst.Expr(cst.parse_expression(t))]) for t in plan[0]]
        # comments and blank lines above the step stay above the inserted lines
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel([*lines, updated_node.with_changes(leading_lines=())])

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        plan = self.plans.get(original_node)
        if not plan:
            return updated_node
        self._applied += 1
        return updated_node.with_changes(body=self._splice(updated_node.body, plan, 0))


def _number_text(value, key: str = "max_norm") -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"grad_clip.{key} must be a positive number, got {value!r}")
    return repr(value)


@dataclasses.dataclass(frozen=True)
class _Options:
    mode: str
    max_norm: str
    skip_nonfinite: bool
    guard_args: str  # ", z=4.0" etc.: non-default guard options, in a fixed order

    @classmethod
    def read(cls, ctx: FileContext) -> "_Options":
        mode = ctx.option(ID, "mode", "guard")
        if mode not in MODES:
            raise ValueError(f"grad_clip.mode must be one of {', '.join(MODES)}, got {mode!r}")
        skip = ctx.option(ID, "skip_nonfinite", False)
        if not isinstance(skip, bool):
            raise ValueError(f"grad_clip.skip_nonfinite must be true or false, got {skip!r}")
        args = []
        for key, default in GUARD_DEFAULTS.items():
            value = ctx.option(ID, key, default)
            text = _number_text(value, key)
            if key == "warmup" and (isinstance(value, float) or value < 1):
                raise ValueError(f"grad_clip.warmup must be a positive integer, got {value!r}")
            if value != default:
                args.append(f", {key}={text}")
        return cls(mode, _number_text(ctx.option(ID, "max_norm", 1.0)), skip, "".join(args))


# --------------------------------------------------------------------------- the transform


class GradClip(Transform):
    id = ID
    version = "2"
    triggers = ("backward",)
    description = ("Guard each optimizer's step(): skip non-finite, clip spikes, change nothing else "
                   "(or clip to a fixed max_norm)")

    EXAMPLES = [
        Example(
            "import torch\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loss.backward()\n"
            "opt.step()\n",
            True,
            note="plain backward/step at module level",
        ),
        Example(
            "def train(self, loss_q, loss_pi):\n"
            "    self.critic_optimizer.zero_grad()\n"
            "    loss_q.backward()\n"
            "    self.critic_optimizer.step()\n"
            "    self.actor_optimizer.zero_grad()\n"
            "    loss_pi.backward()\n"
            "    self.actor_optimizer.step()\n",
            True,
            note="separate actor and critic pairs (TD3/DDPG style)",
        ),
        Example(
            "loss.backward()\n"
            "encoder_opt.step()\n"
            "head_opt.step()\n",
            True,
            note="two optimizers stepped after one backward",
        ),
        Example(
            "for i, batch in enumerate(loader):\n"
            "    (model(batch).mean() / k).backward()\n"
            "    if (i + 1) % k == 0:\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            True,
            note="gradient accumulation: the clip goes inside the if",
        ),
        Example(
            "from torch.cuda.amp import GradScaler\n"
            "scaler = GradScaler()\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            True,
            note="AMP: scaler.unscale_ is inserted before the clip",
        ),
        Example(
            "import torch\n"
            "optimizer.zero_grad()\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n"
            "loss.backward()\n"
            "optimizer.step()\n",
            True,
            note="clip before backward() has no effect: warned, and a working clip is inserted",
        ),
        Example(
            "import torch as th\n"
            "loss.backward()\n"
            "th.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)\n"
            "policy.optimizer.step()\n",
            False,
            reason="already clipped",
            note="SB3 style, torch imported as th (fixed mode)",
            options=(("mode", "fixed"),),
        ),
        Example(
            "import torch as th\n"
            "loss.backward()\n"
            "th.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)\n"
            "policy.optimizer.step()\n",
            True,
            note="guard mode after the code's own clip: measures and skips non-finite steps only",
        ),
        Example(
            "import torch\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loss.backward()\n"
            "opt.step()\n",
            True,
            note="fixed mode: clip_grad_norm_ to max_norm",
            options=(("mode", "fixed"), ("max_norm", 0.5)),
        ),
        Example(
            "import torch\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loss.backward()\n"
            "opt.step()\n",
            True,
            note="hot-fix: fixed clip that also skips non-finite steps",
            options=(("mode", "fixed"), ("max_norm", 0.5), ("skip_nonfinite", True)),
        ),
        Example(
            "from torch.nn.utils import clip_grad_norm_ as cg\n"
            "loss.backward()\n"
            "if args.max_grad_norm:\n"
            "    cg(agent.parameters(), args.max_grad_norm)\n"
            "optimizer.step()\n",
            False,
            reason="already clipped",
            note="conditional clip under an import alias (fixed mode)",
            options=(("mode", "fixed"),),
        ),
        Example(
            "accelerator.backward(loss)\n"
            "accelerator.clip_grad_norm_(model.parameters(), 1.0)\n"
            "optimizer.step()\n",
            False,
            reason="already clipped",
            options=(("mode", "fixed"),),
        ),
        Example(
            "accelerator.backward(loss)\n"
            "accelerator.clip_grad_norm_(model.parameters(), 1.0)\n"
            "optimizer.step()\n",
            False,
            reason="accelerate's backward() may scale gradients",
        ),
        Example(
            "optimizer = torch.optim.LBFGS(model.parameters())\n"
            "def closure():\n"
            "    optimizer.zero_grad()\n"
            "    loss = loss_fn(model(x), y)\n"
            "    loss.backward()\n"
            "    return loss\n"
            "optimizer.step(closure)\n",
            False,
            reason="closure",
        ),
        Example(
            "loss.backward()\n"
            "trainer.step()\n",
            False,
            reason="cannot tell that trainer is an optimizer",
        ),
        Example(
            "scaler.scale(loss).backward()\n"
            "optimizer.step()\n",
            False,
            reason="scaled",
            note="scaled gradients stepped without scaler.step: clipping them would be wrong",
        ),
        Example(
            "scaler.scale(loss).backward()\n"
            "if log_grads:\n"
            "    scaler.unscale_(optimizer)\n"
            "scaler.step(optimizer)\n",
            False,
            reason="unscale_",
            note="a conditional unscale_: inserting another would raise when it ran",
        ),
    ]

    # ------------------------------------------------------------------ rewrite
    def rewrite(self, ctx: FileContext) -> Tuple[Optional[cst.Module], List[Site]]:
        opts = _Options.read(ctx)
        source = ctx.code
        mod = _Module(ctx.tree, ctx.imports)  # the pipeline's shared ast of this version (read only)
        sites: List[Site] = []
        plans: Dict[cst.CSTNode, Dict[int, List[str]]] = {}
        state = {"alias": None, "warned": set(), "path": set()}
        for events in mod.scopes:
            for ev in events:
                if ev.kind == "step":
                    self._describe_step(source, mod, ev)
            for s, step in enumerate(events):
                self._decide(ctx, source, mod, events, s, step, opts, sites, plans, state)
        if not plans:
            return None, sites  # nothing to insert: libcst is not needed (no parse)
        return ctx.module.visit(_Apply(plans, state["path"])), sites

    @staticmethod
    def _guard_alias(ctx, state) -> str:
        if state.get("guard") is None:
            state["guard"] = ctx.runtime_name(GUARD_QUALNAME, GUARD_ALIAS)
        return state["guard"]

    @staticmethod
    def _plain_text(source: str, expr: ast.AST) -> Optional[str]:
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

    @staticmethod
    def _role(mod: _Module, recv: ast.AST, text: Optional[str]) -> str:
        if text is None:
            return "unknown"
        if text in mod.scalers:
            return "scaler"
        base = ast_dotted(recv.value) if isinstance(recv, ast.Subscript) else text
        last = (base or text).rsplit(".", 1)[-1]
        quals = mod.assigned.get(text)
        if quals is None:
            quals = mod.by_last.get(last, set())
        if any(q.startswith(NOT_OPTIMIZER_PREFIXES) for q in quals):
            return "scheduler"
        if any(q.startswith("torch.optim.") for q in quals):
            return "optimizer"
        if "sched" in last.lower():
            return "scheduler"
        if looks_like_optimizer(last):
            return "optimizer"
        return "unknown"

    def _describe_step(self, source: str, mod: _Module, ev: _Event) -> None:
        recv = ev.call.func.value
        ev.recv_text = self._plain_text(source, recv)
        ev.role = self._role(mod, recv, ev.recv_text)
        if ev.role == "scaler":
            arg = _scaler_step_optimizer(ev.call)
            if arg is not None:
                ev.opt_text = self._plain_text(source, arg)
        elif ev.role in ("optimizer", "unknown"):
            ev.opt_text = ev.recv_text

    def _decide(self, ctx, source, mod, events, s, step, opts, sites, plans, state) -> None:
        if step.kind != "step" or step.role == "scheduler":
            return
        if step.role == "unknown" and (step.call.args or step.call.keywords):
            return  # env.step(action) and the like
        stmt = step.stmt if step.loc is not None else step.call
        recognised = step.role in ("optimizer", "scaler")

        def site(node, action, reason, exactness=None):
            sites.append(Site(ID, node.lineno, node.end_lineno or node.lineno, action, reason, exactness))

        def skip(reason: str) -> None:
            site(stmt, SKIPPED, reason)

        if step.role == "scaler":
            arg = _scaler_step_optimizer(step.call)
            if arg is None:
                return  # not GradScaler.step(optimizer, ...)
            extra = [a for a in step.call.args if a is not arg] + [k for k in step.call.keywords if k.value is not arg]
        else:
            extra = [*step.call.args, *step.call.keywords]
        if extra:
            skip(f"{ast.get_source_segment(source, step.call)}: a closure passed to step() recomputes the loss "
                 "and gradients inside step(), after any clip placed before it; not clipped")
            return

        visible = [(i, e) for i, e in enumerate(events[:s]) if not _exclusive(e.path, step.path)]
        nearest = next((k for k in range(len(visible) - 1, -1, -1) if visible[k][1].kind == "backward"), None)
        if nearest is None:
            if recognised:
                skip("no backward() before this step() in the same function; not clipped")
            return
        if not recognised:
            what = step.recv_text or ast.get_source_segment(source, step.call.func.value)
            skip(f"cannot tell that {what} is an optimizer; not clipped")
            return
        # the run of backward() calls since the previous optimizer step feeds this step
        start, k = nearest, nearest - 1
        while k >= 0 and not visible[k][1].is_opt_step:
            if visible[k][1].kind == "backward":
                start = k
            k -= 1
        group = [e for _, e in visible[start:nearest + 1] if e.kind == "backward"]
        bline = visible[nearest][1].call.lineno

        for _, e in visible[k + 1:start]:
            if e.kind == "clip" and id(e.call) not in state["warned"]:
                state["warned"].add(id(e.call))
                site(e.stmt if e.loc is not None else e.call, WARNING,
                     f"clip before backward() has no effect (backward() at line {ctx.original_line(bline)} recomputes the "
                     f"gradients); a {'guard' if opts.mode == 'guard' else 'clip'} is inserted before step() at line "
                     f"{ctx.original_line(step.call.lineno)}")

        # any clip in the window, on any branch (a conditional clip is the user's choice)
        window = events[visible[start][0] + 1:s]
        guards = [e for e in window if e.kind == "guard"]
        if guards:
            skip(f"already guarded (line {ctx.original_line(guards[0].call.lineno)}) before step()")
            return
        clips = [e for e in window if e.kind == "clip"]
        first = visible[start][1].call.lineno
        clipped_at = ctx.original_line(clips[0].call.lineno) if clips else None
        if clips and opts.mode == "fixed" and not opts.skip_nonfinite:
            skip(f"already clipped (line {clipped_at}) between backward() "
                 f"(line {ctx.original_line(first)}) and step()")
            return
        for e in group:
            recv = e.call.func.value if isinstance(e.call.func, ast.Attribute) else None
            text = ast_dotted(recv) if recv is not None else None
            if text is not None and (text in mod.accelerators or text.rsplit(".", 1)[-1] == "accelerator"):
                skip("accelerate's backward() may scale gradients; clip with accelerator.clip_grad_norm_ "
                     "(not inserted)")
                return
        if not step.direct:
            skip("step() is part of a larger expression; cannot place a clip right before it")
            return
        if step.opt_text is None:
            skip("the optimizer is not a plain name or attribute; not clipped")
            return

        scaled = [x for x in (_scaler_of(e.call) for e in group) if x is not None]
        scaler = step.recv_text if step.role == "scaler" else (scaled[0] if scaled else None)
        unscales = [] if scaler is None else [
            e for _, e in visible[start + 1:]
            if e.kind == "unscale" and ast_dotted(e.call.func.value) == scaler and len(e.call.args) == 1
            and self._plain_text(source, e.call.args[0]) == step.opt_text
        ]
        if unscales and not any(_dominates(e.path, step.path) for e in unscales):
            skip(f"{scaler}.unscale_({step.opt_text}) is called only on some paths before step(); another "
                 "unscale_ would raise where it ran, and no unscale_ would clip scaled gradients; not clipped")
            return
        if step.role != "scaler" and scaler is not None and not unscales:
            skip(f"gradients are scaled by {scaler}.scale() but stepped with a plain step(), not "
                 f"{scaler}.step(); clipping scaled gradients would be wrong; not clipped")
            return

        texts: List[str] = []
        if step.role == "scaler" and not unscales:
            texts.append(f"{scaler}.unscale_({step.opt_text})")
        where = f"{ctx.path}:{ctx.original_line(step.call.lineno)}"
        between = f"between backward() (line {ctx.original_line(bline)}) and step()"
        amp = f", scaler={scaler}" if scaler is not None else ""
        if opts.mode == "guard":
            alias = self._guard_alias(ctx, state)
            if opts.skip_nonfinite:
                amp += ", sync=True"  # decide on the host: a true skip for any optimizer on any backend
            if clips:
                texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}, spike=False)")
                reason = (f"guard {step.opt_text}'s step {between}, after the code's own clip (line {clipped_at}): "
                          "records the grad norm and skips the step if a gradient is non-finite; otherwise changes nothing")
            else:
                texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}{opts.guard_args})")
                reason = (f"guard {step.opt_text}'s step {between}: records the grad norm; skips the step if a gradient "
                          "is non-finite, clips a norm far above its history; otherwise changes nothing")
            if scaler is not None:
                reason += "; GradScaler skips non-finite steps itself"
            if opts.skip_nonfinite:
                reason += "; checked on the host every step (skip_nonfinite)"
            exactness = EXACT_UNTIL_INTERVENTION
        elif opts.skip_nonfinite and clips:
            alias = self._guard_alias(ctx, state)
            texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}, spike=False, sync=True)")
            reason = (f"skip {step.opt_text}'s step if a gradient is non-finite (checked on the host every step) "
                      f"{between}; the code's own clip (line {clipped_at}) stays its only clip")
            exactness = EXACT_UNTIL_INTERVENTION
        elif opts.skip_nonfinite:
            alias = self._guard_alias(ctx, state)
            texts.append(f"{alias}({step.opt_text}, site={where!r}{amp}, max_norm={opts.max_norm}, sync=True)")
            reason = (f"clip grad norm of {step.opt_text}'s params to max_norm={opts.max_norm} {between}, "
                      "and skip the step if a gradient is non-finite (checked on the host every step)")
            exactness = CHANGES_SEMANTICS
        else:
            if state["alias"] is None:
                state["alias"] = ctx.runtime_name(RUNTIME_QUALNAME, RUNTIME_ALIAS)
            texts.append(f"{state['alias']}({step.opt_text}, max_norm={opts.max_norm})")
            reason = f"clip grad norm of {step.opt_text}'s params to max_norm={opts.max_norm} {between}"
            exactness = CHANGES_SEMANTICS
        line, index = _cst_line(ctx.module, step.loc, step.stmt, state["path"])
        plans.setdefault(line, {}).setdefault(index, []).extend(texts)
        if len(texts) == 2:
            reason += f"; {texts[0]} inserted first (AMP gradients are scaled; scaler.step would unscale the same way)"
        site(stmt, REWRITTEN, reason, exactness)
