"""The Python side of ``torch.nn.Module``'s whole-tree methods as ``fastmodule.Module``
defines them: each body follows torch's code and runs its walk in the native core
(``walks``, ``conversion``, ``saving``, ``loading``, ``dotted_paths``), the one
mechanism by which they defer to torch (``dispatch``), and torch's runtime state
they consult (``runtime``). Nothing here is handed to the core at import: see
``fastmodule._startup``."""
