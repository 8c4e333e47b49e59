"""GPU presets: memory as the devices report it, the vendor's runtime names, "measured" only for a
measurement; GPU files of the presets' schema (``--gpu FILE.toml``)."""

from __future__ import annotations

import tomllib

import pytest
from typer.testing import CliRunner

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


def test_an_amd_gpu_is_described_in_rocm_terms() -> None:
    text = _memory_output("mi300x")
    for rocm in ("in rocm-smi", "+ HIP context, kernels", "+ RCCL communicators", "hipBLASLt workspace"):
        assert rocm in text
    for cuda in ("nvidia-smi", "CUDA context", "NCCL", "cuBLAS"):
        assert cuda not in text


def test_an_nvidia_gpu_keeps_its_names() -> None:
    text = _memory_output("h100-80gb")
    for name in ("in nvidia-smi", "+ CUDA context, kernels", "+ NCCL communicators", "cuBLAS workspace"):
        assert name in text


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
