"""Preset files: models, GPUs and scenarios as TOML data validated by pydantic (no code in presets).

Presets live in the repository's ``presets/`` folder, which is installed as ``zerocalc/_presets`` by a
non-editable install; ``ZEROCALC_PRESETS=/path`` overrides both. A broken file is reported with its path
and field; the others still load.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from zerocalc.base.errors import InputError, shown, why_not
from zerocalc.base.units import parse_bandwidth, parse_bytes
from zerocalc.model.architecture import Architecture

KINDS = ("models", "gpus", "scenarios")


PRESETS_ENV = "ZEROCALC_PRESETS"


def presets_root() -> Path:
    """The presets folder: $ZEROCALC_PRESETS, the repository's presets/, or the installed copy."""
    return _presets_root(os.environ.get(PRESETS_ENV))


@lru_cache(maxsize=8)
def _presets_root(env: str | None) -> Path:
    """Resolved once per value of the variable (``plan`` parses hundreds of requests)."""
    if env is not None:
        root = Path(env).expanduser()
        if not env.strip() or not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a folder"
            raise InputError(
                f"{PRESETS_ENV}={env!r} {what}; accepted: a folder with models/, gpus/, scenarios/ "
                f"(or unset {PRESETS_ENV} for the shipped presets)"
            )
        return root
    package = Path(__file__).resolve().parent.parent  # zerocalc/
    for candidate in (package.parent / "presets", package / "_presets"):
        if (candidate / "models").is_dir():
            return candidate
    raise InputError(
        "no presets folder found; set ZEROCALC_PRESETS to a folder with models/, gpus/, scenarios/"
    )


def installed_presets(root: Path) -> bool:
    """Whether ``root`` is the copy of the presets installed inside the package (site-packages)."""
    return root.resolve() == (Path(__file__).resolve().parent / "_presets").resolve()


class ModelPreset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str
    source: str
    published_params: int | None = Field(default=None, gt=0)
    published_tolerance: float = Field(default=0.0, ge=0, description="relative; 0 means exact")
    architecture: dict[str, Any]


class GpuSpec(BaseModel):
    """A GPU kind: its memory as nvidia-smi and as PyTorch see it, its compute, its links, and what the CUDA
    runtime takes outside the caching allocator; each figure with its source in the preset's comments."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    title: str
    memory: str = Field(description="total memory as nvidia-smi reports it, e.g. 81559MiB")
    usable_memory: str = Field(description="what PyTorch sees: torch.cuda.mem_get_info()'s total")
    bf16_dense_tflops: float = Field(gt=0)
    intra_node_busbw: str
    inter_node_busbw: str
    context: str = Field(
        description="outside the caching allocator at world size 1: CUDA context, NCCL, the kernels and "
        "handles loaded by the first steps"
    )
    nccl_communicator: str = Field(description="each NCCL communicator of more than one rank adds this")
    cublas_workspace: str = Field(description="one cuBLAS workspace per (handle, stream)")
    source: str
    runtime_source: str = Field(description="where usable_memory, context and the workspaces come from")

    @field_validator("memory", "usable_memory", "context", "nccl_communicator", "cublas_workspace")
    @classmethod
    def _bytes(cls, value: str) -> str:
        parse_bytes(value, "memory")
        return value

    @property
    def usable_bytes(self) -> int:
        return parse_bytes(self.usable_memory)

    @property
    def context_bytes(self) -> int:
        return parse_bytes(self.context)

    @property
    def nccl_communicator_bytes(self) -> int:
        return parse_bytes(self.nccl_communicator)

    @property
    def cublas_workspace_bytes(self) -> int:
        return parse_bytes(self.cublas_workspace)

    @field_validator("intra_node_busbw", "inter_node_busbw")
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_bandwidth(value, "bus bandwidth")
        return value

    @property
    def memory_bytes(self) -> int:
        return parse_bytes(self.memory)

    @property
    def intra_node_Bps(self) -> float:
        return parse_bandwidth(self.intra_node_busbw)

    @property
    def inter_node_Bps(self) -> float:
        return parse_bandwidth(self.inter_node_busbw)


T = TypeVar("T", bound=BaseModel)


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "file"
    return f"{where}: {first['msg']}"


def load_toml(path: Path, model: type[T]) -> T:
    """Read one preset file; any problem is an InputError naming the file and the field."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({why_not(exc)}); accepted: a readable TOML file") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); accepted: a TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path}: {_describe(exc)}") from exc


def preset_names(kind: str, root: Path | None = None) -> list[str]:
    """The presets of one kind: the ``*.toml`` files of its folder (anything else there is ignored)."""
    folder = (root or presets_root()) / kind
    return sorted(p.stem for p in folder.glob("*.toml") if p.is_file())


