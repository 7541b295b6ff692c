"""What fastmodule verified, as users meet it: :class:`UnverifiedWarning`.

The checks themselves are ``fastmodule._verified.verification``: at import, every
torch function a native path reproduces is compared with the code fastmodule was
verified against, and the interpreter with those it was verified on. A path whose
functions do not all match runs torch's own code, exactly as stock;
``import fastmodule`` warns once (:class:`UnverifiedWarning`) naming what it
could not verify, and ``fastmodule.diagnostics()`` lists every path.

The warning class is defined here, at its import path since the first release
(``fastmodule.verification.UnverifiedWarning``: pickles, and warning filters that
name a category by its path, such as pytest's ``filterwarnings``, find it there).
This is a package rather than a ``verification.py`` file so that the file the checks
were in has no successor at its path: git follows it to its new place.
"""

from __future__ import annotations

__all__ = ["UnverifiedWarning"]


class UnverifiedWarning(RuntimeWarning):
    """``import fastmodule`` met something it has not verified; those paths run
    torch's own code (see ``fastmodule.diagnostics()``)."""
