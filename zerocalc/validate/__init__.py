"""``zerocalc validate``: real frameworks on real processes, measured against the exact predictions.

``config`` and ``compare`` are pure; ``model`` and ``worker`` import torch (only when validate runs).
"""
