"""The kinds of finding ``fastmodule.audit`` reports, each with a stable code.

A code never changes meaning once released; new kinds get new codes. The
severity of a kind is fixed too:

- ``error``: state that is silently not trained, saved or moved, or an
  attribute that hides what is registered;
- ``warning``: state that behaves unlike the rest of the model (a plain tensor
  ``.to()`` does not move, a buffer that requires grad, mixed devices or dtypes);
- ``info``: facts worth knowing that are not bugs (tied parameters, a module
  under several paths, why fastmodule leaves some class to torch's code).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

__all__ = ["KINDS", "SEVERITIES", "Finding", "Kind", "Severity"]

#: How bad a finding is.
Severity = Literal["error", "warning", "info"]
#: The severities, worst first.
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of finding: its code, severity, a one-line title, and the
    default explanation and fix (a finding may say them more precisely)."""

    code: str
    severity: Severity
    title: str
    why: str
    fix: str


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing the audit found, at one place in the model."""

    #: The kind's stable code, ``"FM001"`` ...
    code: str
    severity: Severity
    #: Dotted path of the module it is about (``""``: the model itself).
    path: str
    #: The attribute of that module it is about (``""``: the module as a whole).
    attribute: str
    #: The ``__qualname__`` of that module's class.
    cls: str
    #: What was found.
    message: str
    #: Why it matters.
    why: str
    #: What to do about it.
    fix: str
    #: The source file and line of the statement it is about (the assignment of the
    #: attribute, the class statement), where the source can be found; else None.
    file: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        """``path.attribute`` as one dotted name; ``(root)`` for the model itself."""
        name = ".".join(p for p in (self.path, self.attribute) if p)
        return name or "(root)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the class under the key ``"class"``)."""
        return {
            "code": self.code,
            "severity": self.severity,
            "path": self.path,
            "attribute": self.attribute,
            "class": self.cls,
            "message": self.message,
            "why": self.why,
            "fix": self.fix,
            "file": self.file,
            "line": self.line,
        }


_NOT_REGISTERED = (
    "not registered: not trained (not in parameters()), not saved (state_dict()), "
    "not moved (.to()), not switched by train()/eval()"
)

_KINDS = (
    Kind(
        "FM001",
        "error",
        "modules in a plain list/tuple/dict/set attribute",
        _NOT_REGISTERED,
        "use nn.ModuleList (nn.ModuleDict for a dict)",
    ),
    Kind(
        "FM002",
        "error",
        "parameters in a plain list/tuple/dict/set attribute",
        "not registered: not trained (not in parameters()), not saved (state_dict()), "
        "not moved (.to())",
        "use nn.ParameterList (nn.ParameterDict for a dict)",
    ),
    Kind(
        "FM003",
        "warning",
        "tensors in a plain list/tuple/dict/set attribute",
        "not moved (.to()), not saved (state_dict())",
        "register each with self.register_buffer(name, tensor) (persistent=False if it "
        "should not be saved)",
    ),
    Kind(
        "FM004",
        "error",
        "parameter kept as a plain attribute, outside _parameters",
        "not trained (not in parameters()), not saved (state_dict())",
        "assign it normally (self.name = nn.Parameter(...)), not through object.__setattr__ "
        "or __dict__",
    ),
    Kind(
        "FM005",
        "warning",
        "tensor kept as a plain attribute (neither parameter nor buffer)",
        "not moved (.to()), not saved (state_dict())",
        "self.register_buffer(name, tensor) (persistent=False if it should not be saved)",
    ),
    Kind(
        "FM006",
        "warning",
        "module kept as a plain attribute, registered nowhere in the model",
        _NOT_REGISTERED,
        "assign it normally (self.name = module) so it is registered, unless it is "
        "deliberately not part of this model",
    ),
    Kind(
        "FM007",
        "error",
        "attribute shadows a registered parameter, buffer or submodule",
        "reading it finds the other object: torch's __getattr__, which reads the registries, "
        "never sees the registered one, yet that one is what is trained, saved and moved",
        "remove the shadowing attribute, or rename one of the two",
    ),
    Kind(
        "FM008",
        "warning",
        "instance attribute caches a registered parameter, buffer or submodule",
        "the same object today, but the registered one can be replaced (.to() replaces "
        "buffers, load_state_dict(assign=True) parameters) and the cached one then goes stale",
        "delete the instance attribute: reads reach the registered object through "
        "torch's __getattr__",
    ),
    Kind(
        "FM009",
        "warning",
        "parameters and buffers on more than one device",
        "an operation mixing them fails, or the model is only partly where you moved it",
        "move the model with one .to(device), and register every tensor it keeps",
    ),
    Kind(
        "FM010",
        "warning",
        "parameters and buffers of more than one floating dtype",
        "mixed-dtype operations fail or promote silently",
        "convert the model with one .to(dtype) (or keep the exception deliberate)",
    ),
    Kind(
        "FM011",
        "warning",
        "buffer that requires grad",
        "buffers are not in parameters(): an optimizer never updates it, yet autograd tracks it",
        "make it an nn.Parameter if it should be trained, else register tensor.detach()",
    ),
    Kind(
        "FM012",
        "info",
        "tensor registered under several names (tied)",
        "saved once per name in state_dict(), trained once (parameters() removes duplicates)",
        "nothing, if the tie is intended",
    ),
    Kind(
        "FM013",
        "info",
        "module reachable under several paths",
        "one set of weights serves every path; named_modules() lists it once",
        "nothing, if the sharing is intended",
    ),
    Kind(
        "FM014",
        "info",
        "plain attribute refers to modules or parameters registered elsewhere in the model",
        "they are trained, saved and moved through their registered names; this is only "
        "another reference",
        "nothing",
    ),
    Kind(
        "FM015",
        "info",
        "tensor computed by autograd kept as a plain attribute",
        "a result of a computation (it has a grad_fn), not state: it keeps its graph alive "
        "until it is replaced",
        "nothing, if it is recomputed on purpose; store tensor.detach() if only the value "
        "is needed",
    ),
    Kind(
        "FM016",
        "info",
        "class that fastmodule leaves to torch's own code for some paths",
        "fastmodule's native paths need torch's own __call__/__getattr__/__setattr__, and "
        "super().__setattr__/__delattr__ after torch.nn.Module in the MRO to be object's "
        "(mixins that define neither are fine); here these paths run Python code, "
        "accelerated or not (same behaviour, only slower)",
        "nothing, unless that speed matters",
    ),
    Kind(
        "FM017",
        "info",
        "module registry that is not a plain dict",
        "fastmodule's native attribute read leaves such a module to torch's __getattr__",
        "nothing, unless that speed matters",
    ),
    Kind(
        "FM018",
        "error",
        "modules held by a plain (not nn.Module) object attribute",
        "torch does not look into plain objects: " + _NOT_REGISTERED,
        "make the object's class an nn.Module (so assigning it registers what it holds), "
        "or assign the modules to the model itself",
    ),
    Kind(
        "FM019",
        "error",
        "parameters held by a plain (not nn.Module) object attribute",
        "torch does not look into plain objects: not registered: not trained (not in "
        "parameters()), not saved (state_dict()), not moved (.to())",
        "make the object's class an nn.Module (so assigning it registers what it holds), "
        "or assign the parameters to the model itself",
    ),
)

#: Every kind, by code.
KINDS: dict[str, Kind] = {k.code: k for k in _KINDS}
