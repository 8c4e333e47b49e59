"""The model of a request: Ψ from ``--params``, or a model preset, model TOML file, config.json, config
dict or architecture (``--model``); the sequence length its positions allow; and what one tensor-, expert-
and pipeline-parallel rank holds of it (cached per architecture and split: a plan asks for each many
times)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.errors import InputError, shown
from zerocalc.base.memo import IdentityCache
from zerocalc.base.units import (
    MAX_COUNT,
    parse_count,
    parse_tokens,
)
from zerocalc.model.architecture import (
    Architecture,
    ParameterCount,
    TensorParallelRank,
    count_parameters,
    pipeline_stage,
)
from zerocalc.parallel.mesh import Mesh, TpStyle
from zerocalc.parallel.pipeline import chunk_layers, mesh_stage_layers
from zerocalc.request.values import DEFAULT_SEQ_LEN, MAX_SEQ_LEN


class ModelSpec(BaseModel):
    """The model: its parameter count, and its architecture when one was named."""

    model_config = ConfigDict(frozen=True)

    params: int = Field(gt=0, description="Ψ")
    name: str | None = None
    title: str | None = None
    architecture: Architecture | None = None
    parameter_count: ParameterCount | None = None
    quantization_config: dict[str, Any] | None = Field(
        default=None, description="its config.json's bitsandbytes quantization_config, as written"
    )


def default_seq_len(arch: Architecture | None) -> int:
    """s when none is given: :data:`DEFAULT_SEQ_LEN`, or a model's learned positions where fewer."""
    if arch is not None and arch.learned_position_embeddings:
        return min(DEFAULT_SEQ_LEN, arch.max_position_embeddings)
    return DEFAULT_SEQ_LEN


def seq_len_of(text: int | str | None, model: ModelSpec) -> tuple[int, tuple[str, ...]]:
    """s: as given, else :data:`DEFAULT_SEQ_LEN` (a model's learned positions where fewer); beyond a rotary
    model's ``max_position_embeddings`` it runs, with a note (beyond learned positions is refused by
    :func:`seq_len_problem`)."""
    arch = model.architecture
    if text is None:
        return default_seq_len(arch), ()
    seq_len = parse_tokens(text, "{seq_len}", 1, MAX_SEQ_LEN)
    if arch is None or arch.learned_position_embeddings or seq_len <= arch.max_position_embeddings:
        return seq_len, ()
    return seq_len, (
        f"--seq-len {seq_len:,} is beyond {model.name or 'the model'}'s max_position_embeddings "
        f"({arch.max_position_embeddings:,}): rotary positions run, past what the model was trained for",
    )


def seq_len_problem(model: ModelSpec, seq_len: int) -> str | None:
    """s beyond a model's learned positions (the position table has no row for them: ``wpe(position_ids)``
    fails), or None."""
    arch = model.architecture
    if arch is None or not arch.learned_position_embeddings or seq_len <= arch.max_position_embeddings:
        return None
    positions = arch.max_position_embeddings
    return (
        f"{{seq_len}} {seq_len:,} is beyond {model.name or 'the model'}'s {positions:,} learned positions "
        f"(its position embedding has {positions:,} rows); accepted: {{seq_len}} 1 to {positions:,}"
    )


def model_notes_of(model: str | Architecture | None) -> tuple[str, ...]:
    if not isinstance(model, str):
        return ()
    from zerocalc.request.presets import model_notes

    return model_notes(model)


@lru_cache(maxsize=64)
def _counted(architecture: Architecture) -> ParameterCount:
    """The parameter count of a loaded architecture (once per architecture: ``plan`` parses hundreds of
    requests of one model)."""
    return count_parameters(architecture)


