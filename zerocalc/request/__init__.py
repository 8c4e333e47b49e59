"""One training request: the options as typed, parsed and validated once into a frozen
:class:`~zerocalc.request.training.TrainingRequest`, presets and config.json files loaded here
(`presets`). The only layer that parses strings or reads files for the core."""
