"""Native core of fastmodule (private; use :mod:`fastmodule`)."""

from collections.abc import Callable, Iterable
from types import CodeType
from typing import Any

def init(fast_module: type, off: list[str] = ...) -> None:
    """Capture torch's originals and install the slots on ``fast_module``; the
    paths in ``off`` ("call", "getattr", "registration") stay torch's."""

def install_class(cls: type) -> tuple[bool, bool, bool]:
    """Give ``cls`` the native (call, getattr, setattr) slots its MRO allows."""

def installed(cls: type) -> tuple[bool, bool, bool]:
    """Which of the (call, getattr, setattr) slots ``cls`` carries now."""

def native_tracing_probe() -> bool:
    """Whether jit tracing is detected through libtorch directly."""

def resolve_tracing_probe(torch_library: str | None, walk: bool = True) -> tuple[bool, str]:
    """Find libtorch's ``getTracingState`` from the loaded library ``torch_library``
    (and, if ``walk``, among all loaded libraries): (native probe in use, what was found)."""

def tracing_probe() -> tuple[bool, str]:
    """(native jit-tracing probe in use, what the last lookup found)."""

def recorded_walks() -> bool:
    """Are recorded walks (plans) kept on this interpreter build?"""

def walk(method: str, module: object, *args: object) -> object:
    """torch's tree-walk method ``method`` for ``module``, run natively."""

def clear_plans() -> None:
    """Forget every recorded tree walk (the next walk of each tree records anew)."""

def forget_tree(modules: Iterable[Any]) -> None:
    """Give back what is kept for the tree of ``modules`` (all its modules): the plans
    recorded with one of them as the root, their walk facts, and the remembered names
    (``restore``)."""

def forget_all() -> None:
    """Give back everything kept for every tree: all plans, and the remembered names
    (``uninstall``)."""

def plan_memory() -> tuple[int, int]:
    """(roots watched for their plans, names remembered), for tests."""

def plan_stats() -> tuple[int, int]:
    """(tree walks recorded as plans, walks started from a plan) since import."""

def load_plan_stats() -> tuple[int, int]:
    """(load_state_dict walks recorded as plans, replayed) since import."""

def state_dict_plan_stats() -> tuple[int, int]:
    """(state_dict walks recorded as plans, replayed) since import."""

def eager_plan_stats() -> tuple[int, int]:
    """(train/eval and no-op ``_apply`` walks recorded as plans, replayed) since import."""

def dict_version(d: object) -> tuple[int, int] | None:
    """(the dict's version, an ``OrderedDict``'s order state): both change on any
    mutation (the second also on ``move_to_end``); None for non-dicts."""

def cache_validity() -> str:
    """How remembered dicts and classes are known unchanged here ("dict version
    tags (CPython 3.11)", "dict watcher N"), or why caches and plans are off
    ("off: ...")."""

def init_apply(config: dict[str, object]) -> None:
    """Capture torch's callables and closures used by the native ``_apply``."""

def accelerate_class(cls: type) -> tuple[bool, bool, bool]:
    """Accelerate a ``torch.nn.Module`` subclass in place."""

def restore_class(cls: type) -> bool:
    """Undo ``accelerate_class``; False if the class was not accelerated in place."""

def is_accelerated_class(cls: type) -> bool:
    """Is ``cls`` accelerated in place?"""

def route_torch_methods(bodies: dict[str, object], copies: dict[str, object]) -> None:
    """Route torch's own whole-tree methods to fastmodule's bodies for fast instances."""

def install_route_check(func: object) -> None:
    """Make the Python function ``func``, called eagerly, answer whether torch's
    whole-tree method should run fastmodule's body for its argument."""

def torch_method_intact(name: str) -> bool:
    """Is ``torch.nn.Module.<name>`` still running the code it was routed with?"""

def set_switched_off(off: bool) -> None:
    """Switch every native path off (``fastmodule.disabled()``) or back on."""

def switched_off() -> bool:
    """Is every native path switched off?"""

def seal_torch_methods(names: list[str]) -> None:
    """Record the bodies (code and defaults) of ``torch.nn.Module.<name>`` for
    ``names`` as they are now; once one is replaced, whole-tree calls run torch's
    code."""

def init_load(config: dict[str, object]) -> None:
    """Capture torch's callables used by the native load walk."""

def load_tree(
    module: object,
    state_dict: object,
    metadata: object,
    assign: object,
    missing: list[str],
    unexpected: list[str],
    errors: list[str],
    post_hook_text: str,
) -> None:
    """torch's ``load()`` walk of ``load_state_dict``, natively."""

def load_replay(
    module: object,
    state_dict: object,
    metadata: object,
    assign: object,
    missing: list[str],
    unexpected: list[str],
    errors: list[str],
    post_hook_text: str,
) -> bool:
    """The load from ``module``'s recorded walk when ``state_dict`` holds exactly its
    keys (True: done, copy failures appended to ``errors``; a module changed during
    the load is loaded live, its keys reported in ``missing``/``unexpected``);
    False: nothing done."""

def init_hooks(config: dict[str, object]) -> None:
    """Switch the native dispatch of forward hooks on (``fastmodule._verified.hook_dispatch``)."""

def init_layers(config: dict[str, object]) -> None:
    """Capture torch's layer functions the call path may run natively."""

def init_runtime(config: dict[str, object]) -> None:
    """Capture torch's grad-mode, mode and ``torch.__future__`` accessors."""

def init_frame_counting(classify: Callable[[CodeType], int]) -> None:
    """Register ``fastmodule._verified.frame_counting.classify`` with the call path."""

def init_containers(config: dict[str, object]) -> None:
    """Serve torch's ModuleList/Sequential/ModuleDict protocol methods natively."""

def call_handover(module: object) -> str | None:
    """Why calling ``module`` now runs torch's ``_wrapped_call_impl``; None: native."""

def is_quiet(obj: object) -> bool:
    """Would a lookup by an exact str in ``obj`` run no code (str-only exact dict/set)?"""

def quiet_dicts_known() -> bool:
    """Did the import-time check of CPython's dict key-table layout succeed?"""

def ascii_layout_known() -> bool:
    """Did the import-time check of a compact ASCII str's layout succeed (state_dict
    keys matched as bytes; else as strs)?"""

def locate_tracer_fields(profile: object, trace: object) -> bool:
    """From a fresh thread that just set both: find the thread state's tracer fields."""

def confirm_tracer_fields() -> bool:
    """From the same thread with both unset: confirm the fields, enable the check."""

def tracer_check_known() -> bool:
    """Can the call path tell that a trace or profile function is set?"""

def set_tracer_check(on: bool) -> bool:
    """Switch the tracer check on or off (tests); returns the previous setting."""
