"""Report types: what each transform did at each site, and the stable JSON schema tools read.

A *site* is one place a transform looked at: rewritten, or skipped with the reason. Every site
carries its exactness, so a user can tell a bitwise-identical rewrite from a deliberate change.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

# Exactness taxonomy (see docs/architecture.md).
EXACT = "exact"  # bitwise identical results
REASSOCIATED = "reassociated"  # same maths, floating-point order changed
CHANGES_SEMANTICS = "changes-semantics"  # deliberate change (e.g. inserted clipping)
# bitwise identical until a run-time guard intervenes (the gradient guard: a non-finite or spiking
# gradient); every intervention is recorded as a run event
EXACT_UNTIL_INTERVENTION = "exact-until-intervention"
EXACTNESS = (EXACT, REASSOCIATED, CHANGES_SEMANTICS, EXACT_UNTIL_INTERVENTION)

REWRITTEN = "rewritten"
SKIPPED = "skipped"
WARNING = "warning"  # something the user should know; nothing was changed for it
ACTIONS = (REWRITTEN, SKIPPED, WARNING)


@dataclasses.dataclass(frozen=True)
class Site:
    """One place a transform acted on (or declined to), with its 1-based line span."""

    transform: str
    line: int
    end_line: int
    action: str
    reason: str
    exactness: Optional[str] = None
    kind: Optional[str] = None  # optional grouping key, e.g. "not-migratable:cupy"
    #: what the reason only names, as JSON: the contracts of the run-time guards that protect the
    #: rewrite (transforms/contracts.py, attached by the pipeline); shown by ``scalebox diff --details``
    details: Optional[Dict[str, Any]] = dataclasses.field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}")
        if self.exactness is not None and self.exactness not in EXACTNESS:
            raise ValueError(f"unknown exactness {self.exactness!r}")

    def to_json(self) -> Dict[str, Any]:
        data = {
            "transform": self.transform,
            "line": self.line,
            "end_line": self.end_line,
            "action": self.action,
            "reason": self.reason,
            "exactness": self.exactness,
        }
        if self.kind:
            data["kind"] = self.kind
        if self.details:
            data["details"] = self.details
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Site":
        return cls(
            transform=data["transform"],
            line=int(data["line"]),
            end_line=int(data["end_line"]),
            action=data["action"],
            reason=data["reason"],
            exactness=data.get("exactness"),
            kind=data.get("kind"),
            details=data.get("details"),
        )

    def describe(self, path: str = "") -> str:
        where = f"{path}:{self.line}" if path else f"line {self.line}"
        if self.end_line != self.line:
            where += f"-{self.end_line}"
        tag = f" [{self.exactness}]" if self.exactness else ""
        return f"{where}: {self.transform} {self.action}{tag}: {self.reason}"


@dataclasses.dataclass
class FileReport:
    """The outcome for one file: ``rewritten``, ``unchanged`` or ``error`` (then ``error`` says why)."""

    path: str
    status: str
    error: Optional[str] = None
    sites: List[Site] = dataclasses.field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {
            "path": self.path,
            "status": self.status,
            "error": self.error,
            "sites": [s.to_json() for s in self.sites],
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "FileReport":
        return cls(
            path=data["path"],
            status=data["status"],
            error=data.get("error"),
            sites=[Site.from_json(s) for s in data.get("sites", [])],
        )


class ReportError(ValueError):
    """A stored report whose JSON is not in the form :meth:`RunReport.from_json` reads."""


@dataclasses.dataclass
class RunReport:
    """The report of one change event: one branch, its commits, and every file's outcome."""

    branch: Optional[str]
    commit: Optional[str]
    source_commit: Optional[str]
    backend: str
    files: List[FileReport] = dataclasses.field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {
            "branch": self.branch,
            "commit": self.commit,
            "source_commit": self.source_commit,
            "backend": self.backend,
            "files": [f.to_json() for f in self.files],
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "RunReport":
        """The report a stored note holds; :class:`ReportError` where its JSON has another shape
        (a shipped or damaged store: ``scalebox diff`` was a KeyError traceback)."""
        try:
            files = [FileReport.from_json(f) for f in data.get("files", [])]
            return cls(
                branch=data.get("branch"),
                commit=data.get("commit"),
                source_commit=data.get("source_commit"),
                backend=data.get("backend", "cpu"),
                files=files,
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ReportError(f"not a report the engine wrote ({type(exc).__name__}: {exc})") from None

    def rewritten_counts(self) -> Dict[str, int]:
        """Sites rewritten, by transform."""
        out: Dict[str, int] = {}
        for f in self.files:
            for s in f.sites:
                if s.action == REWRITTEN:
                    out[str(s.transform)] = out.get(str(s.transform), 0) + 1
        return out

    def counts(self) -> Dict[str, int]:
        out = {REWRITTEN: 0, SKIPPED: 0, WARNING: 0, "errors": 0}
        for f in self.files:
            if f.status == "error":
                out["errors"] += 1
            for s in f.sites:
                out[s.action] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        changed = sum(1 for f in self.files if f.status == "rewritten")
        text = f"{changed} file(s) rewritten, {c[REWRITTEN]} site(s) rewritten, {c[SKIPPED]} skipped"
        if c[WARNING]:
            text += f", {c[WARNING]} warning(s)"
        if c["errors"]:
            text += f", {c['errors']} file error(s)"
        return text
