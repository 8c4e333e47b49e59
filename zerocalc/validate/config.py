"""What a validation run is asked to do, and the per-rank measurements it sends back (pure, no torch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.errors import InputError
from zerocalc.model.architecture import Architecture
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.finetune import FineTuning
from zerocalc.parallel.framework_records import validated_setups
from zerocalc.parallel.framework_records.pytorch import TORCH_OPTIMIZERS
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName

PERTURB_ENV = "ZEROCALC_VALIDATE_PERTURB"
"""Tests only (not in ``--help``): ``LINE`` (e.g. ``params``) adds one fp32 element's bytes to that line
of every rank's prediction, so a deliberately wrong prediction must be reported as a mismatch (exit 1)."""
TEST_FAIL_ENV = "ZEROCALC_VALIDATE_TEST_FAIL"
"""Tests only (not in ``--help``): ``STRATEGY`` makes rank 1 of a spawned world exit with code 1 when that
strategy's configuration starts, to check that the other configurations still run."""

STRATEGIES = validated_setups()
"""``--strategies`` names → (framework, strategy, PyTorch setup), from the Strategy records."""
PRECISIONS = (PrecisionName.FP32, PrecisionName.BF16_MIXED)
"""What validate runs: fp32, and bf16 ``MixedPrecision``/``MixedPrecisionPolicy`` (autocast for DDP)."""
OPTIMIZERS = TORCH_OPTIMIZERS


def check_buildable(arch: Architecture) -> None:
    """Refuse, in one line, an architecture the real model of ``zerocalc/validate/model.py`` cannot build:
    it builds the classic dense pre-norm blocks (separate q/k/v/o projections, one MLP) only."""
    features = arch.beyond_classic_block()
    if features:
        raise InputError(
            f"{arch.name} has {', '.join(features)}; zerocalc validate builds dense pre-norm blocks with "
            "separate q/k/v/o projections only; accepted: a GPT-2/3, Llama, Mistral or Qwen2 model "
            "(gpt2, llama-3-8b, mistral-7b, qwen2.5-7b, ... or their config.json)"
        )


WARMUP_STEPS = 2
"""Steps run before the measured one, so that it is a steady step: DDP rebuilds its buckets (and broadcasts
their layout) in the forward after its first synchronised backward, at the latest in the second step
(``reducer.cpp`` ``Reducer::rebuild_buckets``)."""


class TpPlan(BaseModel):
    """A 2-D mesh of ``dp × tp`` ranks, TP innermost (ranks ``r, r+1, … r+tp−1`` with ``r`` a multiple of tp
    share a TP group; a DP group is every tp-th rank), and the TP plan's two switches."""

    model_config = ConfigDict(frozen=True)

    dp: int = Field(ge=1)
    tp: int = Field(ge=2)
    sequence_parallel: bool = Field(
        default=True, description="SequenceParallel norms, activations sharded on the sequence between blocks"
    )
    loss_parallel: bool = Field(
        default=True, description="the logits stay sharded over the vocabulary into the cross entropy"
    )

    @property
    def world(self) -> int:
        return self.dp * self.tp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def dp_rank(self, rank: int) -> int:
        return rank // self.tp

    def tp_group(self, rank: int) -> list[int]:
        first = rank - self.tp_rank(rank)
        return list(range(first, first + self.tp))

    def dp_group(self, rank: int) -> list[int]:
        return list(range(self.tp_rank(rank), self.world, self.tp))

    @property
    def title(self) -> str:
        switches = [
            "sequence parallel" if self.sequence_parallel else "no sequence parallel",
            "loss parallel" if self.loss_parallel else "no loss parallel",
        ]
        return f"dp {self.dp} × tp {self.tp}, " + ", ".join(switches)


class Job(BaseModel):
    """One configuration: a strategy × precision × gradient-sync mode."""

    arch: Architecture
    strategy: str
    precision: PrecisionName = Field(description="fp32 or bf16-mixed")
    optimizer: OptimizerName = Field(description="adam or adamw")
    backend: str = Field(description="gloo or nccl")
    timeout_s: float = Field(gt=0)
    grad_accum: int = Field(default=1, ge=1, description="A: micro-batches per optimizer step")
    grad_sync: GradSync = GradSync.EVERY
    gpus_per_node: int = Field(default=1, ge=1, description="the ranks of a node: HYBRID_SHARD's shard group")
    tp_plan: TpPlan | None = Field(default=None, description="a dp × tp mesh (FSDP2); None: data parallel")
    finetune: FineTuning | None = Field(
        default=None,
        description="PEFT's LoRA of the model (validate frameworks --lora-rank); None: full training",
    )
    batch: int = 2
    seq: int = 16
    seed: int = 0


class RecordedCall(BaseModel):
    """One collective a rank issued in the measured step, as the dispatcher saw it."""

    op: str = Field(description="all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, ...")
    phase: str = Field(description="forward, backward or after_step")
    dtype: str = Field(description="fp32, bf16, ... (torch's name for others)")
    elements: int = Field(description="S: the all_gather output, the reduce_scatter input, else the input")
    group_ranks: list[int]
    root: int | None = Field(default=None, description="a broadcast's source, as a rank of its group")


class Measured(BaseModel):
    """What one rank held, in bytes (sums of tensor bytes)."""

    rank: int
    params: int
    grads: int
    optimizer: int
    step: int
    unsharded_after_forward: int | None = Field(
        default=None, description="None where nothing is sharded (DDP, ZeRO-1): not measured"
    )
    frozen: int | None = Field(
        default=None, description="fine-tuning: the frozen parameters' local bytes (None: full training)"
    )
    peak_allocated: int | None = Field(default=None, description="torch.cuda.max_memory_allocated (GPU only)")
    loss: float
    collectives: list[RecordedCall] = Field(default=[], description="those of the measured step")
