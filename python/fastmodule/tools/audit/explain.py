"""``fastmodule audit --explain FM001``: a page per kind of finding, what goes wrong,
an example, the fix and how to silence it.

Every example and fix here is run by the tests (``tests/test_audit_linter.py``): the
example shows the kind, the fix does not.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from fastmodule.tools.audit.findings import KINDS, Kind

__all__ = ["PAGES", "Page", "explain", "explain_dict", "index"]

#: What the examples import (each defines ``model``).
PREAMBLE = "import torch\nfrom torch import nn\n"


@dataclasses.dataclass(frozen=True)
class Page:
    """The explanation of one kind beyond its one-line ``why`` and ``fix``."""

    #: What goes wrong, in a paragraph.
    details: str
    #: Code that shows the kind (it defines ``model``).
    example: str
    #: The same code fixed (None where the fix is to do nothing: an info kind).
    fixed: str | None = None


def _code(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


_NET = "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"


def _net(body: str, after: str = "") -> str:
    lines = textwrap.dedent(body).strip("\n")
    return _NET + textwrap.indent(lines, " " * 8) + "\n" + after + "\nmodel = Net()\n"


PAGES: dict[str, Page] = {
    "FM001": Page(
        "torch registers a module when it is assigned to a module attribute, or held by "
        "nn.ModuleList, nn.ModuleDict or nn.Sequential. A module in a plain list, tuple, "
        "dict or set is invisible to torch: parameters() does not list its weights (an "
        "optimizer never trains them), state_dict() does not save them, .to() and .cuda() "
        "do not move them, and train()/eval() do not switch its dropout or batch norm. "
        "Nothing fails: the model trains, with only part of itself.",
        _net("self.layers = [nn.Linear(16, 16) for _ in range(3)]"),
        _net("self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))"),
    ),
    "FM002": Page(
        "A parameter is registered when it is assigned to a module attribute, or held by "
        "nn.ParameterList or nn.ParameterDict. In a plain list or dict it is not in "
        "parameters() (an optimizer never updates it), not in state_dict() and not moved "
        "by .to().",
        _net("self.gains = [nn.Parameter(torch.ones(16)) for _ in range(3)]"),
        _net(
            """
            self.gains = nn.ParameterList(
                nn.Parameter(torch.ones(16)) for _ in range(3)
            )
            """
        ),
    ),
    "FM003": Page(
        "Tensors in a plain list or dict stay where they were made: .to('cuda') moves the "
        "model without them (the next forward mixes devices and fails), .half() does not "
        "convert them, and state_dict() does not save them.",
        _net('self.tables = {"sin": torch.zeros(16), "cos": torch.ones(16)}'),
        _net(
            """
            self.register_buffer("sin", torch.zeros(16))
            self.register_buffer("cos", torch.ones(16))
            """
        ),
    ),
    "FM004": Page(
        "An nn.Parameter put into the instance __dict__ directly (object.__setattr__, "
        "self.__dict__[name] = ...) bypasses torch's registration: the attribute reads "
        "fine, but parameters() and state_dict() do not have it.",
        _net('object.__setattr__(self, "gain", nn.Parameter(torch.ones(16)))'),
        _net("self.gain = nn.Parameter(torch.ones(16))"),
    ),
    "FM005": Page(
        "A tensor assigned to a module attribute is kept as a plain attribute: .to() and "
        ".half() leave it as it was (a mask made on the CPU stays there when the model "
        "moves to the GPU), and state_dict() does not save it. A buffer moves and converts "
        "with the model; persistent=False keeps it out of state_dict().",
        _net("self.mask = torch.ones(16)"),
        _net('self.register_buffer("mask", torch.ones(16))'),
    ),
    "FM006": Page(
        "A module put into the instance __dict__ directly (object.__setattr__, "
        "self.__dict__[name] = ...) and registered nowhere in the model is not trained, "
        "saved, moved or switched with it. Sometimes that is the point (a frozen teacher "
        "kept out of state_dict()); then silence the finding where it is made.",
        _net(
            """
            self.fc = nn.Linear(16, 16)
            self.__dict__["teacher"] = nn.Linear(16, 16)
            """
        ),
        _net(
            """
            self.fc = nn.Linear(16, 16)
            self.teacher = nn.Linear(16, 16)
            """
        ),
    ),
    "FM007": Page(
        "torch keeps parameters, buffers and submodules in registries and finds them "
        "through __getattr__, which Python calls only when normal lookup fails. An "
        "instance attribute or a class attribute (a method, a property, a class default) "
        "of the same name is found first: reading the name gives that object, while the "
        "registered one is what is trained, saved and moved.",
        _code(
            """
            class Base(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(16, 2)


            class Net(Base):
                def head(self, x):  # a method named like the registered submodule
                    return x


            model = Net()
            """
        ),
        _code(
            """
            class Base(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(16, 2)


            class Net(Base):
                def classify(self, x):
                    return x


            model = Net()
            """
        ),
    ),
    "FM008": Page(
        "An instance attribute that holds the very object registered under the same name "
        "reads the same today, but registered objects get replaced: .to() and .half() "
        "replace buffers, load_state_dict(assign=True) replaces parameters. The cached "
        "attribute keeps the old one, and reads find it first.",
        _net(
            """
            self.register_buffer("mask", torch.ones(16))
            self.__dict__["mask"] = self.mask  # a faster read
            """
        ),
        _net('self.register_buffer("mask", torch.ones(16))'),
    ),
    "FM009": Page(
        "Parameters and buffers on different devices: a forward that combines them fails "
        "(or copies between devices each call), and the model is only partly where it was "
        "moved. It usually means a part was made on a device of its own, or a tensor kept "
        "where .to() does not reach.",
        _net(
            """
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16, device="meta")
            """
        ),
        _net(
            """
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16)
            """
        ),
    ),
    "FM010": Page(
        "Parameters and buffers of different floating dtypes: operations that mix them "
        "fail or promote silently (a float64 part makes the activations float64, slow "
        "and memory-hungry). Keep an exception (a float32 norm in a bfloat16 model) "
        "deliberate.",
        _net(
            """
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16).double()
            """
        ),
        _net(
            """
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16)
            """
        ),
    ),
    "FM011": Page(
        "A buffer that requires grad is tracked by autograd, but buffers are not in "
        "parameters(): an optimizer built from parameters() never updates it.",
        _net('self.register_buffer("scale", torch.ones(16, requires_grad=True))'),
        _net("self.scale = nn.Parameter(torch.ones(16))"),
    ),
    "FM012": Page(
        "The same tensor registered under several names (tied weights, such as a language "
        "model's input embedding and output projection). It is trained once, but "
        "state_dict() saves it once per name. Usually intended.",
        _code(
            """
            class LM(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = nn.Embedding(100, 16)
                    self.head = nn.Linear(16, 100, bias=False)
                    self.head.weight = self.embed.weight  # tied on purpose


            model = LM()
            """
        ),
    ),
    "FM013": Page(
        "One module registered under several paths: one set of weights serves each path, "
        "and named_modules() lists it once. Usually intended (weight sharing).",
        _net(
            """
            self.encoder = nn.Linear(16, 16)
            self.decoder = self.encoder  # the same module, twice
            """
        ),
    ),
    "FM014": Page(
        "A plain attribute (or a plain container) that refers to modules or parameters "
        "registered elsewhere in the model is only another reference to them: they are "
        "trained, saved and moved through their registered names.",
        _net(
            """
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
            self.taps = [self.blocks[0], self.blocks[2]]  # references only
            """
        ),
    ),
    "FM015": Page(
        "A tensor with a grad_fn kept as an attribute is a result, not state: it keeps "
        "the whole graph of the computation that made it (and the activations in it) "
        "alive until it is replaced.",
        _code(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(16, 16)

                def forward(self, x):
                    y = self.fc(x)
                    self.last = y  # kept for inspection
                    return y


            model = Net()
            model(torch.randn(2, 16))
            """
        ),
    ),
    "FM016": Page(
        "fastmodule's native paths stand in for torch's own __call__, __getattr__, "
        "__setattr__ and __delattr__. A class that overrides one of them (or puts a "
        "mixin that defines __setattr__/__delattr__ after torch.nn.Module in its bases) "
        "runs its own Python code for that path, accelerated or not: the behaviour is "
        "the same, only that path is not faster.",
        _net(
            "self.fc = nn.Linear(16, 16)",
            "\n    def __getattr__(self, name):\n        return super().__getattr__(name)\n",
        ),
        _net("self.fc = nn.Linear(16, 16)"),
    ),
    "FM017": Page(
        "A module whose _parameters, _buffers or _modules is not a plain dict (an "
        "OrderedDict, a custom mapping, TorchScript's wrappers) is read through torch's "
        "__getattr__ by fastmodule; where it is not a dict at all, the audit cannot look "
        "inside.",
        _code(
            """
            from collections import OrderedDict


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(16, 16)
                    self._modules = OrderedDict(self._modules)


            model = Net()
            """
        ),
        _net("self.fc = nn.Linear(16, 16)"),
    ),
    "FM018": Page(
        "torch looks for modules in a module's attributes and registries only, not inside "
        "other objects. A module held by a plain helper object (an attribute of it, or "
        "of an object it holds) is not registered: not trained, saved, moved or switched "
        "by train()/eval(). The audit looks two levels of plain objects deep, into "
        "objects of your own code (and of the package of the module holding them), never "
        "into other libraries' objects such as configs, tokenizers or trainers.",
        _code(
            """
            class Heads:  # a plain class
                def __init__(self):
                    self.cls = nn.Linear(16, 2)
                    self.box = nn.Linear(16, 4)


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.backbone = nn.Linear(16, 16)
                    self.heads = Heads()


            model = Net()
            """
        ),
        _code(
            """
            class Heads(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.cls = nn.Linear(16, 2)
                    self.box = nn.Linear(16, 4)


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.backbone = nn.Linear(16, 16)
                    self.heads = Heads()


            model = Net()
            """
        ),
    ),
    "FM019": Page(
        "A parameter held by a plain helper object is not registered: not in parameters() "
        "(an optimizer never updates it), not in state_dict(), not moved by .to(). The "
        "audit looks as deep as for FM018.",
        _code(
            """
            class Scales:  # a plain class
                def __init__(self):
                    self.gain = nn.Parameter(torch.ones(16))


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(16, 16)
                    self.scales = Scales()


            model = Net()
            """
        ),
        _code(
            """
            class Scales(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.gain = nn.Parameter(torch.ones(16))


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(16, 16)
                    self.scales = Scales()


            model = Net()
            """
        ),
    ),
}

