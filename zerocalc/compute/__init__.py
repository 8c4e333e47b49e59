"""Compute time from the hardware: the operations of a training step at their per-rank shapes
(:mod:`.ops`), what a GPU achieves on each shape (:mod:`.table`, measured by ``zerocalc bench --compute``
or a GPU preset's), and their sum (:mod:`.time`)."""
