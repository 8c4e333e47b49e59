"""How a job is parallelised: precision recipes, optimizers, frameworks and their profiles, the
strategies (what is sharded over which ranks) and ZeRO++. Records only: each fact defined once and looked up.
Imports :mod:`zerocalc.base`, :mod:`zerocalc.model` and :mod:`zerocalc.network`."""
