"""accelerate's torchao path converts, on every family of ``tests/model/test_families.py``, the Linear weights
zerocalc converts with :func:`~zerocalc.parallel.fp8.accelerate_ao_skip` as ``--fp8-skip``: accelerate
1.16.0's own ``find_first_last_linear_layers`` and ``filter_linear_layers`` (``utils/ao.py``) on
``AutoModelForCausalLM.from_config(...)`` (meta device), over the modules torchao swaps
(``isinstance(module, nn.Linear)``, torchao 0.18 ``swap_linear_layers``)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ao = pytest.importorskip("accelerate.utils.ao")

from test_families import _cases, build  # noqa: E402

from zerocalc.model.hf_config import architecture_from_hf_dict  # noqa: E402
from zerocalc.model.hf_modules import hf_modules  # noqa: E402
from zerocalc.parallel.fp8 import Fp8Setting, accelerate_ao_skip  # noqa: E402
from zerocalc.parallel.precision import Fp8RecipeName  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("config", _cases())
def test_the_weights_accelerate_converts_are_those_zerocalc_converts(config: dict[str, Any]) -> None:
    model, _ = build(config)
    first, last = ao.find_first_last_linear_layers(model)
    theirs = {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and module.weight.numel()  # DeepSeek-V3's empty shared experts (n_shared_experts 0): no element
        and ao.filter_linear_layers(module, name, [first, last])
    }
    arch = architecture_from_hf_dict(config, "config.json", "tiny")
    fp8 = Fp8Setting(recipe=Fp8RecipeName.TENSORWISE, skip=accelerate_ao_skip(arch))
    ours = {m.hf_name for m in hf_modules(arch) if any(fp8.converts(t) for t in m.tensors)}
    assert ours == theirs
