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

:func:`read_launch_config` is pure (text in, :class:`LaunchConfig` out); reading the file is the caller's.
Every key a format defines that zerocalc does not model is listed in :attr:`LaunchConfig.unmodelled`, and a
setting zerocalc cannot honour (a schedule or a layer split it does not model, a value it does not know) is
an :class:`~zerocalc.base.errors.InputError` naming the key, never dropped.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Any

from zerocalc.base.errors import InputError


class LaunchFormat(StrEnum):
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    ACCELERATE = "accelerate"


@dataclass(frozen=True)
class LaunchConfig:
    """What a launch configuration says, as option values (keyword → value as the library takes it)."""

    values: dict[str, Any]
    notes: tuple[str, ...] = ()
    unmodelled: tuple[str, ...] = field(default=())
    """Keys of the file that zerocalc reads but does not model (dotted paths)."""
    stages: TitanStages | None = None
    """How the file splits the model's layers over pipeline stages, which gives ``vpp`` and the first and
    last stage's layers once the model's layer count is known (:meth:`TitanStages.options`)."""

    def note_lines(self, source: str) -> list[str]:
        lines = [f"{source}: {note}" for note in self.notes]
        if self.unmodelled:
            lines.append(f"{source}: not modelled: {', '.join(self.unmodelled)}")
        return lines


def read_launch_config(kind: LaunchFormat, text: str, where: str) -> LaunchConfig:
    """The options ``text`` (a file of format ``kind``, named ``where`` in messages) sets."""
    if kind is LaunchFormat.DEEPSPEED:
        return _deepspeed(_json(text, where), where)
    if kind is LaunchFormat.TORCHTITAN:
        return _torchtitan(_toml(text, where), where)
    return _accelerate(_yaml(text, where), where)


# ---------------------------------------------------------------------------------------------- parsing
def _json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where} is not JSON ({exc.msg}, line {exc.lineno}); accepted: a ds_config.json"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{where} is not a JSON object; accepted: a ds_config.json")
    return data


def _toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where} is not TOML ({exc}); accepted: a torchtitan job TOML") from None


def _scalar(text: str) -> Any:
    raw = text.strip()
    if raw in ("", "null", "~"):
        return None
    if raw in ("true", "True"):
        return True
    if raw in ("false", "False"):
        return False
    if raw[:1] in "'\"" and raw[-1:] == raw[:1]:
        return raw[1:-1]
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw


