"""A request's single values parsed from text: the bounds each is checked against, enum members by name
(case-insensitive, with their aliases), DeepSpeed bucket sizes, ZeRO++ features, strategy names and the
compute comparison's token count and TFLOP/s. Each refusal is one :class:`~zerocalc.base.errors.InputError`
line naming its concept (``{name}``)."""

from __future__ import annotations

from zerocalc.base.errors import InputError, shown
from zerocalc.base.units import (
    BINARY_SUFFIXES,
    MAX_COUNT,
    parse_count,
    parse_fraction,
)
from zerocalc.network.schedule import ZeroPP
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, Strategy, StrategyName, find_strategy
from zerocalc.request.options import Command, option

# ------------------------------------------------------------------------------------------------ bounds
MAX_GPUS = 2**20
"""The largest world accepted: 1,048,576 GPUs."""
MAX_GPUS_PER_NODE = 1024
MAX_GRAD_ACCUM = 1_000_000
MAX_SEQ_LEN = 2**26
"""67,108,864 tokens per sequence."""
MAX_MICRO_BATCH = 2**20
MAX_CHECKPOINT_EVERY = 2**20
MAX_PREFETCH = 1024
MAX_TFLOPS = 1e6
"""1 EFLOP/s per GPU: above any accelerator."""

DEFAULT_SEQ_LEN = 2048
"""s without ``seq_len`` (:func:`default_seq_len`: a model's learned positions where fewer)."""
DEFAULT_MICRO_BATCH: int = option(Command.MEMORY, "micro_batch").default
DEFAULT_PREFETCH: int = option(Command.MEMORY, "prefetch").default
DDP_BUCKET_BYTES = 25 * 2**20
"""torch.nn.parallel.DistributedDataParallel's bucket_cap_mb default, 25 MiB (``_DEFAULT_BUCKET_CAP_MB``)."""
DDP_FIRST_BUCKET_BYTES = 2**20
"""``dist._DEFAULT_FIRST_BUCKET_BYTES``: DDP's first bucket when bucket_cap_mb is left at its default
(``_BucketCapacityConfig.create``); an explicit bucket_cap_mb sets both."""
DEFAULT_DEEPSPEED_BUCKET_ELEMENTS = int(float(option(Command.MEMORY, "reduce_bucket").default))
"""DeepSpeed ZeRO config defaults: reduce_bucket_size = allgather_bucket_size = 5e8 elements."""


def choice(
    text: object, what: str, enum: type, replace: dict[str, str] | None = None, aliases: dict | None = None
):
    """An enum member by its value, case-insensitive (``_`` read as ``-`` where ``replace`` says), or by
    one of its ``aliases`` (keys lower-case, without ``-`` and ``_``)."""
    key = str(text).strip().lower()
    for old, new in (replace or {}).items():
        key = key.replace(old, new)
    for member in enum:
        if key == member.value:
            return member
    alias = (aliases or {}).get(key.replace("-", "").replace("_", ""))
    if alias is not None:
        return alias
    accepted = ", ".join(m.value for m in enum)
    raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")


_OPTIMIZER_ALIASES = {
    "adam8bit": OptimizerName.ADAM_8BIT,
    "adamw-8bit": OptimizerName.ADAM_8BIT,
    "sgd-momentum": OptimizerName.SGD,
}


def optimizer_named(text: str) -> OptimizerName:
    key = str(text).strip().lower().replace("_", "-")
    if key in _OPTIMIZER_ALIASES:
        return _OPTIMIZER_ALIASES[key]
    return choice(key, "{optimizer}", OptimizerName)


def offload_target(text: str | None, what: str) -> OffloadTarget:
    return OffloadTarget.NONE if text is None else choice(text, what, OffloadTarget)


def bucket_elements(text: int | str, what: str) -> int:
    """A DeepSpeed bucket in elements; 0 turns the bucket off."""
    if text in (0, "0"):
        return 0
    return parse_count(text, what, "a number of elements such as 5e8 or 500M, or 0", MAX_COUNT)


def zeropp_features(text: str | list[str] | tuple[str, ...] | None) -> tuple[ZeroPP, ...]:
    """``all``, ``none`` or a comma list of ZeRO++ features, in :class:`ZeroPP` order."""
    if text is None:
        return ()
    if isinstance(text, (list, tuple)):
        text = ",".join(text)
    parts = [part.strip().lower() for part in text.split(",") if part.strip()]
    if parts == ["all"]:
        return tuple(ZeroPP)
    if parts == ["none"]:
        return ()
    accepted = "all, none, or a comma list of " + ", ".join(z.value for z in ZeroPP)
    if not parts or any(part not in {z.value for z in ZeroPP} for part in parts):
        raise InputError(f"{{zeropp}} {shown(text)} is not accepted; accepted: {accepted}")
    return tuple(z for z in ZeroPP if z.value in parts)


def compute_comparison(
    tokens_per_step: int | str | None, tflops: float | str | None
) -> tuple[int | None, float | None]:
    if (tokens_per_step is None) != (tflops is None):
        raise InputError("{tokens_per_step} and {tflops} go together; accepted: both or neither")
    if tokens_per_step is None:
        return None, None
    tokens = parse_count(
        tokens_per_step, "{tokens_per_step}", "a token count such as 4M (4,194,304) or 1e6", MAX_COUNT,
        BINARY_SUFFIXES,
    )  # fmt: skip
    flops = parse_fraction(
        tflops, "{tflops}", 1e-9, MAX_TFLOPS, "achieved TFLOP/s per GPU, e.g. 400 (at most 1,000,000)"
    )
    return tokens, flops


def _normalise(text: str) -> str:
    return text.strip().lower().replace("-", "_")


def strategy_named(text: str) -> Strategy:
    """A strategy by its name or one of its aliases (FSDP names, DeepSpeed stages)."""
    strategy = find_strategy(text)
    if strategy is not None:
        return strategy
    accepted = ", ".join(
        f"{s.name.value} ({', '.join(s.aliases[:3])})" if s.aliases else s.name.value
        for s in STRATEGIES.values()
    )
    raise InputError(f"{{strategies}} {shown(text)} is not known; accepted: all, {accepted}")


def strategy_names(text: str | list[str] | tuple[str, ...] | None) -> tuple[StrategyName, ...] | None:
    """``all`` or a comma list (or a list of names); None means the framework's default set."""
    if isinstance(text, (list, tuple)):
        text = ",".join(text)
    if text is None or _normalise(text) == "all":
        return None
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise InputError(
            f"{{strategies}} {shown(text)} names no strategy; accepted: all or a comma list of names"
        )
    if any(_normalise(part) == "all" for part in parts):
        raise InputError(
            f"{{strategies}} {shown(text)}: 'all' stands alone; accepted: all, or a comma list of names"
        )
    return tuple(dict.fromkeys(strategy_named(part).name for part in parts))
