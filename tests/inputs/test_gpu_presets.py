"""GPU presets: memory as the devices report it, the vendor's runtime names, "measured" only for a
measurement; GPU files of the presets' schema (``--gpu FILE.toml``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.api import estimate_memory, estimate_peak
from zerocalc.cli import app
from zerocalc.request.presets import load_gpu, preset_names, preset_path

runner = CliRunner()
MIB, GIB = 2**20, 2**30


def _memory_output(gpu: str) -> str:
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--gpus", "8", "--gpu", gpu])
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())  # the rendered lines wrap at 80 columns


@pytest.mark.parametrize(
    ("gpu", "smi_mib", "pytorch_gib"),
    [
        ("b200-180gb", 183_359, 178.35),  # nvidia-smi "NVIDIA B200, 183359 MiB"; OOMs "178.35 GiB"
        ("a100-80gb", 81_920, 79.25),  # OOMs on A100 80GB: "79.25 GiB total capacity" (79.35 older)
        ("mi300x", 196_592, 191.98),  # rocm-smi 206,141,652,992 B; HIP OOMs "191.98 GiB"
        ("l40s", 46_068, 44.53),
        ("rtx-4090", 24_564, 23.64),
    ],
)
def test_gpu_memory_is_what_the_device_and_pytorch_report(gpu: str, smi_mib: int, pytorch_gib: float) -> None:
    spec = load_gpu(gpu)
    assert spec.memory_bytes == smi_mib * MIB
    assert round(spec.usable_bytes / GIB, 2) == pytorch_gib
    assert f"{pytorch_gib:.2f} GiB as PyTorch sees it" in _memory_output(gpu)


def test_every_gpu_preset_sources_its_figures_beside_them() -> None:
    """Each figure the device reports has its source in a comment beside it, and PyTorch never sees more
    than the vendor's tool reports."""
    for name in preset_names("gpus"):
        text = preset_path("gpus", name).read_text()
        for field in ("usable_memory", "context", "nccl_communicator", "cublas_workspace"):
            assert f"\n# {field}:" in text, f"{name}: {field} has no source beside it"
        spec = load_gpu(name)
        assert spec.usable_bytes <= spec.memory_bytes, name
        context_comment = text.split("\n# context:", 1)[1]
        assert spec.context_measured == context_comment.startswith(" measured"), name


ROCM_NAMES = ("in rocm-smi", "+ HIP context, kernels", "+ RCCL communicators", "hipBLASLt workspace",
              "= device (hipMemGetInfo)")  # fmt: skip
CUDA_NAMES = ("in nvidia-smi", "+ CUDA context, kernels", "+ NCCL communicators", "cuBLAS workspace",
              "= device (cudaMemGetInfo)")  # fmt: skip


@pytest.mark.parametrize("gpu", ["mi300x", "mi325x"])
def test_an_amd_gpu_is_described_in_rocm_terms(gpu: str) -> None:
    text = _memory_output(gpu)
    for rocm in ROCM_NAMES:
        assert rocm in text
    for cuda in ("nvidia-smi", "CUDA context", "NCCL", "cuBLAS", "cudaMemGetInfo"):
        assert cuda not in text


def test_an_nvidia_gpu_keeps_its_names() -> None:
    text = _memory_output("h100-80gb")
    for name in CUDA_NAMES:
        assert name in text


@pytest.mark.parametrize(
    ("gpu", "blas"), [("mi300x", "hipBLASLt"), ("mi325x", "hipBLASLt"), ("h100-80gb", "cuBLAS")]
)
def test_the_step_snapshot_names_the_workspaces_as_the_gpu_preset_does(
    gpu: str, blas: str, tmp_path: Path
) -> None:
    """The timeline's allocations (``--snapshot-out``'s frames) name the BLAS workspaces after the
    preset's ``names.blas``: two per step, the forward thread's and autograd's."""
    import pickle

    out = tmp_path / "step.pickle"
    args = ["memory", "--model", "llama-3-8b", "--gpus", "8", "--gpu", gpu, "--strategy", "zero3"]
    result = runner.invoke(app, [*args, "--snapshot-out", str(out)])
    assert result.exit_code == 0, result.output
    text = json.dumps(pickle.loads(out.read_bytes()), default=str)
    for thread in ("forward", "autograd"):
        assert f"{blas} workspace ({thread} thread)" in text
    other = "cuBLAS" if blas != "cuBLAS" else "hipBLASLt"
    assert other not in text