def _yaml(text: str, where: str) -> dict[str, Any]:
    """accelerate's config YAML: mappings of scalars nested by indentation (what ``accelerate config``
    writes). Lists and flow collections are refused in one line rather than misread."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for number, line in enumerate(text.splitlines(), 1):
        content = line.split(" #", 1)[0].rstrip()
        if not content.strip() or content.lstrip().startswith("#") or content.strip() == "---":
            continue
        indent = len(content) - len(content.lstrip())
        key, sep, value = content.strip().partition(":")
        if not sep or content.strip().startswith("- ") or value.strip()[:1] in ("[", "{", "|", ">"):
            raise InputError(
                f"{where} line {number} {content.strip()!r} is not a 'key: value' line; accepted: an "
                "accelerate config as `accelerate config` writes it"
            )
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key.strip()] = _scalar(value)
        else:
            child: dict[str, Any] = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return root


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _refuse(where: str, key: str, value: Any, accepted: str) -> InputError:
    return InputError(f"{where}: {key} {value!r} is not modelled; accepted: {accepted}")


# -------------------------------------------------------------------------------------------- DeepSpeed
_DS_STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
_DS_READ = {
    "zero_optimization.stage", "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device", "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size", "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_quantized_gradients",
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16.enabled", "fp16.enabled",
    "communication_data_type", "optimizer.type",
}  # fmt: skip
_DS_HARMLESS = {"train_batch_size", "steps_per_print", "wall_clock_breakdown", "gradient_clipping"}
"""Keys with no bearing on memory or communication per step (listed as not modelled all the same)."""


def _zero(values: dict[str, Any], where: str, get: Any, key: str) -> None:
    """A DeepSpeed ZeRO stage (``key``) as ``strategies``."""
    stage = get(key)
    if stage is not None:
        if stage not in _DS_STAGES:
            raise _refuse(where, key, stage, "0, 1, 2 or 3")
        values["strategies"] = _DS_STAGES[stage]


def _offload(values: dict[str, Any], where: str, get: Any, key: str, option: str) -> None:
    """A DeepSpeed offload device (``key``) as ``option``."""
    device = get(key)
    if device is not None:
        if str(device).lower() not in ("none", "cpu", "nvme"):
            raise _refuse(where, key, device, "none, cpu or nvme")
        values[option] = str(device).lower()


def _deepspeed(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(config)
    values: dict[str, Any] = {"framework": "deepspeed"}
    notes: list[str] = []
    for key, value in flat.items():
        if value == "auto":
            notes.append(
                f"{key} is 'auto' (filled in by the Hugging Face Trainer): zerocalc's default is used"
            )
    get = {k: v for k, v in flat.items() if v != "auto"}.get
    _zero(values, where, get, "zero_optimization.stage")
    _offload(values, where, get, "zero_optimization.offload_optimizer.device", "offload_optimizer")
    _offload(values, where, get, "zero_optimization.offload_param.device", "offload_params")
    for key, option in (
        ("zero_optimization.reduce_bucket_size", "reduce_bucket"),
        ("zero_optimization.allgather_bucket_size", "allgather_bucket"),
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
    ):
        if get(key) is not None:
            values[option] = str(get(key))
    if get("bf16.enabled") and get("fp16.enabled"):
        raise _refuse(where, "bf16.enabled and fp16.enabled", True, "one of them")
    if get("bf16.enabled") is not None or get("fp16.enabled") is not None:
        values["precision"] = (
            "bf16-mixed" if get("bf16.enabled") else "fp16-mixed" if get("fp16.enabled") else "fp32"
        )
    if get("communication_data_type") is not None:
        values["reduce_dtype"] = str(get("communication_data_type"))
    zeropp = [
        name
        for name, on in (
            ("qwz", get("zero_optimization.zero_quantized_weights")),
            ("hpz", (get("zero_optimization.zero_hpz_partition_size") or 1) > 1),
            ("qgz", get("zero_optimization.zero_quantized_gradients")),
        )
        if on
    ]
    if zeropp:
        values["zeropp"] = ",".join(zeropp)
    optimizer = get("optimizer.type")
    if optimizer is not None:
        name = str(optimizer).lower()
        if name not in ("adam", "adamw"):
            raise _refuse(where, "optimizer.type", optimizer, "Adam or AdamW")
        values["optimizer"] = name
    unmodelled = sorted(k for k in flat if k not in _DS_READ and not k.startswith("optimizer.params"))
    return LaunchConfig(values=values, notes=tuple(notes), unmodelled=tuple(unmodelled))


# ------------------------------------------------------------------------------------------- torchtitan
_TITAN_MODELS = {
    ("llama3", "8B"): "llama-3-8b",
    ("llama3", "70B"): "llama-3-70b",
    ("llama3", "405B"): "llama-3.1-405b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
}
_TITAN_AC_MODES = ("none", "full", "selective")
_TITAN_SAC_DEFAULT = "2"
"""torchtitan ``ActivationCheckpoint.selective_ac_option``'s default (v0.2.2 ``config/job_config.py``)."""
_TITAN_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
_TITAN_REDUCE_DEFAULT = "float32"
"""``Training.mixed_precision_reduce``'s default (v0.2.2 ``config/job_config.py``, and ``config_manager.py``
at commit 9dec370): FSDP reduces gradients in fp32 unless the file says otherwise."""
_TITAN_LOCAL_BATCH_DEFAULT = 8
"""``Training.local_batch_size``'s default (v0.2.2 ``config/job_config.py``; ``--training.batch_size`` at
9dec370): the sequences a data-parallel rank's pipeline splits into micro-batches."""
_TITAN_SCHEDULES: dict[str, tuple[str, bool]] = {
    "gpipe": ("gpipe", False),
    "1f1b": ("1f1b", False),
    "interleaved1f1b": ("interleaved-1f1b", True),
    "interleavedzerobubble": ("zero-bubble", True),
}
"""torch.distributed.pipelining ``get_schedule_class``'s names (case-insensitive,
``torch/distributed/pipelining/schedules.py``) that zerocalc models: its ``--pp-schedule``, and whether the
schedule runs several stages a rank (a ``PipelineScheduleMulti``). LoopedBFS (breadth-first), ZBVZeroBubble
and DualPipeV (two stages a rank in a V: rank i holds stages i and 2p − 1 − i) are not modelled."""
_TITAN_SCHEDULES_ACCEPTED = "GPipe, 1F1B, Interleaved1F1B or InterleavedZeroBubble"
_TITAN_RENAMED = {
    "training.data_parallel_shard_degree": "parallelism.data_parallel_shard_degree",
    "training.data_parallel_replicate_degree": "parallelism.data_parallel_replicate_degree",
    "training.tensor_parallel_degree": "parallelism.tensor_parallel_degree",
    "training.fsdp_reshard_after_forward": "parallelism.fsdp_reshard_after_forward",
    "training.batch_size": "training.local_batch_size",
    "experimental.context_parallel_degree": "parallelism.context_parallel_degree",
    "experimental.pipeline_parallel_degree": "parallelism.pipeline_parallel_degree",
    "experimental.pipeline_parallel_schedule": "parallelism.pipeline_parallel_schedule",
    "experimental.pipeline_parallel_schedule_csv": "parallelism.pipeline_parallel_schedule_csv",
    "experimental.pipeline_parallel_split_points": "parallelism.pipeline_parallel_split_points",
    "experimental.pipeline_parallel_microbatches": "parallelism.pipeline_parallel_microbatches",
}
"""The older layout's keys (``config_manager.py`` at commit 9dec370: degrees under ``[training]`` and
``[experimental]``, ``batch_size``) as the v0.2.2 keys they became (commit 785c34c moved them to
``[parallelism]``, v0.1.0 renamed ``batch_size`` ``local_batch_size``)."""
_TITAN_COUNTED = "parallelism.pipeline_parallel_microbatches"
"""The older layouts' micro-batch count (default: the pipeline degree), which commit 5e2033c replaced by
``pipeline_parallel_microbatch_size``; a file with it splits layers as 9dec370 did."""
_TITAN_SIZED = (
    "parallelism.pipeline_parallel_microbatch_size", "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.pipeline_parallel_first_stage_less_layers",
    "parallelism.pipeline_parallel_last_stage_less_layers", "parallelism.module_fqns_per_model_part",
)  # fmt: skip
"""The keys of the layout that sizes micro-batches (v0.1.0 on), not read with :data:`_TITAN_COUNTED`."""
_TITAN_READ = {
    "model.name", "model.flavor", "parallelism.data_parallel_shard_degree",
    "parallelism.data_parallel_replicate_degree", "parallelism.tensor_parallel_degree",
    "parallelism.pipeline_parallel_degree", "parallelism.context_parallel_degree",
    "parallelism.expert_parallel_degree", "parallelism.expert_tensor_parallel_degree",
    "parallelism.fsdp_reshard_after_forward", "parallelism.pipeline_parallel_schedule",
    "parallelism.pipeline_parallel_schedule_csv", "parallelism.pipeline_parallel_split_points",
    _TITAN_COUNTED, *_TITAN_SIZED, "training.local_batch_size", "training.seq_len",
    "training.mixed_precision_param", "training.mixed_precision_reduce", "activation_checkpoint.mode",
    "activation_checkpoint.selective_ac_option", "optimizer.name",
}  # fmt: skip


