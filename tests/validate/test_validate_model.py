"""The real torch model has exactly the analytic parameter list."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from helpers import shrunk  # noqa: E402

from zerocalc.base.errors import InputError  # noqa: E402
from zerocalc.model.architecture import count_parameters, parameter_tensors  # noqa: E402
from zerocalc.request.presets import load_model  # noqa: E402
from zerocalc.validate.model import build_model, loss_fn  # noqa: E402

SMALL = dict(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=96, vocab_size=1001)


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("gpt2", {}),
        ("gpt2", {"hidden_size": 63, "num_heads": 3}),
        ("llama-2-7b", {}),
        ("llama-3-8b", {"num_kv_heads": 2}),
        ("mistral-7b", {"num_kv_heads": 1}),
        ("qwen2.5-7b", {"num_kv_heads": 2}),
        ("gpt3-175b", {}),
    ],
)
def test_built_parameters_are_the_analytic_list(name: str, changes: dict[str, int]) -> None:
    arch = shrunk(name, SMALL, **changes)
    model = build_model(arch)
    built = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    expected = [(f"{t.module}.{t.name}", t.shape) for t in parameter_tensors(arch)]
    assert built == expected
    assert sum(p.numel() for p in model.parameters()) == count_parameters(arch).total
    tokens = torch.randint(0, arch.vocab_size, (2, 8))
    loss = loss_fn(model(tokens), tokens)
    assert torch.isfinite(loss)


def test_moe_is_refused() -> None:
    arch, _ = load_model("mixtral-8x7b")
    with pytest.raises(InputError, match="mixture-of-experts"):
        build_model(arch.model_copy(update={"num_layers": 1}))