_CONCEPT = {"models": "{model}", "gpus": "{gpu}", "scenarios": "scenario"}


def preset_path(kind: str, name: str, root: Path | None = None) -> Path:
    """The file of a named preset; an unknown name suggests the closest ones."""
    key = name.strip().lower()
    path = (root or presets_root()) / kind / f"{key}.toml"
    if key and "/" not in key and path.is_file():
        return path
    names = preset_names(kind, root)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    accepted = ", ".join(names) or f"none: {(root or presets_root()) / kind} holds no *.toml preset"
    raise InputError(f"{_CONCEPT[kind]} {shown(name)} is not a preset; {hint}accepted: {accepted}")


def model_architecture(preset: ModelPreset, name: str, path: Path) -> Architecture:
    try:
        return Architecture(name=name, **preset.architecture)
    except ValidationError as exc:
        raise InputError(f"{path}: architecture.{_describe(exc)}") from exc


def _file_key(path: Path) -> tuple[str, int, int]:
    """Identifies a file's content for the cache: its absolute path, modification time and size (two
    spellings of one file are cached twice, harmlessly)."""
    try:
        stat = path.stat()
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return (str(path), -1, -1)  # the loader reports the problem
    return (str(path.absolute()), stat.st_mtime_ns, stat.st_size)


def load_model(name_or_path: str) -> tuple[Architecture, ModelPreset | None]:
    """A preset name, a Hugging Face config.json path, a folder holding one or ``-`` (standard input) → its
    architecture (and preset, if any).

    Each file is read and validated once per process (cached by path, modification time and size).
    """
    if name_or_path.strip() in STDIN_NAMES:
        return _load_hf_stdin(), None
    candidate = Path(name_or_path).expanduser()
    folder = bool(name_or_path.strip()) and candidate.is_dir()
    if folder:
        candidate = candidate / "config.json"  # a checkpoint's folder, as from_pretrained takes it
    if folder or name_or_path.endswith(".json") or candidate.is_file():
        return _load_hf_config(_file_key(candidate), candidate)
    path = preset_path("models", name_or_path)
    return _load_model_preset(_file_key(path), path)


STDIN_NAMES = ("-", "/dev/stdin")
"""``--model -``: the config.json is read from standard input (once per process)."""


@lru_cache(maxsize=1)
def _load_hf_stdin() -> Architecture:
    import sys

    from zerocalc.model.hf_config import architecture_from_hf_text

    if sys.stdin is not None and sys.stdin.isatty():
        raise InputError(
            "{model} - reads config.json from standard input, which is a terminal; accepted: "
            "`{model} - < config.json`, `cat config.json | zerocalc ... {model} -`, or a path"
        )
    data = sys.stdin.buffer.read() if sys.stdin is not None else b""
    if not data.strip():
        raise InputError(
            "{model} - reads config.json from standard input, which is empty; accepted: "
            "`{model} - < config.json`, or a path"
        )
    return architecture_from_hf_text(data, "{model} '-' (standard input)", "stdin")


def model_notes(name_or_path: str) -> tuple[str, ...]:
    """What reading the model said about it (a config.json's notes; none for a preset or standard input)."""
    if name_or_path.strip() in STDIN_NAMES:
        return ()
    candidate = Path(name_or_path).expanduser()
    if bool(name_or_path.strip()) and candidate.is_dir():
        candidate = candidate / "config.json"
    if candidate.name == "config.json" or name_or_path.endswith(".json") or candidate.is_file():
        return _read_hf_config(_file_key(candidate), candidate)[1]
    return ()


def _load_hf_config(key: tuple[str, int, int], path: Path) -> tuple[Architecture, ModelPreset | None]:
    return _read_hf_config(key, path)[0], None


@lru_cache(maxsize=256)
def _read_hf_config(key: tuple[str, int, int], path: Path) -> tuple[Architecture, tuple[str, ...]]:
    from zerocalc.model.hf_config import read_hf_config

    return read_hf_config(path)


@lru_cache(maxsize=256)
def _load_model_preset(key: tuple[str, int, int], path: Path) -> tuple[Architecture, ModelPreset | None]:
    preset = load_toml(path, ModelPreset)
    return model_architecture(preset, path.stem, path), preset


def load_gpu(name: str) -> GpuSpec:
    """A GPU preset by name (read once per process, like the models)."""
    path = preset_path("gpus", name)
    return _load_gpu(_file_key(path), path)


@lru_cache(maxsize=64)
def _load_gpu(key: tuple[str, int, int], path: Path) -> GpuSpec:
    spec = load_toml(path, GpuSpec)
    return spec.model_copy(update={"name": path.stem})