def model_spec(params: int | str | None, model: str | Architecture | dict[str, Any] | None) -> ModelSpec:
    """Ψ from ``params``, or from a model preset / model TOML file / config.json / architecture (``model``),
    never both."""
    if (params is None) == (model is None):
        raise InputError(
            f"give {{params}} or {{model}}{'' if params is None else ', not both'}; "
            "accepted: {params} 7B, or {model} llama-3-8b / path/model.toml / path/config.json"
        )
    if model is None:
        try:
            return ModelSpec(params=parse_count(params))  # type: ignore[arg-type]
        except InputError:
            if _names_a_model(params):
                raise InputError(
                    f"{{params}} {shown(params)} is a model, not a parameter count; accepted: {{model}} "
                    f"{shown(params)}, or {{params}} a count such as 7B"
                ) from None
            raise
    if isinstance(model, Architecture):
        count = count_parameters(model)
        return ModelSpec(params=count.total, name=model.name, architecture=model, parameter_count=count)
    if isinstance(model, dict):
        return _config_dict_model(model)
    from zerocalc.model.hf_config import config_title
    from zerocalc.request.presets import load_model, model_quantization_config

    architecture, preset = load_model(model)
    count = _counted(architecture)
    if count.total > MAX_COUNT:
        raise InputError(
            f"{{model}} {shown(model)} has {count.total:,} parameters; accepted: a model of at most "
            f"{MAX_COUNT:,}, as {{params}} accepts"
        )
    return ModelSpec(
        params=count.total,
        name=architecture.name,
        title=preset.title if preset else config_title(architecture, model),
        architecture=architecture,
        parameter_count=count,
        quantization_config=model_quantization_config(model),
    )


def _config_dict_model(config: dict[str, Any]) -> ModelSpec:
    """A parsed config.json (``AutoConfig.from_pretrained(...).to_dict()``), read as the file would be."""
    from zerocalc.model.hf_config import architecture_from_hf_dict, config_title, hf_quantization_config

    source = config.get("_name_or_path")
    name = str(source).rstrip("/").rsplit("/", 1)[-1] if source else str(config.get("model_type", "config"))
    architecture = architecture_from_hf_dict(config, "{model} (a config dict)", name or "config", True)
    count = _counted(architecture)
    if count.total > MAX_COUNT:
        raise InputError(
            f"{{model}} (a config dict) has {count.total:,} parameters; accepted: at most {MAX_COUNT:,}"
        )
    return ModelSpec(
        params=count.total,
        name=architecture.name,
        title=config_title(architecture, "a config dict"),
        architecture=architecture,
        parameter_count=count,
        quantization_config=hf_quantization_config(config),
    )


def _names_a_model(text: object) -> bool:
    """Whether ``text``, given as Ψ, names a model preset or file (a keyword mixed up)."""
    if not isinstance(text, str) or not text.strip():
        return False
    from pathlib import Path

    from zerocalc.request.presets import preset_names

    name = text.strip()
    if name.lower() in preset_names("models") or name.lower().endswith((".json", ".toml")):
        return True
    try:
        return Path(name).exists()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte
        return False


def _rank_model(model: ModelSpec, mesh: Mesh) -> ModelSpec:
    """What one tensor- and expert-parallel rank holds: its local shards of every tensor, E/e routed experts
    (the model itself at t = e = 1)."""
    arch = model.architecture
    if (mesh.tp == 1 and mesh.ep == 1) or arch is None:
        return model
    vocab_multiple = 128 if mesh.tp_style is TpStyle.MEGATRON else 1
    rank, count = _tp_share(arch, mesh.tp, mesh.ep, vocab_multiple, mesh.expert_tp)
    return model.model_copy(update={"params": count.total, "architecture": rank, "parameter_count": count})


@lru_cache(maxsize=1024)
def _tp_share(
    arch: Architecture, tp: int, ep: int, vocab_multiple: int, expert_tp: int | None = None
) -> tuple[TensorParallelRank, ParameterCount]:
    """One tensor- and expert-parallel rank's share of ``arch`` and its count (``expert_tp``: the routed
    experts' tensor-parallel ranks, None: t), once per architecture and split (a plan asks for each many
    times)."""
    rank = TensorParallelRank(**dict(arch), tp=tp, ep=ep, vocab_multiple=vocab_multiple, expert_tp=expert_tp)
    return rank, count_parameters(rank)


