"""Preset files: models, GPUs and scenarios as TOML data validated by pydantic (no code in presets).

Presets live in the repository's ``presets/`` folder, which is installed as ``zerocalc/_presets`` by a
non-editable install; ``ZEROCALC_PRESETS=/path`` overrides both. A broken file is reported with its path
and field; the others still load.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from zerocalc.base.errors import InputError, literal, shown, why_not
from zerocalc.base.paths import user_path
from zerocalc.base.units import parse_bandwidth, parse_bytes
from zerocalc.model.architecture import Architecture
from zerocalc.request.runtime_names import RuntimeNames

KINDS = ("models", "gpus", "scenarios")


PRESETS_ENV = "ZEROCALC_PRESETS"


def presets_root() -> Path:
    """The presets folder: $ZEROCALC_PRESETS, the repository's presets/, or the installed copy."""
    return _presets_root(os.environ.get(PRESETS_ENV))


@lru_cache(maxsize=8)
def _presets_root(env: str | None) -> Path:
    """Resolved once per value of the variable (``plan`` parses hundreds of requests)."""
    if env is not None:
        root = user_path(env)
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
    """A model file: a preset of ``presets/models/`` or a user's file of the same schema (``--model
    path.toml``)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$",
        description="the model's name in outputs; the file's stem if unset",
    )
    title: str
    source: str = Field(default="", description="where the architecture comes from (every preset cites one)")
    published_params: int | None = Field(default=None, gt=0)
    published_tolerance: float = Field(default=0.0, ge=0, description="relative; 0 means exact")
    architecture: dict[str, Any]


class GpuSpec(BaseModel):
    """A GPU kind: its memory as the vendor's tool (nvidia-smi, rocm-smi) and as PyTorch see it, its compute,
    its links, and what the runtime takes outside the caching allocator; each figure with its source in the
    preset's comments. A file of this schema anywhere else is read by ``--gpu path/to/gpu.toml``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        default="",
        pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._+-]*$",
        description="the name in outputs: a preset's is its file's stem; a GPU file's, this or its stem",
    )
    title: str
    memory: str = Field(description="total memory as the vendor's tool reports it (names.smi), e.g. 81559MiB")
    usable_memory: str = Field(
        description="what PyTorch sees: torch.cuda.mem_get_info()'s total, the total capacity its "
        "out-of-memory messages report"
    )
    bf16_dense_tflops: float = Field(
        gt=0,
        description="dense 16-bit tensor-core TFLOP/s: bf16's; where the GPU has no bf16 (bf16 = false), "
        "fp16's, the rate fp16-mixed runs at",
    )
    bf16: bool = Field(
        default=True, description="whether the tensor cores take bf16 (false: bf16 recipes are refused)"
    )
    compute_capability: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]?\.[0-9]$",
        description="NVIDIA's CUDA compute capability (9.0 for Hopper, 10.0 for Blackwell), which FP8 "
        "recipes check (torchao: 8.9; MXFP8: 10.0); none for other vendors' GPUs",
    )
    sm_count: int | None = Field(
        default=None,
        gt=0,
        description="streaming multiprocessors (the vendor's datasheet or whitepaper): what a kernel "
        "beside a GEMM takes its SMs from (Transformer Engine's userbuffers, docs/model.md Step time)",
    )
    intra_node_busbw: str
    inter_node_busbw: str
    context: str = Field(
        description="outside the caching allocator at world size 1: the runtime's context, the collective "
        "library, the kernels and handles loaded by the first steps"
    )
    context_measured: bool = Field(
        default=False, description="context was measured on this GPU (else estimated or assumed)"
    )
    nccl_communicator: str = Field(description="each communicator of more than one rank adds this")
    cublas_workspace: str = Field(description="one BLAS workspace per (handle, stream)")
    names: RuntimeNames = RuntimeNames()
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


def _fields_at(schema: type[BaseModel], loc: tuple[int | str, ...]) -> dict[str, Any]:
    """The fields of the model that holds ``loc`` (``latent_attention.q_lora_rank``: LatentAttention's)."""
    for part in loc[:-1]:
        field = schema.model_fields.get(str(part))
        kinds = (get_args(field.annotation) or (field.annotation,)) if field else ()
        models = [t for t in kinds if isinstance(t, type) and issubclass(t, BaseModel)]
        if not models:
            return {}
        schema = models[0]
    return dict(schema.model_fields)