@dataclass(frozen=True)
class TitanStages:
    """torchtitan's split of a model's L layers into S pipeline stages, s = S/p of them on each of the p
    ranks (rank i holds stages i, i + p, …: ``stage_ids_this_rank`` / ``pipeline_module_split`` ``loop``
    style), the embedding on stage 0 and the norm and head on stage S − 1.

    * Explicit: ``pipeline_parallel_split_points`` (``layers.N`` starts a stage; 9dec370, v0.1.0) or
      ``module_fqns_per_model_part`` (each stage's modules; v0.2.2).
    * v0.2.2's default (``distributed/pipeline_parallel.py`` ``pipeline_llm`` and
      ``generate_llm_fqn_per_model_part``; v0.1.0's ``generate_split_points`` splits alike): s = 1 for a
      single-stage schedule, 2 for a multi-stage one, or S = ⌈(L + a + z)/``layers_per_stage``⌉; the
      embedding counts as a = ``first_stage_less_layers`` layers and the head as z =
      ``last_stage_less_layers`` (1 each), the L + a + z split evenly over S, the first (L + a + z) mod S
      stages one more; Llama 3.1 405B at p 8: 15, 16 × 6, 15.
    * 9dec370's default (``parallelisms/pipelining_utils.py`` ``generate_split_points``): ⌊L/S⌋ on the
      first stage, one more on each following stage while L mod S lasts, the rest on the last.
    """

    where: str
    pp: int
    multi_stage: bool
    counted: bool
    """The older layouts' split (9dec370's), else v0.2.2's."""
    schedule_key: str
    first_weight: int = 1
    last_weight: int = 1
    layers_per_stage: int | None = None
    split_points: tuple[str, ...] | None = None
    parts: tuple[int, ...] | None = None
    """Layers of each stage of ``module_fqns_per_model_part``."""

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layers of each of the S stages, in order."""
        if self.parts is not None:
            if sum(self.parts) != num_layers:
                raise self._problem(f"its stages hold {sum(self.parts)} layers, the model {num_layers}")
            return self.parts
        if self.split_points is not None:
            return self._from_points(num_layers)
        stages = self.pp * (2 if self.multi_stage else 1)
        if self.counted:
            if stages > num_layers:
                raise self._problem(f"{stages} stages are more than the model's {num_layers} layers")
            base, extra = divmod(num_layers, stages)
            counts = [base]
            for _ in range(stages - 2):
                counts.append(base + (1 if extra > 0 else 0))
                extra -= 1
            return (*counts, num_layers - sum(counts))
        effective = num_layers + self.first_weight + self.last_weight
        if self.layers_per_stage is not None:
            stages = -(-effective // self.layers_per_stage)
        per, extra = divmod(effective, stages)
        if per < max(self.first_weight, self.last_weight, 1):
            raise self._problem(f"{stages} stages over {effective} effective layers leave {per} a stage")
        counts = [per + (1 if stage < extra else 0) for stage in range(stages)]
        counts[0] -= self.first_weight
        counts[-1] -= self.last_weight
        return tuple(counts)

    def _from_points(self, num_layers: int) -> tuple[int, ...]:
        starts: list[int] = []
        for point in self.split_points or ():
            name, _, index = str(point).partition(".")
            if name != "layers" or not index.isdigit():
                raise self._problem(f"split point {point!r} is not a layer ('layers.N')")
            starts.append(int(index))
        bounds = [0, *starts, num_layers]
        if any(b <= a for a, b in pairwise(bounds)):
            raise self._problem(
                f"split points {', '.join(self.split_points or ())} are not increasing layers"
            )
        return tuple(b - a for a, b in pairwise(bounds))

    def _problem(self, why: str) -> InputError:
        return InputError(f"{self.where}: torchtitan's pipeline stages cannot be built ({why})")

    def options(self, num_layers: int) -> dict[str, str]:
        """``vpp`` and the split for the model's L layers: the first and last stage's layers where the
        stages are Megatron-LM's uneven split (s equal chunks a rank, every rank but the first and last
        holding the same layers: :func:`~zerocalc.parallel.pipeline.stage_layer_counts`), else each
        stage's layers (``--pp-stage-layers``: torchtitan's stage k is on rank k mod p, as zerocalc's
        virtual stage k); an :class:`InputError` where a stage holds no layer (the embedding or the head
        alone), which zerocalc does not model."""
        from zerocalc.parallel.mesh import describe_layer_counts
        from zerocalc.parallel.pipeline import split_problem, stage_layer_counts

        counts = self.stage_layers(num_layers)
        stages, pp = len(counts), self.pp
        if stages % pp:
            raise self._problem(f"{stages} stages do not divide over {pp} pipeline ranks")
        vpp = stages // pp
        if (vpp > 1) != self.multi_stage:
            kind = "several stages a rank" if self.multi_stage else "one stage a rank"
            raise self._problem(f"{self.schedule_key} runs {kind}, the split gives {vpp}")
        ranks = [vpp * counts[rank] for rank in range(pp)]
        chunked = all(counts[j * pp + rank] == counts[rank] for j in range(vpp) for rank in range(pp))
        middle = set(ranks[1:-1])
        first = last = None
        if len(middle) == 1:
            (even,) = middle
            first = ranks[0] if ranks[0] != even else None
            last = ranks[-1] if ranks[-1] != even else None
        elif pp == 2 and ranks[0] != ranks[1]:
            first = ranks[0]
        if min(counts) < 1:
            rule = "9dec370" if self.counted else "v0.2.2"
            made = (
                "given"
                if self.parts is not None or self.split_points is not None
                else f"torchtitan {rule} default"
            )
            raise InputError(
                f"{self.where}: the {made} split of {num_layers} layers into {stages} stages over {pp} ranks "
                f"(layers a stage: {describe_layer_counts(counts)}) leaves a stage without a layer, which "
                "is not modelled; accepted: every stage at least one layer (set "
                "parallelism.pipeline_parallel_split_points or module_fqns_per_model_part), or "
                "{pp_stage_layers} given"
            )
        megatron = (
            chunked
            and len(middle) <= 1
            and split_problem(num_layers, pp, vpp, first, last) is None
            and stage_layer_counts(num_layers, pp, first, last) == tuple(ranks)
        )
        values = {"vpp": str(vpp)} if vpp > 1 else {}
        if megatron:
            ends = (("pp_first_stage_layers", first), ("pp_last_stage_layers", last))
            values.update({name: str(n) for name, n in ends if n})
        else:
            values["pp_stage_layers"] = ",".join(map(str, counts))
        return values


def _titan_selective(option: str, where: str) -> dict[str, str]:
    """``mode = "selective"`` by its ``selective_ac_option`` (v0.2.2 ``distributed/activation_checkpoint.py``
    ``_apply_ac_to_transformer_block``): ``op`` is the op-level policy (``--recompute op``); a whole number
    N checkpoints every N-th block whole (``_apply_layer_sac``: ``not ac_freq or count % ac_freq == 0``):
    ``--recompute full --checkpoint-every N``, every block for 0 and 1."""
    if option == "op":
        return {"recompute": "op"}
    if option.isdigit():
        return {"recompute": "full", "checkpoint_every": str(max(1, int(option)))}
    raise _refuse(
        where,
        "activation_checkpoint.selective_ac_option",
        option,
        "op, or a whole number N (every N-th block)",
    )


def _titan_renamed(flat: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``flat`` with the older layout's keys under their v0.2.2 names, and each renamed key's name in the
    file (for messages)."""
    renamed = dict(flat)
    spelled: dict[str, str] = {}
    for old, new in _TITAN_RENAMED.items():
        if old in flat:
            if new in flat:
                raise _refuse(
                    where, f"{old} and {new}", flat[old], "one of them (the older layout's or v0.2.2's)"
                )
            renamed[new] = renamed.pop(old)
            spelled[new] = old
    return renamed, spelled


