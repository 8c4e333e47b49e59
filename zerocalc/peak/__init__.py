"""Peak memory per GPU of one training step.

* :mod:`~zerocalc.parallel.framework_records`: one :class:`~zerocalc.parallel.framework_records.record.
  FrameworkRecord` per framework (paper, deepspeed, megatron, fsdp, fsdp2, torch-zero1, ddp), each citing its
  source, in a registry;
* :mod:`~zerocalc.peak.states`: the model-state lines of each record's accounting;
* :mod:`~zerocalc.peak.buffers`: communication buffers and gathered parameters;
* :mod:`~zerocalc.peak.evaluate`: :func:`~zerocalc.peak.evaluate.evaluate_peak`, request → report;
* :mod:`~zerocalc.peak.report`: the typed result (:class:`~zerocalc.peak.report.MemoryReport`) that both
  the Rich renderer and ``--json`` read.

This package's ``__init__`` imports nothing, so that reading the framework records stays cheap.
"""
