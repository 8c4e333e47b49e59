"""``zerocalc plan``: the fastest configuration that fits, searched, timed and explained.

:mod:`zerocalc.plan.space` parses the options and enumerates the candidates, :mod:`zerocalc.plan.candidates`
varies the parsed request into each candidate's (``request.with_``), :mod:`zerocalc.plan.search` prices them
with comm's and the peak's own parts (``zerocalc.base.parts``) and ranks them (pure, no printing). Every candidate's
allocated peak is exact and cheap: :mod:`zerocalc.plan.split` splits a step into the framework's part and the
model's, slot by slot, :mod:`zerocalc.plan.layers` extrapolates both from a few layers to all of them, and
:mod:`zerocalc.plan.allocated` runs and combines them, once per configuration and per micro-batch.
"""