@pytest.mark.parametrize("gpu", ["a100-40gb", "rtx-4090", "l40s", "mi300x"])
def test_an_estimated_context_is_not_called_measured(gpu: str) -> None:
    assert not load_gpu(gpu).context_measured
    text = _memory_output(gpu)
    assert "measured figure" not in text
    assert f"the {gpu} preset's estimated figure" in text


@pytest.mark.parametrize("gpu", ["h100-80gb", "h200-141gb"])
def test_a_measured_context_is_called_measured(gpu: str) -> None:
    assert load_gpu(gpu).context_measured
    assert f"the {gpu} preset's measured figure" in _memory_output(gpu)


def test_the_presets_toml_is_the_schema_of_a_gpu_file() -> None:
    shown = runner.invoke(app, ["presets", "show", "mi300x", "--toml"])
    assert shown.exit_code == 0
    assert tomllib.loads(shown.stdout)["names"]["collectives"] == "RCCL"


# ------------------------------------------------------------------------------------- a GPU without a preset
def _gpu_file(tmp_path: Path, name: str, **fields: str) -> Path:
    """``presets show rtx-4090 --toml`` with ``fields`` replaced, written as ``tmp_path/name``."""
    shown = runner.invoke(app, ["presets", "show", "rtx-4090", "--toml"])
    assert shown.exit_code == 0
    lines = [
        f"{line.split(' = ')[0]} = {fields[line.split(' = ')[0]]!r}".replace("'", '"')
        if line.split(" = ")[0] in fields
        else line
        for line in shown.stdout.splitlines()
    ]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_gpu_file_of_the_presets_schema_is_a_gpu(tmp_path: Path) -> None:
    path = _gpu_file(tmp_path, "my-card.toml", title="My card", usable_memory="20GiB")
    estimate = estimate_memory(model="llama-3-8b", gpus=2, gpu=str(path))
    assert estimate.gpu is not None and (estimate.gpu.name, estimate.gpu.title) == ("my-card", "My card")
    assert estimate.request.gpu_memory_bytes == 20 * GIB
    assert estimate.request.context_bytes == load_gpu("rtx-4090").context_bytes
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--gpus", "2", "--gpu", str(path)])
    assert result.exit_code == 0 and "GPU My card: 20.00 GiB as PyTorch sees it" in result.stdout


@pytest.mark.parametrize(
    ("name", "fields", "fragment"),
    [
        ("h100-80gb.toml", {}, "is named 'h100-80gb', the name of a shipped GPU preset"),
        ("absent.toml", None, "cannot be read"),
        ("typo.toml", {"usable_memory": "20 gigs"}, "usable_memory = '20 gigs'"),
    ],
)
def test_a_bad_gpu_file_is_one_line(tmp_path: Path, name: str, fields: dict | None, fragment: str) -> None:
    path = tmp_path / name if fields is None else _gpu_file(tmp_path, name, **fields)
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "2", "--gpu", str(path)])
    assert result.exit_code == 2 and fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("zerocalc: error: --gpu")


def test_an_unknown_gpu_name_offers_a_gpu_file() -> None:
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "2", "--gpu", "rtx-9999"])
    assert result.exit_code == 2 and "or a GPU TOML file" in result.stderr and "--toml" in result.stderr


PLAN = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch", "256seq", "--seq-len", "4096"]


