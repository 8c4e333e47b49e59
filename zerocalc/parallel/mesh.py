"""The device mesh of a run: data, tensor, context, pipeline and expert parallelism, and where each
group's ranks sit.

A run of N GPUs is a mesh pp × dp × cp × tp (``--pp``, ``--tp``, ``--cp``; dp = N / (pp·tp·cp)), with
expert parallelism (``--ep``) carved from dp × cp. Ranks are laid out as Megatron-LM
(``core/parallel_state.py``, ``RankGenerator`` order ``tp-cp-ep-dp-pp``) and torchtitan
(``distributed/parallel_dims.py``: mesh dims ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``, the
last varying fastest) both lay them out: tensor parallelism innermost (consecutive ranks, inside a node),
then context parallelism, then data parallelism, pipeline stages outermost, so that

    rank = ((pp_index · dp + dp_index) · cp + cp_index) · tp + tp_index.

Model states are sharded over the dp × cp ranks of equal tp index in every framework modelled:
Megatron's distributed optimizer over ``data_parallel_group_with_cp``, torchtitan's FSDP2 over
``dp_shard_cp``, DeepSpeed ZeRO over the sequence-data-parallel group of Ulysses. That group is the
:class:`~zerocalc.network.cluster.Cluster` the data-parallel strategies see (:meth:`Mesh.data_cluster`):
dp·cp ranks, g/tp of them per node.

Expert parallelism of degree e splits those dp·cp ranks again, the EP group innermost: e consecutive
ranks of the flattened dp × cp index (cp varying fastest), t apart, each holding E/e routed experts; the
ranks of equal EP index, t·e apart, form the expert-data-parallel group of dp·cp/e ranks that the routed
experts' states are sharded over (:meth:`Mesh.expert_data_cluster`). Megatron-LM ``core/parallel_state.py``
builds the expert groups with a second ``RankGenerator(tp=expert_tensor_parallel_size, ep, dp=
expert_data_parallel_size, cp=1, order="tp-cp-ep-dp-pp")`` (``expert_model_parallel_group``,
``expert_data_parallel_group``); torchtitan ``distributed/parallel_dims.py`` unflattens dp_shard × cp into
``["dp_shard_in_ep", "ep", "tp"]`` with ep borrowing all of cp (``ep % cp == 0``) and shards the routed
experts over the remaining ``dp_shard_mod_ep`` ranks; DeepSpeed-MoE (``deepspeed/utils/groups.py``
``_create_expert_and_data_parallel``) groups ``ep_size`` consecutive data-parallel ranks likewise.

Megatron-LM's expert mesh is a grid of its own over the same ranks (Megatron-LM core 0.20.0, commit
d98e8a6, ``core/parallel_state.py`` ``initialize_model_parallel``: ``expert_decoder_rank_generator =
RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_size,
cp=1, pp)``, ``expert_data_parallel_size = world_size // (expert_tensor_parallel_size ·
expert_model_parallel_size · pipeline_model_parallel_size)``): the routed experts are split over the
expert-tensor-parallel group of ETP consecutive ranks (``expert_tensor_parallel_size``, ``--expert-tp``
here; ``training/arguments.py`` sets it to the TP size when not given), the EP group is e ranks ETP apart
and the expert-data-parallel group the N/(p·ETP·e) ranks ETP·e apart, while attention keeps its tp × cp ×
dp grid. At ETP = t this is the layout above; at ETP < t the EP group takes ranks of the attention's TP
group (ETP = 1, the DeepSeek-V3 recipes: e consecutive ranks), so that

    expert rank = ((pp_index · edp + edp_index) · e + ep_index) · ETP + etp_index.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from zerocalc.base.units import ceil_div
from zerocalc.model.activations import CpImpl
from zerocalc.network.cluster import Cluster


class TpStyle(StrEnum):
    """Whose tensor-parallel code shards the layers."""

    MEGATRON = "megatron"
    """Megatron-LM ``core/tensor_parallel/layers.py``: Column/RowParallelLinear, VocabParallelEmbedding;
    the vocabulary padded to a multiple of 128·t (``make_vocab_size_divisible_by``)."""
    DTENSOR = "dtensor"
    """``torch.distributed.tensor.parallel`` plans (torchtitan ``models/llama3/infra/parallelize.py``
    ``apply_tp``): ColwiseParallel, RowwiseParallel, SequenceParallel; shards as ``torch.chunk``."""


class PpSchedule(StrEnum):
    """The pipeline schedule (``--pp-schedule``)."""

    GPIPE = "gpipe"
    """All forwards, then all backwards (Huang et al. 2019; torch ``ScheduleGPipe``)."""
    ONE_F_ONE_B = "1f1b"
    """One forward, one backward in the steady state (Narayanan et al. 2021, PipeDream-Flush; torch
    ``Schedule1F1B``; Megatron-LM ``forward_backward_pipelining_without_interleaving``)."""
    INTERLEAVED_1F1B = "interleaved-1f1b"
    """v virtual stages per rank (Narayanan et al. 2021 §2.2; torch ``ScheduleInterleaved1F1B``;
    Megatron-LM ``forward_backward_pipelining_with_interleaving``)."""
    ZERO_BUBBLE = "zero-bubble"
    """Backward split into input- and weight-gradient passes (Qi et al. 2023, ZB-H1; torch
    ``ScheduleInterleavedZeroBubble``)."""


PP_SCHEDULE_NAMES: dict[str, PpSchedule] = {
    "schedulegpipe": PpSchedule.GPIPE,
    "schedule1f1b": PpSchedule.ONE_F_ONE_B,
    "scheduleinterleaved1f1b": PpSchedule.INTERLEAVED_1F1B,
    "interleaved": PpSchedule.INTERLEAVED_1F1B,
    "scheduleinterleavedzerobubble": PpSchedule.ZERO_BUBBLE,
    "zb": PpSchedule.ZERO_BUBBLE,
    "zbh1": PpSchedule.ZERO_BUBBLE,
}
"""torch.distributed.pipelining's class names and Megatron-LM's words accepted for a schedule."""


class MeshGroup(BaseModel):
    """One dimension's process group as the layout places it."""

    model_config = ConfigDict(frozen=True, defer_build=True)  # built where first made: not at start-up

    dimension: str = Field(
        description="tp, cp, dp or pp; with expert parallelism also ep and expert_dp (the ranks of equal EP "
        "index that the routed experts' states are sharded over), and expert_tp where 1 < ETP < t"
    )
    size: int = Field(description="ranks in one group")
    stride: int = Field(description="the distance between consecutive ranks of a group")
    spans_nodes: bool = Field(description="a group has ranks on more than one node")


