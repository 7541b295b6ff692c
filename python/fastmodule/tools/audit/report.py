"""``AuditReport``: the findings of one audit, as text (like a linter) or JSON.

JSON schema, version 1 (``AuditReport.to_dict()``, ``python -m fastmodule audit
--json``)::

    {
      "schema": 1,
      "model": "Net",                  # __qualname__ of the model's class
      "findings": [
        {
          "code": "FM001",             # stable, see fastmodule.tools.audit.KINDS
          "severity": "error",         # "error" | "warning" | "info"
          "path": "",                  # dotted module path, "" for the model itself
          "attribute": "layers",       # attribute of that module, "" for none
          "class": "Net",              # __qualname__ of that module's class
          "message": "...",            # what was found
          "why": "...",                # why it matters
          "fix": "...",                # what to do
          "file": "net.py",            # source of the statement it is about, or null
          "line": 8                    # its line, or null
        }
      ],
      "summary": {"modules": 2, "parameters": 2, "parameter_elements": 17,
                  "buffers": 0, "error": 1, "warning": 1, "info": 0,
                  "suppressed": 0}     # findings the code silences (not listed)
    }

``file``, ``line`` and ``summary.suppressed`` were added within schema 1.

Within one schema version fields are only ever added, never removed or
changed in meaning.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any

from fastmodule.tools.audit.findings import SEVERITIES, Finding, Severity
from fastmodule.tools.audit.source import shown_path

__all__ = ["SCHEMA", "AuditReport"]

#: Version of the JSON layout (see the module docstring).
SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What :func:`fastmodule.audit` found in one model."""

    #: ``__qualname__`` of the model's class.
    model: str
    #: Every finding, in walk order (each module's, then the model-wide ones).
    findings: tuple[Finding, ...]
    #: How many distinct modules, parameters and buffers are registered.
    modules: int
    parameters: int
    buffers: int
    #: How many numbers the registered parameters hold (what an optimizer trains).
    parameter_elements: int
    #: Findings the code silences (``# fastmodule: ignore[...]`` or
    #: ``__fastmodule_ignore__``), not in :attr:`findings`.
    suppressed: tuple[Finding, ...] = ()

    def count(self, severity: Severity) -> int:
        """How many findings have ``severity``."""
        return sum(f.severity == severity for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        """The findings of severity ``error``."""
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        """No finding of severity ``error``."""
        return not self.errors

    def at_least(self, severity: Severity) -> list[Finding]:
        """The findings of ``severity`` or worse."""
        worst = SEVERITIES[: SEVERITIES.index(severity) + 1]
        return [f for f in self.findings if f.severity in worst]

    def codes(self) -> list[str]:
        """The codes found, in order, each once."""
        return list(dict.fromkeys(f.code for f in self.findings))

    def summary(self) -> dict[str, int]:
        """Counts: registered modules, parameters and buffers, findings by severity."""
        counts = {
            "modules": self.modules,
            "parameters": self.parameters,
            "parameter_elements": self.parameter_elements,
            "buffers": self.buffers,
        }
        by_severity = {s: self.count(s) for s in SEVERITIES}
        return counts | by_severity | {"suppressed": len(self.suppressed)}

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (schema: see this module's docstring)."""
        return {
            "schema": SCHEMA,
            "model": self.model,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    def summary_line(self) -> str:
        """One line: what was audited and how many findings of each severity."""
        audited = (
            f"{self.model}: {_n(self.modules, 'module')}, {_n(self.parameters, 'parameter')} "
            f"({_n(self.parameter_elements, 'element')}), {_n(self.buffers, 'buffer')} audited"
        )
        silenced = f" ({len(self.suppressed)} silenced in the code)" if self.suppressed else ""
        if not self.findings:
            return f"{audited}: no findings{silenced}"
        counts = ", ".join(_n(self.count(s), s) for s in SEVERITIES)
        return f"{audited}: {counts}{silenced}"

    def format(self, severity: Severity = "info", width: int | None = None) -> str:
        """The findings of ``severity`` or worse as text like a linter, then the
        summary line. Each finding is ``where  class  code severity  file:line:
        message: why -> fix`` (``file:line`` where the source was found), on one line,
        or with ``width`` wrapped to that many columns (continuation lines indented
        under the message)."""
        shown = self.at_least(severity)
        lines = []
        if shown:
            w_where = max(len(f.where) for f in shown)
            w_cls = max(len(f.cls) for f in shown)
            w_sev = max(len(f.severity) for f in shown)
            for f in shown:
                head = f"{f.where:<{w_where}}  {f.cls:<{w_cls}}  {f.code} {f.severity:<{w_sev}}  "
                at = f"{shown_path(f.file)}:{f.line}: " if f.file and f.line else ""
                lines.append(_wrapped(head, f"{at}{f.message}: {f.why} -> {f.fix}", width))
            lines.append("")
        hidden = len(self.findings) - len(shown)
        tail = f" ({hidden} below {severity} not shown)" if hidden else ""
        lines.append(_wrapped("", self.summary_line() + tail, width, indent=2))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


#: Narrower than this, continuation lines start at a fixed indent, not under the message.
_MIN_TEXT = 40


def _wrapped(head: str, text: str, width: int | None, indent: int = 4) -> str:
    """``head + text``, on one line without ``width``, else wrapped to ``width``
    columns (at least 20) with continuation lines under the text (or ``indent``
    spaces in where that leaves too little room). Long words are not broken."""
    if width is None:
        return head + text
    width = max(width, 20)
    if width - len(head) >= _MIN_TEXT or not head:
        hang = " " * (len(head) if head else indent)
        return textwrap.fill(
            text,
            width,
            initial_indent=head,
            subsequent_indent=hang,
            break_long_words=False,
            break_on_hyphens=False,
        )
    body = textwrap.fill(
        text,
        width,
        initial_indent=" " * indent,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return head.rstrip() + "\n" + body


def _n(n: int, word: str) -> str:
    if word == "info":
        return f"{n} info"
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
