"""zerocalc's parameter tensors carry transformers 5.17's names: for every family and every config variant of
``tests/test_families.py``, each tensor's transformers name (:func:`zerocalc.model.hf_modules.tensor_hf_name`)
and shape are those of ``AutoModelForCausalLM.from_config(...).named_parameters()`` on the meta device, and
each module's class is the class transformers builds (what PEFT wraps and bitsandbytes quantises)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_families import _cases, build  # noqa: E402

from zerocalc.model.architecture import parameter_tensors  # noqa: E402
from zerocalc.model.hf_classes import ModuleClass  # noqa: E402
from zerocalc.model.hf_config import architecture_from_hf_dict  # noqa: E402
from zerocalc.model.hf_modules import hf_modules, hf_parameters  # noqa: E402

pytestmark = pytest.mark.slow


def _class_of(module: Any) -> ModuleClass:
    """What zerocalc calls the class of one of transformers' modules."""
    from transformers.pytorch_utils import Conv1D

    name = type(module).__name__
    if type(module) is torch.nn.Linear:
        return ModuleClass.LINEAR
    if isinstance(module, torch.nn.Linear):
        return ModuleClass.LINEAR_SUBCLASS
    if isinstance(module, Conv1D):
        return ModuleClass.CONV1D
    if isinstance(module, torch.nn.Embedding):
        return ModuleClass.EMBEDDING
    if name.endswith("Router"):
        return ModuleClass.ROUTER
    if name.endswith("Experts"):
        return ModuleClass.EXPERTS
    if name.endswith("Attention"):
        return ModuleClass.ATTENTION
    assert "Norm" in name, name
    return ModuleClass.NORM


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("config", _cases())
def test_every_tensor_has_the_name_and_shape_transformers_gives_it(config: dict[str, Any]) -> None:
    model, _ = build(config)
    arch = architecture_from_hf_dict(config, "config.json", "tiny")
    # DeepSeek-V3 with n_shared_experts 0 builds empty shared experts, which hold no parameter
    theirs = {name: tuple(p.shape) for name, p in model.named_parameters() if p.numel()}
    modules = dict(model.named_modules())
    for module in hf_modules(arch):
        assert _class_of(modules[module.hf_name]) is module.cls, module.hf_name  # lm_head too when tied
    assert hf_parameters(arch) == theirs
    assert sum(len(m.tensors) for m in hf_modules(arch)) == len(parameter_tensors(arch))
