"""``--model org/name``: a Hugging Face model id read offline from the local cache, as huggingface_hub lays
it out (``models--org--name/refs/main``, ``snapshots/<commit>/config.json`` linking into ``blobs/``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.api import estimate_memory
from zerocalc.cli import app
from zerocalc.request.presets import hf_hub_cache

runner = CliRunner()

REPO = "meta-llama/Llama-3.1-8B"
OLD, MAIN = "1" * 40, "8c22764a7e3675c50d4c7c9a4edb474456022b16"
LLAMA_3_1_8B = {  # meta-llama/Llama-3.1-8B config.json's sizes (presets/models/llama-3.1-8b.toml)
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


def cache_model(cache: Path, repo: str, config: dict, commit: str = MAIN, main: bool = True) -> Path:
    """Lay ``config`` out in ``cache`` as huggingface_hub's hf_hub_download does: the file's bytes in
    ``blobs/<etag>``, the snapshot's config.json a relative link to it, ``refs/main`` the commit."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    text = json.dumps(config)
    blob = folder / "blobs" / f"{abs(hash(text)):040x}"[:40]
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_text(text)
    link = folder / "snapshots" / commit / "config.json"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("..") / ".." / "blobs" / blob.name)
    if main:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
    return link


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("zerocalc opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Hugging Face variable set, and a home of its own."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_a_model_id_is_read_from_hf_hub_cache(clean_env: Path, no_network: None) -> None:
    cache = clean_env / "hub"
    cache_model(cache, REPO, {**LLAMA_3_1_8B, "num_hidden_layers": 2}, commit=OLD, main=False)
    cache_model(cache, REPO, LLAMA_3_1_8B)  # refs/main names this revision, not the older one
    result = runner.invoke(app, ["memory", "--model", REPO, "--gpus", "8"], env={"HF_HUB_CACHE": str(cache)})
    assert result.exit_code == 0, result.output
    assert "Model LlamaForCausalLM, meta-llama/Llama-3.1-8B: 8,030,261,248 parameters" in result.stdout


@pytest.mark.parametrize("where", ["HF_HOME", "XDG_CACHE_HOME", "HOME"])
def test_the_cache_is_found_where_huggingface_hub_looks(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    base = {"HF_HOME": clean_env / "hf", "XDG_CACHE_HOME": clean_env / "xdg" / "huggingface"}
    cache = base.get(where, clean_env / "home" / ".cache" / "huggingface") / "hub"
    if where != "HOME":
        monkeypatch.setenv(where, str(cache.parent if where == "HF_HOME" else cache.parent.parent))
    cache_model(cache, REPO, LLAMA_3_1_8B)
    assert hf_hub_cache() == cache
    estimate = estimate_memory(model=REPO, gpus=8)
    assert estimate.model is not None and estimate.model.name == REPO
    assert estimate.request.params == 8_030_261_248


def test_the_layout_is_the_one_huggingface_hub_reads(clean_env: Path) -> None:
    hub = pytest.importorskip("huggingface_hub")
    link = cache_model(clean_env / "hub", REPO, LLAMA_3_1_8B)
    found = hub.try_to_load_from_cache(REPO, "config.json", cache_dir=clean_env / "hub")
    assert Path(found) == link


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        ("nothing", "holds no models--meta-llama--Llama-3.1-8B/refs/main"),
        ("no config", "holds no config.json for its main revision"),
    ],
)
def test_a_model_id_not_in_the_cache_says_how_to_pass_a_config(
    clean_env: Path, no_network: None, setup: str, fragment: str
) -> None:
    cache = clean_env / "hub"
    if setup == "no config":
        (cache / "models--meta-llama--Llama-3.1-8B" / "refs").mkdir(parents=True)
        (cache / "models--meta-llama--Llama-3.1-8B" / "refs" / "main").write_text(MAIN)
    result = runner.invoke(app, ["memory", "--model", REPO, "--gpus", "8"], env={"HF_HUB_CACHE": str(cache)})
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert fragment in result.stderr and "a config.json path" in result.stderr
    assert f"`hf download {REPO} config.json`" in result.stderr
