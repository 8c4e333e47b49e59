"""``zerocalc plan``: the fastest configuration that fits, searched, timed and explained.

:mod:`zerocalc.plan.space` parses the options and enumerates the candidates, :mod:`zerocalc.plan.timing`
times a step, :mod:`zerocalc.plan.search` evaluates and ranks them (pure, no printing). Every candidate's
allocated peak is exact and cheap: :mod:`zerocalc.plan.split` splits a step into the framework's part and the
model's, slot by slot, :mod:`zerocalc.plan.layers` extrapolates both from a few layers to all of them, and
:mod:`zerocalc.plan.allocated` runs and combines them, once per configuration and per micro-batch.
"""
