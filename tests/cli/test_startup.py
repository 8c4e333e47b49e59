"""What the console script loads for ``memory --params 7B --gpus 4`` (the start-up benchmarks/startup.py
times): none of what only a --model request reads. Checked by the modules and pydantic schemas a real
process holds when the command is done, which machine load does not change (a timing would)."""

from __future__ import annotations

import json
import subprocess
import sys

REPORT = """
import atexit, json, sys

def report():
    from zerocalc.model.architecture import ParamTensor, PipelineStage, TensorParallelRank
    from zerocalc.parallel.mesh import MeshGroup
    built = [c.__name__ for c in (ParamTensor, PipelineStage, TensorParallelRank, MeshGroup)
             if c.__pydantic_complete__]
    print(json.dumps({"modules": sorted(sys.modules), "built": built}), file=sys.stderr)

atexit.register(report)
sys.argv = ["zerocalc", "memory", "--params", "7B", "--gpus", "4"]
from zerocalc.cli import main
main()
"""


def test_memory_with_params_loads_no_model_machinery() -> None:
    """The family records of config.json files (model/hf_config.py, 16 records of pydantic keys) load
    with a model; the schemas of a rank's share of a model (TensorParallelRank, PipelineStage, their
    tensors) and of the mesh's groups are built where one is first made: a --params request makes none."""
    done = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ZeRO-3" in done.stdout
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert "zerocalc.model.hf_config" not in loaded["modules"]
    assert "zerocalc.states.memory" in loaded["modules"]  # what the command computes with
    assert not {m for m in loaded["modules"] if m.split(".")[0] in ("torch", "transformers", "numpy")}
    assert loaded["built"] == []
