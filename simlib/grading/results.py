"""What a check reports: :class:`Result` (one check), :class:`Report` (an exercise), their statuses, and the two
exceptions that end an exercise early (:class:`_Stop` with its reason, :class:`_Enough` after a first failure)."""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, TODO, ERROR, HANG = "pass", "fail", "not implemented", "error", "timeout"
_MARK = {PASS: "✔", FAIL: "✘", TODO: "…", ERROR: "✘", HANG: "✘"}


@dataclass
class Result:
    """One check: ``name`` (what it verifies), ``passed``, and a ``hint`` shown when it fails."""

    name: str
    passed: bool
    hint: str = ""
    detail: str = ""  # what was measured (e.g. "max error 3e-1 on rank 2")
    status: str = ""

    def __post_init__(self):
        self.status = self.status or (PASS if self.passed else FAIL)

    def line(self) -> str:
        text = f"{_MARK[self.status]} {self.name}"
        if self.detail and (not self.passed or self.status == PASS):
            text += f" ({self.detail})" if self.passed else f": {self.detail}"
        if not self.passed and self.hint:
            text += "\n    hint: " + self.hint.replace("\n", "\n          ")
        return text


@dataclass
class Report:
    exercise: str
    results: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def status(self) -> str:
        """ "pass", "not implemented", "timeout", "error" or "fail" (the first problem found)."""
        for kind in (TODO, HANG, ERROR, FAIL):
            if any(r.status == kind for r in self.results):
                return kind
        return PASS if self.results else FAIL

    def failed(self) -> list:
        return [r for r in self.results if not r.passed]

    def __repr__(self) -> str:
        good = sum(r.passed for r in self.results)
        return f"<{self.exercise}: {good}/{len(self.results)} checks passed ({self.status})>"


class _Stop(Exception):
    """Raised by Grader.run to end an exercise early; carries the Result that explains why."""

    def __init__(self, result: Result):
        super().__init__(result.name)
        self.result = result


class _Enough(BaseException):  # passes through a check's own `except Exception`
    """Raised by Grader.run when the check asked for the first failure only (``check(first_failure=True)``) and a
    check has failed: the runs already made keep their results, no further run is made."""


def _not_implemented(type_name: str, message: str = "") -> bool:
    return type_name == "NotImplementedError"


def _last_line(tb: str) -> str:
    """The learner-facing part of a traceback: the last 'File ..., line N' and the error line."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    where = frames[-1] if frames else ""
    return f"{where}\n{lines[-1].strip()}" if lines else ""


_TODO_NAME = "not implemented yet: the exercise cell still raises NotImplementedError"  # not "implemented", a pass
_TODO_HINT = "replace `raise NotImplementedError()` in the exercise cell with your code, run that cell, then this one"