def test_plan_takes_gpu_memory_as_memory_does() -> None:
    result = runner.invoke(app, [*PLAN, "--gpu-memory", "24GiB", "--top", "2", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["request"]["gpu_memory_bytes"] == 24 * GIB
    assert plan["request"]["gpu"] == "24GiB GPU (h100-80gb compute)"
    assert plan["request"]["peak_tflops"] == load_gpu("h100-80gb").bf16_dense_tflops
    assert plan["top"] and all(row["peak_bytes"] <= 0.95 * 24 * GIB for row in plan["top"])
    for row in plan["top"]:  # memory reproduces it with --gpu-memory; comm with the GPU that priced it
        assert row["memory_options"]["gpu_memory"] == "24GiB" and "gpu" not in row["memory_options"]
        assert row["comm_options"]["gpu"] == "h100-80gb"
        options = {k: v for k, v in row["memory_options"].items() if k != "flash_attention"}
        (strategy,) = estimate_peak(**options).peak.strategies
        assert strategy.peak_bytes == row["peak_bytes"]
    header = runner.invoke(app, [*PLAN, "--gpu-memory", "24GiB", "--top", "1"]).stdout
    assert "8 × 24GiB GPU (h100-80gb compute)" in header


def test_plan_refuses_gpu_and_gpu_memory_together_and_asks_a_gpu_file_for_its_compute(tmp_path: Path) -> None:
    both = runner.invoke(app, [*PLAN, "--gpu", "l40s", "--gpu-memory", "24GiB"])
    assert both.exit_code == 2 and "give --gpu or --gpu-memory, not both" in both.stderr
    path = _gpu_file(tmp_path, "my-card.toml")
    file = runner.invoke(app, [*PLAN, "--gpu", str(path)])
    assert file.exit_code == 2 and "has no compute table" in file.stderr
    assert "--compute-calibration" in file.stderr


# --------------------------------------------------------------------------------------------- new presets
@pytest.mark.parametrize(
    ("gpu", "smi_mib", "pytorch_gib", "tflops"),
    [
        ("rtx-3090", 24_576, 23.70, 71),  # GA102 whitepaper: 71 dense bf16 (fp32 accumulate)
        ("a6000", 49_140, 47.53, 154.8),  # RTX A6000 datasheet: 309.7 with sparsity
        ("l4", 23_034, 21.96, 121),  # L4 datasheet: 242 with sparsity
        ("a10g", 23_028, 21.99, 70),
        ("h100-pcie", 81_559, 79.18, 756),  # H100 datasheet, PCIe: 1,513 with sparsity
        ("h100-nvl", 95_830, 93.10, 835),  # H100 datasheet, NVL: 1,671 with sparsity
        ("v100-32gb", 32_768, 31.74, 125),  # V100 datasheet: fp16 tensor cores
        ("gh200", 97_871, 94.50, 989),
        ("gb200", 189_471, 184.31, 2500),  # GB200 NVL72: 360 PFLOP/s sparse over 72 GPUs
        ("mi325x", 262_128, 255.98, 1307.4),
    ],
)
def test_the_new_gpu_presets_report_their_devices(
    gpu: str, smi_mib: int, pytorch_gib: float, tflops: float
) -> None:
    spec = load_gpu(gpu)
    assert spec.memory_bytes == smi_mib * MIB and round(spec.usable_bytes / GIB, 2) == pytorch_gib
    assert spec.bf16_dense_tflops == tflops


@pytest.mark.parametrize("gpu", ["rtx-3090", "a6000", "l4", "a10g"])
def test_presets_show_prints_a_new_gpu(gpu: str) -> None:
    result = runner.invoke(app, ["presets", "show", gpu])
    assert result.exit_code == 0 and load_gpu(gpu).title in result.stdout and "usable_memory" in result.stdout


def test_every_gpu_preset_has_a_compute_table_at_its_own_peak() -> None:
    """The compute table's 16-bit peak is the preset's bf16_dense_tflops (fp16's where it has no bf16)."""
    for name in preset_names("gpus"):
        spec = load_gpu(name)
        table = json.loads((preset_path("gpus", name).parent.parent / "compute" / f"{name}.json").read_text())
        peaks = table["roofline"]["peak_tflops"]
        assert peaks.get("bf16" if spec.bf16 else "fp16") == spec.bf16_dense_tflops, name
        assert ("bf16" in peaks) == spec.bf16, name


def test_bf16_is_refused_on_a_gpu_without_bf16_and_plan_trains_fp16() -> None:
    refused = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "v100-32gb"])
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "--precision bf16-mixed on the NVIDIA Tesla V100 SXM2 32GB" in refused.stderr
    assert "accepted: --precision fp16-mixed or fp32" in refused.stderr
    fp16 = estimate_memory(model="llama-3-8b", gpus=8, gpu="v100-32gb", precision="fp16-mixed")
    assert fp16.request.gpu_memory_bytes == load_gpu("v100-32gb").usable_bytes
    result = runner.invoke(app, [*PLAN, "--gpus", "16", "--gpu", "v100-32gb", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["top"]
    assert row["memory_options"]["precision"] == row["comm_options"]["precision"] == "fp16-mixed"


def test_every_nvidia_preset_states_its_compute_capability() -> None:
    """The FP8 recipes check it (MXFP8 needs 10.0): NVIDIA's presets state it, AMD's have none."""
    from zerocalc.request.gpu import gpu_preset
    from zerocalc.request.presets import preset_names

    for name in preset_names("gpus"):
        gpu = gpu_preset(name)
        assert (gpu.compute_capability is not None) == gpu.title.startswith("NVIDIA"), name
    assert gpu_preset("b200-180gb").compute_capability == (10, 0)
    assert gpu_preset("rtx-4090").compute_capability == (8, 9)
