"""Pairing an optimizer ``step()`` with the ``backward()`` calls that feed it.

A step is fed by the run of backward() calls since the previous optimizer step of its scope, on
the paths that can run together with it: gradient accumulation (several backward() calls, or one in
a loop, before one step), several optimizers stepped after one backward (each pairs with the same
run), actor and critic pairs one after the other. A step that recomputes the gradients itself
(``step(closure)``), a scheduler's and ``env.step(action)`` pair with nothing.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import List, Optional, Tuple, Union

from .events import Event, exclusive
from .recognise import scaler_step_optimizer


@dataclasses.dataclass
class Pairing:
    """The backward() run of ``events[step_index]``, as indices into ``visible`` (the scope's
    earlier events that can run in the same pass as the step, with their index in ``events``)."""

    events: List[Event]
    step_index: int
    visible: List[Tuple[int, Event]]
    start: int  # the run's first backward()
    nearest: int  # its last backward()
    previous: int  # the previous optimizer step (-1: none)

    @property
    def group(self) -> List[Event]:
        """The run's backward() calls."""
        return [e for _, e in self.visible[self.start:self.nearest + 1] if e.kind == "backward"]

    @property
    def backward_line(self) -> int:
        return self.visible[self.nearest][1].call.lineno

    @property
    def first_line(self) -> int:
        return self.visible[self.start][1].call.lineno

    def before_run(self) -> List[Event]:
        """What runs after the previous optimizer step and before the run (a clip there clips nothing)."""
        return [e for _, e in self.visible[self.previous + 1:self.start]]

    def window(self) -> List[Event]:
        """Every event between the run's first backward() and the step, on any branch."""
        return self.events[self.visible[self.start][0] + 1:self.step_index]

    def after_start(self) -> List[Event]:
        """The visible events after the run's first backward()."""
        return [e for _, e in self.visible[self.start + 1:]]


def pair(source: str, events: List[Event], s: int, step: Event) -> Union[Pairing, str, None]:
    """The backward() run that feeds ``events[s]``; the reason to report for an optimizer step left
    alone; None for what is no optimizer step (nothing to report)."""
    if step.kind != "step" or step.role == "scheduler":
        return None
    if step.role == "unknown" and (step.call.args or step.call.keywords):
        return None  # env.step(action) and the like
    recognised = step.role in ("optimizer", "scaler")
    extra: List[Union[ast.expr, ast.keyword]]
    if step.role == "scaler":
        arg: Optional[ast.expr] = scaler_step_optimizer(step.call)
        if arg is None:
            return None  # not GradScaler.step(optimizer, ...)
        extra = [a for a in step.call.args if a is not arg] + [k for k in step.call.keywords if k.value is not arg]
    else:
        extra = [*step.call.args, *step.call.keywords]
    if extra:
        return (f"{ast.get_source_segment(source, step.call)}: a closure passed to step() recomputes the loss "
                "and gradients inside step(), after any clip placed before it; not clipped")

    visible = [(i, e) for i, e in enumerate(events[:s]) if not exclusive(e.path, step.path)]
    nearest = next((k for k in range(len(visible) - 1, -1, -1) if visible[k][1].kind == "backward"), None)
    if nearest is None:
        return "no backward() before this step() in the same function; not clipped" if recognised else None
    if not recognised:
        what = step.recv_text or ast.get_source_segment(source, step.call.func.value)
        return f"cannot tell that {what} is an optimizer; not clipped"
    # the run of backward() calls since the previous optimizer step feeds this step
    start, k = nearest, nearest - 1
    while k >= 0 and not visible[k][1].is_opt_step:
        if visible[k][1].kind == "backward":
            start = k
        k -= 1
    return Pairing(events, s, visible, start, nearest, k)
