"""``zerocalc plan``: the fastest configuration that fits, searched, timed and explained.

:mod:`zerocalc.plan.space` parses the options and enumerates the candidates, :mod:`zerocalc.plan.candidates`
varies the parsed request into each candidate's (``request.with_``), :mod:`zerocalc.plan.search` prices them
with comm's and the peak's own parts (``zerocalc.base.parts``) and ranks them (pure, no printing). Every
candidate's allocated peak is exact and cheap: :mod:`zerocalc.plan.split` splits a step into the framework's
part and the model's, slot by slot, :mod:`zerocalc.plan.layers` extrapolates both from a few layers to all of
them, and :mod:`zerocalc.plan.allocated` runs and combines them, once per configuration and per micro-batch.
"""

import sys
from types import ModuleType
from typing import Any


class _CallablePackage(ModuleType):
    """This package, callable as the library's :func:`zerocalc.api.plan`: importing any of its modules
    binds the package to ``zerocalc.plan``, where ``from zerocalc import plan`` then finds it instead of the
    function; called, it is the function."""

    def __call__(self, *args: Any, **options: Any) -> Any:
        from zerocalc.plan.library import plan_from_keywords

        return plan_from_keywords(*args, **options)


sys.modules[__name__].__class__ = _CallablePackage
