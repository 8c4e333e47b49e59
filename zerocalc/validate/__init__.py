"""``zerocalc validate``: real frameworks on real processes, measured against the exact predictions.

``config``, ``compare`` and ``run`` (the orchestration, over :mod:`zerocalc.harness.procs`) import no torch
but to
count GPUs; ``model`` and ``worker`` import torch (only when validate runs).
"""
