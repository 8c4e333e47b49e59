"""Options shared by several commands, declared once (help text included).

Every value is taken as typed (text) and parsed by :mod:`zerocalc.request.training`, which names what is
accepted.
"""

from __future__ import annotations

from typing import Annotated

import typer

Params = Annotated[
    str | None,
    typer.Option("--params", "-p", help="Parameter count Ψ: 7B, 6.7b, 124M, 1.5T, 6.7e9, 6_738_415_616."),
]
Gpus = Annotated[
    str, typer.Option("--gpus", "-n", metavar="N", help="N: data-parallel world size (GPUs of the run).")
]
GpusPerNode = Annotated[
    str | None,
    typer.Option("--gpus-per-node", "-g", help="g: GPUs per node \\[default: 8, or N when N is smaller]."),
]
StrategyOpt = Annotated[
    str,
    typer.Option(
        "--strategy",
        "-s",
        help="all, or a comma list of ddp, zero1, zero2, shard_grad_op, zero3, hybrid_shard "
        "(FSDP names such as no_shard, full_shard, hybrid are aliases).",
    ),
]
Precision = Annotated[str, typer.Option("--precision", help="bf16-mixed, fp16-mixed, fp32 or bf16-pure.")]
Optimizer = Annotated[
    str,
    typer.Option("--optimizer", help="adam, adamw, sgd (momentum), sgd-no-momentum, adafactor, adam-8bit."),
]
Fp32GradAccum = Annotated[
    bool,
    typer.Option(
        "--fp32-grad-accum", help="Add a 4-byte fp32 buffer per parameter where gradients accumulate."
    ),
]
ZeroInit = Annotated[
    bool | None,
    typer.Option(
        "--zero-init/--no-zero-init",
        help="DeepSpeed ZeRO-3: the model is built under DeepSpeed's zero.Init (its host estimate) "
        "\\[default: on].",
        show_default=False,
    ),
]
OffloadOptimizer = Annotated[
    str, typer.Option("--offload-optimizer", help="none, cpu or nvme (ZeRO-Offload / ZeRO-Infinity).")
]
OffloadParams = Annotated[str, typer.Option("--offload-params", help="none, cpu or nvme (zero3 only).")]
Units = Annotated[str, typer.Option("--units", "-u", help="GiB (default), GB, MiB, MB, TiB, TB or B.")]
GpuMemory = Annotated[
    str | None,
    typer.Option(
        "--gpu-memory",
        help="Memory of one GPU as PyTorch sees it, e.g. 79GiB: adds fits/headroom (instead of --gpu).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON (exact integer bytes).")]
Model = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="A model preset (see `zerocalc presets list models`) or a HF config.json."
    ),
]
Gpu = Annotated[
    str | None, typer.Option("--gpu", help="A GPU preset, e.g. h100-80gb (see `zerocalc presets list gpus`).")
]
Reserve = Annotated[
    str | None,
    typer.Option(
        "--reserve",
        "--overhead",
        help="Held outside the caching allocator at world size 1: CUDA context, kernels, NCCL "
        "\\[default: the GPU preset's measured, 1.30 GiB on the H100].",
    ),
]
SeqLen = Annotated[
    str,
    typer.Option(
        "--seq-len", help="s: tokens per sequence, 4096 or 8k (= 8192, k = 1024); activations need --model."
    ),
]
MicroBatch = Annotated[str, typer.Option("--micro-batch", help="b: sequences per micro-batch per GPU.")]
RecomputeOpt = Annotated[
    str, typer.Option("--recompute", help="Activation recomputation: none, selective, full.")
]
FlashAttention = Annotated[
    bool | None,
    typer.Option(
        "--flash-attention/--no-flash-attention",
        help="Flash attention (no s² terms) \\[default: on for the Llama family, off for GPT-2/3].",
        show_default=False,
    ),
]
Prefetch = Annotated[
    str, typer.Option("--prefetch", help="ZeRO-3/FSDP units gathered ahead of the current one.")
]
WrapOpt = Annotated[str, typer.Option("--wrap", help="ZeRO-3/FSDP unit: block (one per layer) or model.")]
FrameworkOpt = Annotated[
    str,
    typer.Option(
        "--framework",
        help="Accounting to follow: paper, deepspeed (its estimators), megatron, or what PyTorch really "
        "allocates: fsdp, fsdp2, torch-zero1, ddp.",
    ),
]
DdpBucket = Annotated[
    str | None,
    typer.Option("--ddp-bucket", help="DDP bucket_cap_mb in bytes \\[default: 25MiB, first bucket 1MiB]."),
]
ReduceBucket = Annotated[
    str,
    typer.Option(
        "--reduce-bucket", help="ZeRO-1/2 reduce bucket, elements (DeepSpeed's reduce bucket size)."
    ),
]
AllgatherBucket = Annotated[
    str,
    typer.Option(
        "--allgather-bucket", help="ZeRO-1/2 all-gather bucket, elements (DeepSpeed's allgather bucket size)."
    ),
]
ModelImplOpt = Annotated[
    str,
    typer.Option(
        "--model-impl",
        help="The model's code: hf (transformers 5.17), megatron (fused kernels), torchtitan.",
    ),
]
OptimizerImplOpt = Annotated[
    str,
    typer.Option("--optimizer-impl", help="torch.optim Adam implementation: foreach, fused or for-loop."),
]
GradAccum = Annotated[str, typer.Option("--grad-accum", "-A", help="A: micro-batches per optimizer step.")]
GradSyncOpt = Annotated[
    str | None,
    typer.Option(
        "--grad-sync",
        help="every or last: gradients reduced every micro-batch, or only the last (no_sync; FSDP2: "
        "requires gradient sync off) \\[default: each framework's; PyTorch: every].",
        show_default=False,
    ),
]
ZeroPPOpt = Annotated[
    str | None,
    typer.Option("--zeropp", help="DeepSpeed ZeRO++ for zero3: all, or a comma list of qwz, hpz, qgz."),
]
ExpandableSegments = Annotated[
    bool,
    typer.Option(
        "--expandable-segments",
        help="The caching allocator with expandable segments on (a PyTorch allocator setting): its reserve.",
    ),
]
ReduceDtype = Annotated[
    str | None,
    typer.Option("--reduce-dtype", help="Reduce gradients in fp32 (default: the gradient dtype)."),
]
