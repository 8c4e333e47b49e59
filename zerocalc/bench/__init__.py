"""``zerocalc bench``: measure the collectives ZeRO and FSDP issue and write a calibration.

``sweep`` and ``fit`` are pure (no torch); ``worker`` and ``launch`` import torch and are only imported by
the ``bench`` command, never at start-up.
"""
