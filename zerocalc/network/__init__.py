"""Who talks to whom and how fast: collectives and their bus factors (`collectives`, after nccl-tests),
rank groups and nodes (`cluster`), link bandwidths (`links`), measured calibrations (`calibration`) and the
words a collective schedule is written in (`schedule`). Imports only :mod:`zerocalc.base`."""