_SILENCE = (
    "On the line the finding names (the assignment): '# fastmodule: ignore[{code}]'. For a "
    "class and its subclasses: a class attribute __fastmodule_ignore__ = {{'{code}': "
    "['attribute', ...]}} ('*' for every attribute and the class itself). For one run: "
    "fastmodule audit --ignore {code} (API: fastmodule.audit(model, ignore=['{code}']))."
)


def _kind(code: str) -> Kind:
    kind = KINDS.get(code.strip().upper())
    if kind is None:
        raise KeyError(f"unknown code {code!r} (codes: {', '.join(KINDS)})")
    return kind


def _paragraph(text: str, width: int) -> str:
    return textwrap.fill(text, width, initial_indent="  ", subsequent_indent="  ")


def explain(code: str, width: int | None = None) -> str:
    """The page for ``code`` (any case): title, what goes wrong, an example, the fix
    and how to silence it, paragraphs wrapped to ``width`` columns (default 88).

    Raises:
        KeyError: an unknown code.
    """
    kind = _kind(code)
    page = PAGES[kind.code]
    width = max(40, min(width or 88, 100))
    parts = [
        f"{kind.code} ({kind.severity}): {kind.title}",
        "",
        "What goes wrong",
        _paragraph(page.details, width),
        "",
        "Example",
        textwrap.indent(page.example.rstrip(), "    "),
        "",
        "Fix",
        _paragraph(kind.fix[0].upper() + kind.fix[1:] + ".", width),
    ]
    if page.fixed is not None:
        parts += ["", textwrap.indent(page.fixed.rstrip(), "    ")]
    parts += [
        "",
        "Silence it",
        _paragraph(_SILENCE.format(code=kind.code), width),
    ]
    return "\n".join(parts)


def explain_dict(code: str) -> dict[str, Any]:
    """The page for ``code`` as JSON-ready data."""
    kind = _kind(code)
    page = PAGES[kind.code]
    return {
        "code": kind.code,
        "severity": kind.severity,
        "title": kind.title,
        "details": page.details,
        "why": kind.why,
        "fix": kind.fix,
        "example": page.example,
        "fixed": page.fixed,
    }


def index(width: int | None = None) -> str:
    """One line per code: its severity and title (``--explain`` without a code)."""
    width = width or 10_000
    lines = []
    for kind in KINDS.values():
        text = f"{kind.code}  {kind.severity:<7}  {kind.title}"
        lines.append(textwrap.shorten(text, width, placeholder=" ...") if width < 200 else text)
    lines.append("")
    lines.append("fastmodule audit --explain CODE shows the page of one.")
    return "\n".join(lines)
