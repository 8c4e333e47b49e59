"""A user's own launch configuration read into the options the flags give.

Three formats, each mapped key by key onto :data:`zerocalc.request.options.OPTIONS` (the flags a user types
override what a file says):

* a DeepSpeed config (``ds_config.json``; keys as in ``deepspeed/runtime/config.py`` and
  ``deepspeed/runtime/zero/config.py``, DeepSpeed 0.16);
* a torchtitan job TOML (``torchtitan/config/job_config.py``, v0.2.2: ``[parallelism]``, ``[training]``,
  ``[activation_checkpoint]``, ``[model]``, ``[optimizer]``; and the older layout of ``config_manager.py`` at
  commit 9dec370, whose degrees are under ``[training]`` and ``[experimental]``);
* an accelerate config (``accelerate config``'s YAML, ``accelerate/commands/config/config_args.py``, with its
  ``fsdp_config`` or ``deepspeed_config`` table).

:func:`read_launch_config` is pure (text in, :class:`~zerocalc.request.launch_config.LaunchConfig` out), one
module per format (:mod:`zerocalc.request.launch_deepspeed`, :mod:`zerocalc.request.launch_torchtitan`,
:mod:`zerocalc.request.launch_accelerate`); :func:`read_launch_configs` reads a user's files into the
options, :func:`with_launch_configs` the options of one command.
Every key is sorted by its format's table in :mod:`zerocalc.request.launch_keys`: modelled (read here),
harmless (listed in :attr:`LaunchConfig.harmless`) or refused; a setting zerocalc cannot honour (a schedule
or a layer split it does not model, a value it does not know, a key no table names) is an
:class:`~zerocalc.base.errors.InputError` naming the key, never dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError, shown, why_not
from zerocalc.base.paths import user_path
from zerocalc.request.launch_config import LaunchConfig, LaunchFormat
from zerocalc.request.model_spec import model_spec
from zerocalc.request.options import LAUNCH_CONFIGS, Command, options_for

if TYPE_CHECKING:
    from zerocalc.model.architecture import Architecture


def read_launch_config(kind: LaunchFormat, text: str, where: str) -> LaunchConfig:
    """The options ``text`` (a file of format ``kind``, named ``where`` in messages) sets. The readers are
    imported here, where a file is read: a command without one does not load them (start-up)."""
    from zerocalc.request.launch_accelerate import accelerate_config, read_yaml
    from zerocalc.request.launch_deepspeed import deepspeed_config, read_json
    from zerocalc.request.launch_torchtitan import read_toml, torchtitan_config

    if kind is LaunchFormat.DEEPSPEED:
        return deepspeed_config(read_json(text, where), where)
    if kind is LaunchFormat.TORCHTITAN:
        return torchtitan_config(read_toml(text, where), where)
    return accelerate_config(read_yaml(text, where), where)


_STAGE_OPTIONS = frozenset({"pp", "vpp", "pp_first_stage_layers", "pp_last_stage_layers", "pp_stage_layers"})
"""The options a file's stage split sets; one of them given on the command line, the split is the flags'."""


def _architecture(model: Any) -> Architecture | None:
    """The architecture of the model named (a preset, a file, an architecture, a config dict), or None
    without one or without its architecture (the request's parser refuses a pipeline and FP8 then)."""
    return None if model is None else model_spec(None, model).architecture


def read_launch_configs(
    values: dict[str, Any], given: frozenset[str], accepted: frozenset[str]
) -> tuple[dict[str, Any], list[str]]:
    """``values`` with what each named launch configuration (``values[format]``: a path) sets, for every
    option in ``accepted`` that was not ``given`` explicitly (flags override the files); and the notes to
    print (what each file set is echoed in the JSON's ``options``; what it has that zerocalc does not model
    is listed). Files are read in :class:`LaunchFormat`'s order; a later one overrides an earlier one."""
    merged = dict(values)
    notes: list[str] = []
    for kind in LaunchFormat:
        path = values.get(kind.value)
        if path is None:
            continue
        where = f"{{{kind.value}}} {shown(path)}"
        try:
            text = user_path(path).read_text(encoding="utf-8-sig")
        except (OSError, ValueError) as exc:
            raise InputError(f"{where} cannot be read ({why_not(exc)}); accepted: a readable file") from exc
        config = read_launch_config(kind, text, where)
        for name, value in config.values.items():
            if name in accepted and name not in given:
                merged[name] = value
        if config.stages is not None and not given & _STAGE_OPTIONS:
            architecture = _architecture(merged.get("model"))
            if architecture is not None:
                stages = config.stages.options(architecture.num_layers)
                merged.update({k: v for k, v in stages.items() if k in accepted})
        if config.fp8_skip_of_model and "fp8_skip" in accepted and "fp8_skip" not in given:
            architecture = _architecture(merged.get("model"))
            if architecture is not None:
                from zerocalc.parallel.fp8 import accelerate_ao_skip

                merged["fp8_skip"] = ",".join(accelerate_ao_skip(architecture))  # as the flag reads
        notes += config.note_lines(f"{kind.value} {Path(path).name}")
    return merged, notes


def with_launch_configs(
    command: Command, values: dict[str, Any], given: frozenset[str]
) -> tuple[dict[str, Any], list[str]]:
    """The values of ``command``'s request options, each launch config named in ``values`` setting those
    not ``given`` explicitly (:func:`read_launch_configs`), and the notes the
    configs add. The CLI and the library both call it; each says which options were given."""
    names = [o.name for o in options_for(command, request_only=True)]
    notes: list[str] = []
    if any(values.get(name) is not None for name in LAUNCH_CONFIGS):
        values, notes = read_launch_configs(values, given, frozenset(names))
    return {name: values[name] for name in names if name in values}, notes