def _describe(error: ValidationError, schema: type[BaseModel], prefix: str = "", hidden: str = "") -> str:
    """The first problem of ``error`` in one line: the field (``prefix`` + its path) and what is accepted;
    ``hidden`` is a field the file may not set (it is set by the loader)."""
    problems = error.errors()
    first = next((e for e in problems if e["type"] == "extra_forbidden"), problems[0])  # a misspelt key
    loc = tuple(first["loc"])
    where = prefix + ".".join(str(p) for p in loc) if loc else prefix.rstrip(".") or "file"
    fields = {k: v for k, v in _fields_at(schema, loc).items() if k != hidden} if loc else {}
    if first["type"] == "extra_forbidden" and fields:
        close = difflib.get_close_matches(str(loc[-1]), list(fields), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{literal(where)} is not a field; {hint}accepted: {', '.join(fields)}"
    if first["type"] == "missing" and fields:
        required = ", ".join(k for k, f in fields.items() if f.is_required())
        return f"{literal(where)} is missing; accepted: a file that sets {required}"
    given = f" = {first['input']!r}" if loc else ""
    return literal(f"{where}{given}: {first['msg'].removeprefix('Value error, ')}")


def _toml_data(path: Path, where: str, accepted: str) -> Any:
    """The parsed TOML of ``path``; ``where`` (a message template) names it in errors."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte
        if isinstance(exc, UnicodeDecodeError):
            raise InputError(f"{where}: not UTF-8 text (byte {exc.start}); accepted: {accepted}") from exc
        if isinstance(exc, tomllib.TOMLDecodeError):
            raise InputError(f"{where}: not valid TOML ({literal(str(exc))}); accepted: {accepted}") from exc
        raise InputError(f"{where}: cannot be read ({literal(why_not(exc))}); accepted: {accepted}") from exc


def _validated(data: Any, model: type[T], where: str) -> T:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{where}: {_describe(exc, model)}") from exc


def load_toml(path: Path, model: type[T]) -> T:
    """Read one preset file; any problem is an InputError naming the file and the field."""
    where = literal(str(path))
    return _validated(_toml_data(path, where, "a readable TOML file"), model, where)


def preset_names(kind: str, root: Path | None = None) -> list[str]:
    """The presets of one kind: the ``*.toml`` files of its folder (anything else there is ignored)."""
    folder = (root or presets_root()) / kind
    return sorted(p.stem for p in folder.glob("*.toml") if p.is_file())


_CONCEPT = {"models": "{model}", "gpus": "{gpu}", "scenarios": "scenario"}

GPU_FILE_ACCEPTED = (
    "a GPU TOML file in the schema of the GPU presets (`zerocalc presets show h100-80gb --toml` is one to "
    "start from)"
)
_FILE_ACCEPTED = {"gpus": GPU_FILE_ACCEPTED}
"""What a kind takes besides its presets' names (a model's are listed where ``--model`` is read)."""


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
    if kind in _FILE_ACCEPTED:
        accepted += f", or {_FILE_ACCEPTED[kind]}"
    raise InputError(f"{_CONCEPT[kind]} {shown(name)} is not a preset; {hint}accepted: {accepted}")


def model_architecture(preset: ModelPreset, name: str, where: Path | str) -> Architecture:
    """The architecture of a model file, named ``name`` (``where``, a path or a message template, names the
    file in errors)."""
    if isinstance(where, Path):
        where = literal(str(where))
    if "name" in preset.architecture:
        raise InputError(f"{where}: architecture.name is not a field; accepted: name at the top of the file")
    try:
        return Architecture.model_validate({**preset.architecture, "name": name})
    except ValidationError as exc:
        raise InputError(f"{where}: {_describe(exc, Architecture, 'architecture.', hidden='name')}") from exc


def _file_key(path: Path) -> tuple[str, int, int]:
    """Identifies a file's content for the cache: its absolute path, modification time and size (two
    spellings of one file are cached twice, harmlessly)."""
    try:
        stat = path.stat()
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return (str(path), -1, -1)  # the loader reports the problem
    return (str(path.absolute()), stat.st_mtime_ns, stat.st_size)


def load_model(name_or_path: str) -> tuple[Architecture, ModelPreset | None]:
    """A preset name, a model TOML file (the presets' schema), a Hugging Face config.json path, a folder
    holding one or ``-`` (standard input) → its architecture (and its model file, if any).

    Each file is read and validated once per process (cached by path, modification time and size).
    """
    if name_or_path.strip() in STDIN_NAMES:
        return _load_hf_stdin(), None
    read_as = model_file(name_or_path)
    if read_as is not None:
        kind, path = read_as
        loader = _load_model_file if kind == "toml" else _load_hf_config
        architecture, preset = loader(_file_key(path), path)
        if kind == "hf":  # named by its repository, not by its snapshot's commit folder
            architecture = architecture.model_copy(update={"name": name_or_path.strip()})
        return architecture, preset
    path = preset_path("models", name_or_path)
    return _load_model_preset(_file_key(path), path)


MODEL_FILE_SUFFIX = ".toml"


def model_file(name_or_path: str) -> tuple[str, Path] | None:
    """What ``--model`` names: ``("toml", path)`` a model file in the presets' schema (a name ending in
    .toml, or an existing file that parses as TOML), ``("json", path)`` a config.json (a name ending in
    .json, a folder holding one, any other existing file), ``("hf", path)`` a Hugging Face model id
    (``org/name``) and the config.json of its main revision in the local cache (:func:`hf_cached_config`),
    None a preset name."""
    candidate = user_path(name_or_path)
    if name_or_path.strip() and candidate.is_dir():
        return "json", candidate / "config.json"  # a checkpoint's folder, as from_pretrained takes it
    if name_or_path.endswith(".json"):
        return "json", candidate
    if name_or_path.lower().endswith(MODEL_FILE_SUFFIX):
        return "toml", candidate
    if candidate.is_file():
        return ("toml" if _holds_toml(_file_key(candidate), candidate) else "json"), candidate
    if HF_REPO_ID.match(name_or_path.strip()):
        return "hf", hf_cached_config(name_or_path.strip())
    return None


HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""A Hugging Face model id, ``org/name`` (huggingface_hub's ``REPO_ID_REGEX``, less its length bound; a
preset name never holds a ``/``)."""

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hf_hub_cache() -> Path:
    """The Hugging Face cache folder as huggingface_hub 1.x resolves it (``huggingface_hub/constants.py``):
    ``$HF_HUB_CACHE``, else the older ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, ``$HF_HOME``
    defaulting to ``$XDG_CACHE_HOME/huggingface`` (``~/.cache/huggingface``)."""
    env = os.environ
    home = env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    home = os.path.expandvars(os.path.expanduser(home))
    hub = env.get("HF_HUB_CACHE", env.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def hf_cached_config(repo_id: str) -> Path:
    """The config.json of ``repo_id``'s main revision in the local Hugging Face cache, read offline (never a
    network call), in the layout huggingface_hub writes (its cache-system guide; ``file_download.py``
    ``repo_folder_name``): ``models--{org}--{name}/refs/main`` holding the commit and
    ``snapshots/<commit>/config.json`` (a link into ``blobs/``). Not there: one line saying how to pass a
    config.json."""
    cache = hf_hub_cache()
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    how = (
        f"accepted: a preset name, a config.json path or the folder holding it, or the model in the "
        f"cache (`hf download {repo_id} config.json` fetches it; HF_HUB_CACHE or HF_HOME say where the "
        "cache is)"
    )
    ref = folder / "refs" / "main"
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        raise InputError(
            f"{{model}} {shown(repo_id)} is not a preset, and the Hugging Face cache "
            f"{shown(str(cache))} holds no {folder.name}/refs/main; {how}"
        ) from None
    config = folder / "snapshots" / commit / "config.json"
    if not _COMMIT.match(commit) or not config.is_file():
        raise InputError(
            f"{{model}} {shown(repo_id)}: the Hugging Face cache holds no config.json for its main revision "
            f"({shown(str(config))}); {how}"
        )
    return config


@lru_cache(maxsize=256)
def _holds_toml(key: tuple[str, int, int], path: Path) -> bool:
    """Whether a file named neither .json nor .toml holds TOML (a JSON object never parses as TOML)."""
    try:
        return bool(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):  # unreadable, not UTF-8 or not TOML: read as a config.json
        return False


TORCHTITAN_JOB_TABLES = frozenset({"job", "model", "training", "parallelism"})
"""Tables of a torchtitan job TOML (torchtitan/config/job_config.py), read by ``--torchtitan``."""

MODEL_FILE_ACCEPTED = (
    "a model TOML file in the schema of the model presets (`zerocalc presets show llama-3-8b --toml`)"
)


@lru_cache(maxsize=256)
def _load_model_file(key: tuple[str, int, int], path: Path) -> tuple[Architecture, ModelPreset | None]:
    """A user's model file: named by its ``name`` (else its stem), titled by its ``title``."""
    where = f"{{model}} {shown(str(path))}"
    accepted = MODEL_FILE_ACCEPTED
    if not path.is_file() and path.stem.lower() in preset_names("models"):
        accepted += f", or the preset name {shown(path.stem.lower())}"
    data = _toml_data(path, where, accepted)
    job_tables = sorted(TORCHTITAN_JOB_TABLES & data.keys()) if "architecture" not in data else []
    if job_tables:
        raise InputError(
            f"{where} is a torchtitan job TOML ({', '.join(f'[{t}]' for t in job_tables)}), not a model "
            f"file; accepted: {{torchtitan}} {shown(str(path))} for the job, or {accepted}"
        )
    preset = _validated(data, ModelPreset, where)
    return model_architecture(preset, preset.name or path.stem, where), preset


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
    """What reading the model said about it (a config.json's notes; none for a preset, a model TOML file
    or standard input)."""
    if name_or_path.strip() in STDIN_NAMES:
        return ()
    read_as = model_file(name_or_path)
    if read_as is None or read_as[0] == "toml":
        return ()
    return _read_hf_config(_file_key(read_as[1]), read_as[1])[1]


def model_quantization_config(name_or_path: str) -> dict[str, Any] | None:
    """The bitsandbytes ``quantization_config`` of the config.json ``--model`` names (None for a preset,
    a model TOML file, standard input, or a config.json without one)."""
    if name_or_path.strip() in STDIN_NAMES:
        return None
    read_as = model_file(name_or_path)
    if read_as is None or read_as[0] == "toml":
        return None
    return _read_quantization(_file_key(read_as[1]), read_as[1])


@lru_cache(maxsize=256)
def _read_quantization(key: tuple[str, int, int], path: Path) -> dict[str, Any] | None:
    from zerocalc.model.hf_config import read_hf_quantization_config

    return read_hf_quantization_config(path)


def _load_hf_config(key: tuple[str, int, int], path: Path) -> tuple[Architecture, ModelPreset | None]:
    return _read_hf_config(key, path)[0], None


@lru_cache(maxsize=256)
def _read_hf_config(key: tuple[str, int, int], path: Path) -> tuple[Architecture, tuple[str, ...]]:
    from zerocalc.model.hf_config import read_hf_config

    return read_hf_config(path)


@lru_cache(maxsize=256)
def _load_model_preset(key: tuple[str, int, int], path: Path) -> tuple[Architecture, ModelPreset | None]:
    preset = load_toml(path, ModelPreset)
    return model_architecture(preset, preset.name or path.stem, path), preset


def gpu_file(name: str) -> Path | None:
    """The file ``--gpu`` names (a name ending in .toml, or an existing file), None for a preset name."""
    candidate = user_path(name)
    if name.strip().lower().endswith(".toml") or (name.strip() and candidate.is_file()):
        return candidate
    return None


def load_gpu(name: str) -> GpuSpec:
    """A GPU preset by name, or a GPU file of the presets' schema (read once per process, like the
    models)."""
    path = gpu_file(name)
    if path is not None:
        return _load_gpu_file(_file_key(path), path)
    path = preset_path("gpus", name)
    return _load_gpu(_file_key(path), path)


@lru_cache(maxsize=64)
def _load_gpu(key: tuple[str, int, int], path: Path) -> GpuSpec:
    spec = load_toml(path, GpuSpec)
    return spec.model_copy(update={"name": path.stem})


@lru_cache(maxsize=64)
def _load_gpu_file(key: tuple[str, int, int], path: Path) -> GpuSpec:
    """A user's GPU file: named by its ``name`` (else its stem), which must not be a shipped preset's (the
    outputs, and the compute table a preset's name selects, would then describe another GPU)."""
    where = f"{{gpu}} {shown(str(path))}"
    spec = _validated(_toml_data(path, where, GPU_FILE_ACCEPTED), GpuSpec, where)
    name = spec.name or path.stem
    if name.lower() in preset_names("gpus"):
        raise InputError(
            f"{where} is named {shown(name)}, the name of a shipped GPU preset; accepted: another name "
            "(its `name` field, else the file's name), or the preset itself"
        )
    return spec.model_copy(update={"name": name})