class Mesh(BaseModel):
    """dp × cp × tp ranks on nodes of g GPUs, TP innermost (the module docstring's layout)."""

    model_config = ConfigDict(frozen=True)

    world: int = Field(ge=1, description="N: GPUs of the run")
    gpus_per_node: int = Field(ge=1, description="g: GPUs of the run on one node")
    tp: int = Field(default=1, ge=1, description="t: tensor-parallel ranks")
    cp: int = Field(default=1, ge=1, description="c: context-parallel ranks")
    sequence_parallel: bool = Field(
        default=False,
        description="norms and dropouts sharded by sequence over the TP group, all-gather and reduce-scatter "
        "in place of all-reduce (Korthikanti et al. 2022)",
    )
    cp_impl: CpImpl = Field(default=CpImpl.RING, description="how attention exchanges K/V across CP ranks")
    tp_style: TpStyle = Field(default=TpStyle.MEGATRON, description="whose tensor-parallel layers")
    pp: int = Field(default=1, ge=1, description="p: pipeline stages")
    vpp: int = Field(default=1, ge=1, description="v: virtual stages (model chunks) per pipeline rank")
    pp_schedule: PpSchedule = Field(default=PpSchedule.ONE_F_ONE_B, description="the pipeline schedule")
    pp_first_stage_layers: int | None = Field(
        default=None, ge=1, description="the first pipeline rank's layers (null: an even share)"
    )
    pp_last_stage_layers: int | None = Field(
        default=None, ge=1, description="the last pipeline rank's layers (null: an even share)"
    )
    pp_stage_layers: tuple[int, ...] | None = Field(
        default=None,
        description="the layers of each of the p·v virtual stages in pipeline order, stage k chunk k // p of "
        "rank k % p (null: the first and last stage's layers and an even share)",
    )
    ep: int = Field(default=1, ge=1, description="e: expert-parallel ranks, carved from (t/ETP) × dp × cp")
    expert_tp: int | None = Field(
        default=None,
        ge=1,
        description="ETP: the ranks each routed expert is tensor-parallel over (Megatron-LM "
        "expert_tensor_parallel_size); null: t, Megatron-LM's default",
    )

    @model_validator(mode="after")
    def _one_split(self) -> Mesh:
        if self.expert_tp is not None and self.tp % self.expert_tp:
            raise ValueError("expert_tp must divide tp")
        if self.pp_stage_layers is not None:
            if len(self.pp_stage_layers) != self.pp * self.vpp:
                raise ValueError("pp_stage_layers must hold p·v counts")
            if self.pp_first_stage_layers is not None or self.pp_last_stage_layers is not None:
                raise ValueError("pp_stage_layers excludes pp_first_stage_layers and pp_last_stage_layers")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def dp(self) -> int:
        """d: data-parallel replicas, N / (t·c·p)."""
        return self.world // (self.tp * self.cp * self.pp)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def groups(self) -> list[MeshGroup]:
        """Each dimension's group of ranks: rank r's tp group is the t ranks from t·⌊r/t⌋, its cp group
        the c ranks t apart, its dp group the d ranks t·c apart; model states shard over dp × cp. With
        expert parallelism, its ep group the e ranks ETP apart and its expert_dp group the N/(p·ETP·e)
        ranks ETP·e apart, and where ETP < t its expert_tp group the ETP consecutive ranks from
        ETP·⌊r/ETP⌋ (the module docstring)."""
        groups = [
            MeshGroup(dimension="tp", size=self.tp, stride=1, spans_nodes=self.tp_spans_nodes),
            MeshGroup(dimension="cp", size=self.cp, stride=self.tp, spans_nodes=self.cp_spans_nodes),
            MeshGroup(
                dimension="dp",
                size=self.dp,
                stride=self.tp * self.cp,
                spans_nodes=self.group_spans_nodes(self.tp * self.cp, self.dp),
            ),
            MeshGroup(
                dimension="pp",
                size=self.pp,
                stride=self.tp * self.cp * self.dp,
                spans_nodes=self.group_spans_nodes(self.tp * self.cp * self.dp, self.pp),
            ),
        ]
        if self.ep > 1:
            etp = self.etp
            groups += [
                MeshGroup(dimension="ep", size=self.ep, stride=etp, spans_nodes=self.ep_spans_nodes),
                MeshGroup(
                    dimension="expert_dp",
                    size=self.expert_dp,
                    stride=etp * self.ep,
                    spans_nodes=self.group_spans_nodes(etp * self.ep, self.expert_dp),
                ),
            ]
            if 1 < etp < self.tp:
                groups.append(
                    MeshGroup(dimension="expert_tp", size=etp, stride=1, spans_nodes=self.etp_spans_nodes)
                )
        return groups

    @property
    def model_parallel(self) -> bool:
        return self.tp > 1 or self.cp > 1 or self.pp > 1 or self.ep > 1

    def data_cluster(self) -> Cluster:
        """The dp × cp ranks of one TP index, which model states are sharded over and gradients reduced
        across: consecutive such ranks are t apart, so a node holds g/t of them."""
        return Cluster.of(self.dp * self.cp, max(1, self.gpus_per_node // self.tp))

    @property
    def etp(self) -> int:
        """ETP: the expert-tensor-parallel ranks, ``expert_tp`` or t (Megatron-LM core 0.20.0
        ``training/arguments.py``: ``if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size``)."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def expert_dp(self) -> int:
        """The expert-data-parallel ranks a routed expert is replicated on: N/(p·ETP·e), dp·c/e at ETP = t
        (Megatron-LM ``expert_data_parallel_size = world_size // (expert_tensor_parallel_size ·
        expert_model_parallel_size · pipeline_model_parallel_size)``; torchtitan ``dp_shard_mod_ep``)."""
        return self.dp * self.cp * (self.tp // self.etp) // self.ep

    def expert_data_cluster(self) -> Cluster:
        """The N/(p·ETP·e) ranks of equal expert-tensor and EP index, which the routed experts' states are
        sharded over and their gradients reduced across (the dp × cp ranks at e = 1, ETP = t): consecutive
        such ranks are ETP·e apart, so a node holds g/(ETP·e) of them (at least one)."""
        return Cluster.of(self.expert_dp, max(1, self.gpus_per_node // (self.etp * self.ep)))

    @property
    def ep_spans_nodes(self) -> bool:
        """An EP group (e ranks ETP apart) has ranks on more than one node: ETP·e > g."""
        return self.group_spans_nodes(self.etp, self.ep)

    @property
    def etp_spans_nodes(self) -> bool:
        """An expert-tensor-parallel group (ETP consecutive ranks) has ranks on more than one node."""
        return self.group_spans_nodes(1, self.etp)

    @property
    def ep_ranks_per_node(self) -> int:
        """How many ranks of one EP group share a node: e, or g/ETP when the group spans nodes."""
        return min(self.ep, max(1, self.gpus_per_node // self.etp))

    def group_spans_nodes(self, inner: int, size: int) -> bool:
        """Whether a group of ``size`` ranks, ``inner`` apart (tp: 1, cp: t, dp: t·c), has ranks on more
        than one node."""
        return size > 1 and inner * size > self.gpus_per_node

    @property
    def tp_spans_nodes(self) -> bool:
        return self.group_spans_nodes(1, self.tp)

    @property
    def cp_spans_nodes(self) -> bool:
        return self.group_spans_nodes(self.tp, self.cp)

    @property
    def nodes(self) -> int:
        return ceil_div(self.world, self.gpus_per_node)

    def rank_of(self, dp_index: int, cp_index: int, tp_index: int, pp_index: int = 0) -> int:
        """The global rank at a mesh coordinate (pipeline stages outermost, as Megatron-LM's
        ``tp-cp-ep-dp-pp`` order and torchtitan's ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``)."""
        return ((pp_index * self.dp + dp_index) * self.cp + cp_index) * self.tp + tp_index

    def describe(self) -> str:
        """``pp 4 × dp 2 × cp 2 × tp 4`` (degrees of 1 omitted but dp)."""
        parts = []
        if self.pp > 1:
            virtual = f" × v {self.vpp}" if self.vpp > 1 else ""
            uneven = "".join(
                f", {which} stage {n} layers"
                for which, n in (("first", self.pp_first_stage_layers), ("last", self.pp_last_stage_layers))
                if n is not None
            )
            if self.pp_stage_layers is not None:
                uneven = f", stage layers {describe_layer_counts(self.pp_stage_layers)}"
            parts.append(f"pp {self.pp}{virtual} ({self.pp_schedule.value}{uneven})")
        etp = f", etp {self.etp}" if self.etp != self.tp else ""
        parts.append(f"dp {self.dp}" + (f" (ep {self.ep}{etp})" if self.ep > 1 else ""))
        if self.cp > 1:
            parts.append(f"cp {self.cp} ({self.cp_impl.value})")
        if self.tp > 1:
            parts.append(f"tp {self.tp}" + (" + sp" if self.sequence_parallel else ""))
        return " × ".join(parts)


def describe_layer_counts(counts: tuple[int, ...]) -> str:
    """Each rank's layers, first to last, runs of equal counts as count × ranks: ``7, 8 × 14, 7``."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ", ".join(f"{count} × {ranks}" if ranks > 1 else str(count) for count, ranks in runs)
