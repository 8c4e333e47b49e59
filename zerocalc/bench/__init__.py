"""``zerocalc bench``: measure the collectives ZeRO and FSDP issue and write a calibration.

``config``, ``defaults``, ``sweep``, ``fit`` and ``topology`` are pure (no torch); ``worker`` imports torch
and is only imported by the ``bench`` command, never at start-up. Processes are started and watched by
:mod:`zerocalc.harness.procs`.
"""
