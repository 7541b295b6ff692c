"""What fastmodule verifies about the interpreter and the installed torch before a
native path turns on, and what it hands the native core from torch once verified:
the verification itself (``verification``, against ``verified_torch``), the CPython
trace/profile fields (``tracer_probe``), torch's layers and containers
(``layers``, ``layer_specs``), forward hooks (``hook_dispatch``), torch's
frame-counting ``forward`` functions (``frame_counting``) and the statement put in
front of torch's whole-tree methods (``inline_routes``). Importing a module here
only answers questions; nothing is handed to the core or written into torch until
``fastmodule._startup.start()``."""