_SHARES: IdentityCache[tuple[ModelSpec, tuple[ModelSpec, ...]]] = IdentityCache()
_BY_MESH: dict[tuple[int, int], tuple[ModelSpec, Mesh, tuple[ModelSpec, tuple[ModelSpec, ...]]]] = {}
"""The shares by (model, mesh) identity, both kept (a request reads them many times)."""


def rank_models(model: ModelSpec, mesh: Mesh) -> tuple[ModelSpec, tuple[ModelSpec, ...]]:
    """What one rank holds (:attr:`TrainingRequest.rank_model`: the largest pipeline stage's) and, with
    pipeline stages, what each pipeline rank holds (:attr:`TrainingRequest.stages`): its chunks' layers
    (:func:`~zerocalc.parallel.pipeline.chunk_layers`) of one tensor-parallel rank's share. Once per model
    (by identity: a plan's requests share theirs) and split."""
    known = _BY_MESH.get((id(model), id(mesh)))
    if known is not None and known[0] is model and known[1] is mesh:
        return known[2]
    shares = _shares(model, mesh)
    if len(_BY_MESH) >= 4096:
        _BY_MESH.clear()
    _BY_MESH[id(model), id(mesh)] = (model, mesh, shares)
    return shares


def _shares(model: ModelSpec, mesh: Mesh) -> tuple[ModelSpec, tuple[ModelSpec, ...]]:
    split = (mesh.tp, mesh.ep, mesh.tp_style, mesh.pp, mesh.vpp, mesh.expert_tp)
    layout = (mesh.pp_first_stage_layers, mesh.pp_last_stage_layers, mesh.pp_stage_layers)
    key = (*split, *layout)
    shares = _SHARES.get(model, key)
    if shares is None:
        rank = _rank_model(model, mesh)
        arch = rank.architecture
        if mesh.pp == 1 or arch is None:
            shares = rank, ()
        else:
            layers = mesh_stage_layers(mesh, arch.num_layers)
            shares = _pipeline_stages(rank.name, rank.title, arch, mesh.pp, mesh.vpp, layers)
        _SHARES.put(model, key, shares)
    return shares


@lru_cache(maxsize=1024)
def _pipeline_stages(
    name: str | None, title: str | None, arch: Architecture, pp: int, vpp: int, split: tuple[int, ...]
) -> tuple[ModelSpec, tuple[ModelSpec, ...]]:
    """The largest stage and every stage of the model ``name`` (one rank's share, ``arch``) over p ranks of
    v chunks, the p·v virtual stages' layers ``split``; once per model and split (a plan derives many
    requests of each)."""
    stages = []
    for i in range(pp):
        share, count = _stage_share(arch, pp, vpp, i, split)
        stages.append(
            ModelSpec(params=count.total, name=name, title=title, architecture=share, parameter_count=count)
        )
    largest = max(stages, key=lambda stage: stage.params)
    return largest, tuple(stages)


@lru_cache(maxsize=1024)
def _stage_share(
    arch: Architecture, pp: int, vpp: int, stage: int, split: tuple[int, ...]
) -> tuple[Architecture, ParameterCount]:
    """Pipeline rank ``stage``'s share of ``arch`` and its count, its chunks those of the p·v virtual stages'
    layers ``split`` (:func:`~zerocalc.parallel.pipeline.virtual_stage_layers`), once per architecture and
    split (a plan asks for each many times)."""
    chunks = chunk_layers(arch.num_layers, pp, vpp, stage, layers=split)
    layers = tuple(i for chunk in chunks for i in chunk)
    share = pipeline_stage(arch, pp, vpp, stage, layers, tuple(len(chunk) for chunk in chunks))
    return share, count_parameters(share)
