"""``zerocalc plan``: the fastest configuration that fits, searched, timed and explained.

:mod:`zerocalc.plan.space` parses the options and enumerates the candidates, :mod:`zerocalc.plan.timing`
times a step, :mod:`zerocalc.plan.search` evaluates and ranks them (pure, no printing).
"""