def _titan_pipeline(get: Any, name: Any, where: str, pp: int, values: dict[str, Any]) -> TitanStages:
    """The pipeline of a job with p = ``pp`` > 1 ranks: ``pp``, ``pp_schedule``, the micro-batch and the
    micro-batches a step (v0.2.2 ``distributed/pipeline_parallel.py`` ``build_pipeline_schedule``:
    ``local_batch_size / pipeline_parallel_microbatch_size`` micro-batches; 9dec370
    ``pipelining_utils.py``: ``pipeline_parallel_microbatches``, default p, each a share of the batch), and
    how the layers split (:class:`TitanStages`)."""
    schedule_key = name("parallelism.pipeline_parallel_schedule")
    csv = get("parallelism.pipeline_parallel_schedule_csv")
    if csv:
        raise _refuse(
            where,
            name("parallelism.pipeline_parallel_schedule_csv"),
            csv,
            f"none: a schedule by name, {_TITAN_SCHEDULES_ACCEPTED}",
        )
    schedule = str(get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if schedule.lower() not in _TITAN_SCHEDULES:
        raise _refuse(where, schedule_key, schedule, _TITAN_SCHEDULES_ACCEPTED)
    zerocalc_schedule, multi_stage = _TITAN_SCHEDULES[schedule.lower()]
    batch_key = name("training.local_batch_size")
    batch = _whole(get("training.local_batch_size", _TITAN_LOCAL_BATCH_DEFAULT), batch_key, where)
    counted = get(_TITAN_COUNTED) is not None or name("parallelism.pipeline_parallel_degree") != (
        "parallelism.pipeline_parallel_degree"
    )
    if counted:
        mixed = [key for key in _TITAN_SIZED if get(key) is not None]
        if mixed:
            raise _refuse(
                where, f"{name(_TITAN_COUNTED)} with {mixed[0]}", get(mixed[0]), "one layout's keys"
            )
        count_key = name(_TITAN_COUNTED)
        if get(_TITAN_COUNTED) is None:
            section = name("parallelism.pipeline_parallel_degree").split(".")[0]
            count_key = f"{section}.pipeline_parallel_microbatches (unset: the pipeline degree)"
        micro_batches = _whole(get(_TITAN_COUNTED, pp), count_key, where)
        if batch % micro_batches:
            raise _refuse(where, count_key, micro_batches, f"a divisor of {batch_key} {batch}")
        micro_batch = batch // micro_batches
    else:
        micro_batch = _whole(
            get("parallelism.pipeline_parallel_microbatch_size", 1),
            "parallelism.pipeline_parallel_microbatch_size",
            where,
        )
        if batch % micro_batch:
            raise _refuse(
                where,
                "parallelism.pipeline_parallel_microbatch_size",
                micro_batch,
                f"a divisor of {batch_key} {batch}",
            )
        micro_batches = batch // micro_batch
    values.update(
        pp=str(pp), pp_schedule=zerocalc_schedule, micro_batch=str(micro_batch), grad_accum=str(micro_batches)
    )
    fqns = get("parallelism.module_fqns_per_model_part")
    points = get("parallelism.pipeline_parallel_split_points")
    layers_per_stage = get("parallelism.pipeline_parallel_layers_per_stage")
    return TitanStages(
        where=where,
        pp=pp,
        multi_stage=multi_stage,
        counted=counted,
        schedule_key=f"{schedule_key} {schedule}",
        first_weight=_whole(
            get("parallelism.pipeline_parallel_first_stage_less_layers", 1),
            "parallelism.pipeline_parallel_first_stage_less_layers",
            where,
            0,
        ),
        last_weight=_whole(
            get("parallelism.pipeline_parallel_last_stage_less_layers", 1),
            "parallelism.pipeline_parallel_last_stage_less_layers",
            where,
            0,
        ),
        layers_per_stage=None
        if layers_per_stage is None
        else _whole(layers_per_stage, "parallelism.pipeline_parallel_layers_per_stage", where),
        split_points=tuple(points) if points else None,
        parts=None if fqns is None else tuple(_titan_part_layers(fqns, where)),
    )


def _titan_part_layers(fqns: Any, where: str) -> list[int]:
    """The transformer layers (``layers.N``) of each model part of ``module_fqns_per_model_part``."""
    if not isinstance(fqns, list) or not all(isinstance(part, list) for part in fqns):
        raise _refuse(
            where, "parallelism.module_fqns_per_model_part", fqns, "a list of lists of module names"
        )
    return [
        sum(1 for module in part if str(module).startswith("layers.") and str(module)[7:].isdigit())
        for part in fqns
    ]


def _whole(value: Any, key: str, where: str, least: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise _refuse(where, key, value, f"a whole number, {least} or more")
    return value


def _torchtitan(job: dict[str, Any], where: str) -> LaunchConfig:
    original = _flatten(job)
    flat, spelled = _titan_renamed(original, where)
    get = flat.get

    def name(key: str) -> str:
        return spelled.get(key, key)

    values: dict[str, Any] = {"framework": "fsdp2", "model_impl": "torchtitan"}
    notes: list[str] = []
    if spelled:
        notes.append(
            "torchtitan's older layout (config_manager.py before commit 785c34c) read as v0.2.2's: "
            + ", ".join(f"{old} → {new}" for new, old in spelled.items())
        )
    model = (get("model.name"), str(get("model.flavor")))
    if model in _TITAN_MODELS:
        values["model"] = _TITAN_MODELS[model]
    elif get("model.name") is not None:
        notes.append(f"model {model[0]} {model[1]} has no preset: give --model")
    degrees: dict[str, int] = {}
    for key, option in (
        ("tensor_parallel_degree", "tp"),
        ("context_parallel_degree", "cp"),
        ("pipeline_parallel_degree", "pp"),
        ("expert_parallel_degree", "ep"),
    ):
        degree = get(f"parallelism.{key}")
        if degree is None:
            degrees[option] = 1
            continue
        if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
            raise _refuse(where, name(f"parallelism.{key}"), degree, "a whole number of ranks, 1 or more")
        degrees[option] = degree
        values[option] = str(degree)
    tp, cp, pp, ep = degrees["tp"], degrees["cp"], degrees["pp"], degrees["ep"]
    if ep > 1:
        expert_tp = get("parallelism.expert_tensor_parallel_degree", 1)
        if expert_tp != tp:
            raise _refuse(
                where, "parallelism.expert_tensor_parallel_degree", expert_tp,
                f"{tp}, the tensor-parallel degree (EP groups carved from dp_shard × cp, t apart)",
            )  # fmt: skip
    shard = get("parallelism.data_parallel_shard_degree")
    replicate = get("parallelism.data_parallel_replicate_degree") or 1
    reshard = str(get("parallelism.fsdp_reshard_after_forward") or "default").lower()
    if reshard not in ("default", "always", "never"):
        raise _refuse(
            where, name("parallelism.fsdp_reshard_after_forward"), reshard, "default, always or never"
        )
    if replicate > 1:
        if shard in (None, -1):
            raise _refuse(
                where, name("parallelism.data_parallel_shard_degree"), shard, "a degree with replicate > 1"
            )
        if tp * cp * pp * ep > 1:
            raise _refuse(
                where, name("parallelism.data_parallel_replicate_degree"), replicate,
                "1 with tensor, context, pipeline or expert parallelism (HSDP is modelled on data-parallel "
                "meshes)",
            )  # fmt: skip
        values["strategies"] = "hybrid_shard"
        values["gpus_per_node"] = str(shard)
        values["gpus"] = str(shard * replicate)
        notes.append(
            f"HSDP {replicate} × {shard}: the shard group is taken as the node (--gpus-per-node {shard})"
        )
    else:
        # "default" reshards after forward without a pipeline, not with one (v0.2.2
        # models/llama3/infra/parallelize.py apply_fsdp; 9dec370 parallelisms/parallelize_llama.py)
        keeps = reshard == "never" or (reshard == "default" and pp > 1)
        values["strategies"] = "shard_grad_op" if keeps else "zero3"
        if shard not in (None, -1):
            values["gpus"] = str(shard * tp * cp * pp)
    batch = get("training.local_batch_size")
    if batch is not None:
        values["micro_batch"] = str(batch)
    stages = _titan_pipeline(get, name, where, pp, values) if pp > 1 else None
    if get("training.seq_len") is not None:
        values["seq_len"] = str(get("training.seq_len"))
    param = get("training.mixed_precision_param")
    if param is not None:
        if param not in _TITAN_DTYPES:
            raise _refuse(where, "training.mixed_precision_param", param, "bfloat16 or float32")
        values["precision"] = "bf16-mixed" if param == "bfloat16" else "fp32"
    reduce = get("training.mixed_precision_reduce", _TITAN_REDUCE_DEFAULT)
    if reduce not in _TITAN_DTYPES:
        raise _refuse(where, "training.mixed_precision_reduce", reduce, "bfloat16 or float32")
    values["reduce_dtype"] = _TITAN_DTYPES[reduce]
    mode = get("activation_checkpoint.mode")
    if mode is not None:
        if mode not in _TITAN_AC_MODES:
            raise _refuse(where, "activation_checkpoint.mode", mode, "none, full or selective")
        option = str(get("activation_checkpoint.selective_ac_option", _TITAN_SAC_DEFAULT))
        values.update({"recompute": mode} if mode != "selective" else _titan_selective(option, where))
    optimizer = get("optimizer.name")
    if optimizer is not None:
        if str(optimizer).lower() not in ("adam", "adamw"):
            raise _refuse(where, "optimizer.name", optimizer, "Adam or AdamW")
        values["optimizer"] = str(optimizer).lower()
    unmodelled = sorted(k for k in original if k not in _TITAN_READ and k not in _TITAN_RENAMED)
    return LaunchConfig(values=values, notes=tuple(notes), unmodelled=tuple(unmodelled), stages=stages)


# ------------------------------------------------------------------------------------------- accelerate
_FSDP1_STRATEGIES = {
    "FULL_SHARD": "zero3", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "ddp",
    "HYBRID_SHARD": "hybrid_shard", "1": "zero3", "2": "shard_grad_op", "3": "ddp", "4": "hybrid_shard",
}  # fmt: skip
_ACCELERATE_READ = {
    "distributed_type", "mixed_precision", "num_processes", "num_machines", "fsdp_config.fsdp_version",
    "fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_reshard_after_forward",
    "fsdp_config.fsdp_activation_checkpointing", "fsdp_config.fsdp_offload_params",
    "deepspeed_config.zero_stage", "deepspeed_config.offload_optimizer_device",
    "deepspeed_config.offload_param_device", "deepspeed_config.gradient_accumulation_steps",
    "deepspeed_config.zero3_init_flag",
}  # fmt: skip


def _accelerate(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(config)
    get = flat.get
    values: dict[str, Any] = {}
    notes: list[str] = []
    kind = str(get("distributed_type") or "").upper()
    if kind == "FSDP":
        version = int(get("fsdp_config.fsdp_version") or 1)
        values["framework"] = "fsdp2" if version == 2 else "fsdp"
        if version == 2:
            reshard = get("fsdp_config.fsdp_reshard_after_forward")
            values["strategies"] = "shard_grad_op" if reshard is False else "zero3"
        else:
            strategy = str(get("fsdp_config.fsdp_sharding_strategy") or "FULL_SHARD").upper()
            if strategy not in _FSDP1_STRATEGIES:
                raise _refuse(
                    where, "fsdp_config.fsdp_sharding_strategy", strategy, ", ".join(_FSDP1_STRATEGIES)
                )
            values["strategies"] = _FSDP1_STRATEGIES[strategy]
        if get("fsdp_config.fsdp_activation_checkpointing"):
            values["recompute"] = "full"
        if get("fsdp_config.fsdp_offload_params"):
            values["offload_params"] = "cpu"
    elif kind == "DEEPSPEED":
        values["framework"] = "deepspeed"
        _zero(values, where, get, "deepspeed_config.zero_stage")
        _offload(values, where, get, "deepspeed_config.offload_optimizer_device", "offload_optimizer")
        _offload(values, where, get, "deepspeed_config.offload_param_device", "offload_params")
        if get("deepspeed_config.gradient_accumulation_steps") is not None:
            values["grad_accum"] = str(get("deepspeed_config.gradient_accumulation_steps"))
        if get("deepspeed_config.zero3_init_flag") is not None:  # deepspeed.zero.Init, or built on the host
            values["init"] = "meta" if get("deepspeed_config.zero3_init_flag") else "cpu"
    elif kind == "MULTI_GPU":
        values["framework"] = "ddp"
        values["strategies"] = "ddp"
    elif kind:
        raise _refuse(where, "distributed_type", kind, "FSDP, DEEPSPEED or MULTI_GPU")
    precision = get("mixed_precision")
    if precision is not None:
        mapped = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": "fp32"}.get(str(precision).lower())
        if mapped is None:
            raise _refuse(where, "mixed_precision", precision, "bf16, fp16 or no")
        values["precision"] = mapped
    processes = get("num_processes")
    if processes is not None:
        values["gpus"] = str(processes)
        machines = get("num_machines") or 1
        if processes % machines:
            raise _refuse(where, "num_processes", processes, f"a multiple of num_machines {machines}")
        values["gpus_per_node"] = str(processes // machines)
    unmodelled = sorted(k for k in flat if k not in _ACCELERATE_READ)
    return LaunchConfig(values=values, notes=tuple(notes), unmodelled=tuple(unmodelled))


_STAGE_OPTIONS = frozenset({"pp", "vpp", "pp_first_stage_layers", "pp_last_stage_layers", "pp_stage_layers"})
"""The options a file's stage split sets; one of them given on the command line, the split is the flags'."""


def _num_layers(model: Any) -> int | None:
    """The layers of the model named (a preset, a file, an architecture, a config dict), or None without one
    or without its architecture (the request's parser refuses a pipeline then)."""
    if model is None:
        return None
    from zerocalc.request.model_spec import model_spec as _model

    architecture = _model(None, model).architecture
    return None if architecture is None else architecture.num_layers


def read_launch_configs(
    values: dict[str, Any], given: frozenset[str], accepted: frozenset[str]
) -> tuple[dict[str, Any], list[str]]:
    """``values`` with what each named launch configuration (``values[format]``: a path) sets, for every
    option in ``accepted`` that was not ``given`` explicitly (flags override the files); and the notes to
    print (what each file set is echoed in the JSON's ``options``; what it has that zerocalc does not model
    is listed). Files are read in :class:`LaunchFormat`'s order; a later one overrides an earlier one."""
    from pathlib import Path

    from zerocalc.base.errors import shown, why_not

    merged = dict(values)
    notes: list[str] = []
    for kind in LaunchFormat:
        path = values.get(kind.value)
        if path is None:
            continue
        where = f"{{{kind.value}}} {shown(path)}"
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8-sig")
        except (OSError, ValueError) as exc:
            raise InputError(f"{where} cannot be read ({why_not(exc)}); accepted: a readable file") from exc
        config = read_launch_config(kind, text, where)
        for name, value in config.values.items():
            if name in accepted and name not in given:
                merged[name] = value
        if config.stages is not None and not given & _STAGE_OPTIONS:
            layers = _num_layers(merged.get("model"))
            if layers is not None:
                merged.update({k: v for k, v in config.stages.options(layers).items() if k in accepted})
        notes += config.note_lines(f"{kind.value} {Path(path).name}")
    return merged, notes
