"""Every option of ``memory``, ``comm`` and ``plan``, defined once.

An :class:`Option` is the one definition of an input: its keyword (also its name in messages, ``{gpus}``,
in the raw options models and in the JSON echo), its flags, its default, its help and what it accepts.
Everything else is derived from :data:`OPTIONS`: the raw options models (:func:`options_model`), the
Typer commands' parameters (``zerocalc.cli.options``), the library functions' keywords
(``zerocalc.api``), the flag each message names (``zerocalc.cli.base.flag``) and the JSON's ``options``
echo (:func:`echo`). Values arrive as typed (text, or numbers from the library) and are checked where
they are parsed (:func:`zerocalc.request.training.parse_request`, :func:`zerocalc.plan.space.parse_plan`),
with the bounds named here where an option has them.

Adding an option is one :class:`Option` here plus its use where it is parsed.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, NamedTuple

from pydantic import Field


class Command(StrEnum):
    MEMORY = "memory"
    COMM = "comm"
    PLAN = "plan"


class Kind(StrEnum):
    """How the command line takes an option."""

    TEXT = "text"
    """A value typed after the flag (``--gpus 8``), parsed by the request."""
    FLAG = "flag"
    """On when given (``--json``)."""
    SWITCH = "switch"
    """``--x`` or ``--no-x``; unset means the default the help names."""


MEMORY, COMM, PLAN = Command.MEMORY, Command.COMM, Command.PLAN
ESTIMATES = frozenset({MEMORY, COMM})
ALL_ESTIMATES = frozenset({MEMORY, COMM, PLAN})
FINETUNE = frozenset({MEMORY, COMM, PLAN})
"""The fine-tuning options: ``memory``'s model states count them, ``comm``'s collectives and step time;
``plan`` searches the configurations of the one method they give."""


class Option(NamedTuple):
    """One input: the one place its name, flags, default, help and accepted values are written."""

    name: str
    """The keyword (``gpus_per_node``): the library's, the raw model's field, the JSON echo's key."""
    flags: tuple[str, ...]
    """The CLI's spellings, the first the long one messages name."""
    help: str
    commands: frozenset[Command]
    default: Any = None
    """The library's default (the CLI shows it as text); None: unset, each parser says what that means."""
    kind: Kind = Kind.TEXT
    value_type: Any = "int | str | None"
    """What the raw model's field holds before parsing (a type expression, as the library may pass it)."""
    metavar: str | None = None
    default_help: str | None = None
    """The help's ``[default: …]`` where the default is not a plain value (``each framework's``)."""
    request: bool = True
    """Part of the request (False: how the command prints, ``--units``, ``--json``)."""
    negative: str | None = None
    """A switch's negative flag (``--no-flash-attention``)."""

    @property
    def flag(self) -> str:
        return self.flags[0]


def _opt(name: str, flags: tuple[str, ...], help: str, commands: frozenset[Command], **fields: Any) -> Option:
    return Option(name=name, flags=flags, help=help, commands=commands, **fields)


STR = "str"
OPT_STR = "str | None"
OPT_NUM = "int | str | None"
NUM = "int | str"
FLOAT = "float | str | None"
LIST = "str | list[str] | tuple[str, ...] | None"
BOOL = "bool"

OPTIONS: tuple[Option, ...] = (
    # ---------------------------------------------------------------------------------- the model
    _opt("params", ("--params", "-p"),
         "Parameter count Ψ: 7B, 6.7b, 124M, 1.5T, 6.7e9, 6_738_415_616 (K, M, B, T: powers of 1,000).",
         ESTIMATES, value_type=OPT_NUM),
    _opt("model", ("--model", "-m"),
         "A model preset (see `zerocalc presets list models`), a model TOML file in the presets' schema, "
         "a HF config.json, the folder holding one, - (read from standard input), or a HF model id "
         "(org/name) in the local Hugging Face cache (HF_HUB_CACHE, HF_HOME; read offline).",
         ESTIMATES | {PLAN}, value_type="str | Architecture | dict[str, Any] | None"),
    # ---------------------------------------------------------------------------------- the cluster
    _opt("gpus", ("--gpus", "-n"), "N: GPUs of the run, dp × cp × tp.", ESTIMATES,
         default=1, value_type=NUM, metavar="N"),
    _opt("gpus", ("--gpus", "-n"), "N: the most GPUs; fewer whole nodes are searched too.", frozenset({PLAN}),
         default=8, value_type=NUM, metavar="N"),
    _opt("gpus_per_node", ("--gpus-per-node", "-g"), "g: GPUs per node.", ESTIMATES | {PLAN},
         value_type=OPT_NUM, default_help="8, or N when N is smaller"),
    _opt("tp", ("--tp",),
         "t: tensor-parallel ranks (Megatron / DTensor layers), innermost: consecutive GPUs of a node.",
         ESTIMATES, default=1, value_type=NUM, metavar="T"),
    _opt("sequence_parallel", ("--sequence-parallel",),
         "Shard norms and dropouts by sequence over the TP group (all-gather + reduce-scatter in place "
         "of all-reduce).", ESTIMATES, kind=Kind.SWITCH, value_type="bool | None",
         negative="--no-sequence-parallel",
         default_help="on for fsdp2 with torchtitan code (its plan); off otherwise"),
    _opt("cp", ("--cp",), "c: context-parallel ranks, each holding s/c of every sequence.", ESTIMATES,
         default=1, value_type=NUM, metavar="C"),
    _opt("cp_impl", ("--cp-impl",), "How attention exchanges K/V across the CP ranks: ring, allgather "
         "or ulysses.", ESTIMATES, value_type=OPT_STR,
         default_help="the framework's: megatron ring, fsdp2 allgather, deepspeed ulysses"),
    _opt("tp_across_nodes", ("--tp-across-nodes",), "Allow a TP group to span nodes.", ESTIMATES,
         default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("overlap_grad_reduce", ("--overlap-grad-reduce",),
         "Megatron-LM's --overlap-grad-reduce: gradients reduced in buckets of max(40M, 1M·dp) parameters "
         "as backward produces them, beside the rest of backward.", frozenset({COMM}), default=False,
         kind=Kind.FLAG, value_type=BOOL),
    _opt("overlap_param_gather", ("--overlap-param-gather",),
         "Megatron-LM's --overlap-param-gather (zero1, with --overlap-grad-reduce): the updated parameters "
         "gathered bucket by bucket in the next forward, one bucket ahead.", frozenset({COMM}),
         default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("overlap_comm", ("--overlap-comm",),
         "DeepSpeed's overlap_comm (zero_optimization) for zero1/zero2: gradient buckets reduced on a "
         "stream of their own beside backward (on by default for zero3).", frozenset({COMM}), default=False,
         kind=Kind.FLAG, value_type=BOOL),
    _opt("tp_comm_overlap", ("--tp-comm-overlap",),
         "Megatron-LM's --tp-comm-overlap (with --sequence-parallel): Transformer Engine's userbuffers run "
         "each layer's TP all-gathers and reduce-scatters beside its GEMMs.", frozenset({COMM}),
         default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("async_tp", ("--async-tp",),
         "torchtitan's async TP (with --compile model and --tp 2 or more): torch's micro-pipelined TP runs "
         "each layer's TP all-gathers and reduce-scatters in pieces beside its matmuls.", frozenset({COMM}),
         default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("pp", ("--pp",), "p: pipeline stages, outermost (each a contiguous run of layers).", ESTIMATES,
         default=1, value_type=NUM, metavar="P"),
    _opt("vpp", ("--vpp",), "v: virtual stages (model chunks) per pipeline rank (interleaved 1F1B).",
         ESTIMATES, default=1, value_type=NUM, metavar="V"),
    _opt("pp_schedule", ("--pp-schedule",),
         "gpipe, 1f1b, interleaved-1f1b or zero-bubble (torch.distributed.pipelining class names and "
         "Megatron's interleaved accepted).", ESTIMATES, value_type=OPT_STR,
         default_help="1f1b, interleaved-1f1b with --vpp"),
    _opt("pp_first_stage_layers", ("--pp-first-stage-layers",),
         "Layers of the first pipeline stage; the other stages split the rest evenly (Megatron-LM's "
         "uneven split).", ESTIMATES, value_type=OPT_NUM, metavar="N",
         default_help="an even share"),
    _opt("pp_last_stage_layers", ("--pp-last-stage-layers",),
         "Layers of the last pipeline stage; the other stages split the rest evenly (Megatron-LM's "
         "uneven split).", ESTIMATES, value_type=OPT_NUM, metavar="N",
         default_help="an even share"),
    _opt("pp_stage_layers", ("--pp-stage-layers",),
         "Layers of each of the p·v virtual stages in pipeline order, a comma list (8,9,8,7): stage k is "
         "chunk k // p of rank k % p (Megatron-LM's pipeline layout order, torchtitan's looped stages); "
         "not with --pp-first-stage-layers or --pp-last-stage-layers.", ESTIMATES,
         value_type="str | list[int | str] | tuple[int | str, ...] | None", metavar="N,N,...",
         default_help="the first and last stage's layers and an even share"),
    _opt("ep", ("--ep",), "e: expert-parallel ranks, carved from dp × cp (MoE models).", ESTIMATES,
         default=1, value_type=NUM, metavar="E"),
    _opt("expert_tp", ("--expert-tp",),
         "ETP: ranks each routed expert is tensor-parallel over (Megatron-LM's "
         "expert_tensor_parallel_size), a divisor of --tp; below it the EP group takes ranks of the "
         "attention's TP group.", ESTIMATES, value_type=OPT_NUM, metavar="N",
         default_help="--tp (Megatron-LM core 0.20's default)"),
    _opt("tp", ("--tp",), "Tensor-parallel degrees searched: a comma list (1,2,4,8) or auto (every "
         "divisor of the node that divides the heads).", frozenset({PLAN}), value_type=LIST,
         default_help="1"),
    _opt("cp", ("--cp",), "Context-parallel degrees searched: a comma list or auto.", frozenset({PLAN}),
         value_type=LIST, default_help="1"),
    _opt("pp", ("--pp",), "Pipeline degrees searched: a comma list or auto (every divisor of the layers, "
         "and of the layers + 2 from 3: first and last stages one layer shorter).",
         frozenset({PLAN}), value_type=LIST, default_help="1"),
    _opt("vpp", ("--vpp",), "Virtual stages per pipeline rank searched: a comma list or auto.",
         frozenset({PLAN}), value_type=LIST, default_help="1"),
    _opt("ep", ("--ep",), "Expert-parallel degrees searched: a comma list or auto (MoE models).",
         frozenset({PLAN}), value_type=LIST, default_help="1"),
    _opt("fp8", ("--fp8",),
         "FP8 recipes searched: none, auto (none and every recipe the framework runs, its FP8 all-gather "
         "too where it has one), or a comma list (none,tensorwise).", frozenset({PLAN}), value_type=LIST,
         default="none"),
    _opt("loss", ("--loss",),
         "Losses searched: auto, or a comma list of full, chunked, fused-linear, shifted (each where the "
         "model code and the framework run it, as memory's --loss checks).", frozenset({PLAN}),
         value_type=LIST, default_help="auto with fine-tuning (full and the savers), full otherwise"),
    _opt("optimizer_in_backward", ("--optimizer-in-backward",),
         "The optimizer stepped in backward searched: on, off, or on,off (where the framework runs it, "
         "as memory's --optimizer-in-backward checks).", frozenset({PLAN}), value_type=LIST,
         default_help="on,off with fine-tuning, off otherwise"),
    _opt("sequence_parallel", ("--sequence-parallel",),
         "Sequence parallelism of the TP candidates: on, off, or on,off (both searched).", frozenset({PLAN}),
         value_type=LIST,
         default_help="on with TP where the model code runs it: megatron's, torchtitan's"),
    _opt("capacity_factor", ("--capacity-factor",),
         "Tokens a rank's E/e experts receive, as a multiple of the balanced k·b·s/c (routing imbalance; "
         "Megatron moe_expert_capacity_factor, DeepSpeed capacity_factor); needs --ep.", ESTIMATES,
         value_type=FLOAT, metavar="F", default_help="1.0: balanced routing"),
    _opt("gpu", ("--gpu",),
         "A GPU preset, e.g. h100-80gb (see `zerocalc presets list gpus`), or a GPU TOML file of the "
         "presets' schema (`zerocalc presets show h100-80gb --toml` is one to start from).",
         ESTIMATES | {PLAN}, value_type=OPT_STR),
    _opt("gpu_memory", ("--gpu-memory",),
         "Memory of one GPU as PyTorch sees it, e.g. 24GiB, instead of --gpu: adds fits/headroom; the "
         "GPU's other figures (context; plan: compute and links) are then the h100-80gb's.",
         frozenset({MEMORY, PLAN}), value_type=OPT_NUM),
    _opt("reserve", ("--reserve", "--overhead"),
         "Held outside the caching allocator at world size 1: CUDA context, kernels, NCCL.",
         frozenset({MEMORY}), value_type=OPT_NUM,
         default_help="the GPU preset's, 1.30 GiB measured on the H100"),
    # ---------------------------------------------------------------------------------- the job
    _opt("strategies", ("--strategy", "-s"),
         "all, or a comma list of ddp, zero1, zero2, shard_grad_op, zero3, hybrid_shard "
         "(FSDP names such as no_shard, full_shard, hybrid are aliases).",
         ESTIMATES, value_type=LIST, default_help="all"),
    _opt("framework", ("--framework",),
         "Accounting to follow: paper, deepspeed (its estimators), megatron, or what PyTorch really "
         "allocates: fsdp, fsdp2, torch-zero1, ddp.",
         ESTIMATES, default="paper", value_type=STR),
    _opt("frameworks", ("--framework",),
         "all, or a comma list of paper, deepspeed, megatron, fsdp, fsdp2, torch-zero1, ddp.",
         frozenset({PLAN}), value_type=LIST, default_help="fsdp2,torch-zero1,deepspeed"),
    _opt("precision", ("--precision",), "bf16-mixed, fp16-mixed, fp32 or bf16-pure.", ESTIMATES,
         default="bf16-mixed", value_type=STR),
    _opt("optimizer", ("--optimizer",), "adam, adamw, sgd (momentum), sgd-no-momentum, adafactor, adam-8bit "
         "(adamw-8bit), paged-adamw-8bit or paged-adamw (bitsandbytes; the paged ones tensor by tensor: "
         "fine-tuning runs).",
         ESTIMATES, default="adamw", value_type=STR),
    _opt("fp32_grad_accum", ("--fp32-grad-accum",),
         "Add a 4-byte fp32 buffer per parameter where gradients accumulate.", frozenset({MEMORY}),
         default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("init", ("--init",),
         "How the model is created: meta (sharded, then each shard initialised; DeepSpeed zero.Init), gpu "
         "(whole in fp32 on every GPU, then sharded) or cpu (on the host, then moved).",
         frozenset({MEMORY, PLAN}), value_type=OPT_STR,
         default_help="the framework's documented path; fsdp2: meta"),
    _opt("offload_optimizer", ("--offload-optimizer",), "none, cpu or nvme (ZeRO-Offload / ZeRO-Infinity).",
         ESTIMATES, default="none", value_type=OPT_STR),
    _opt("offload_params", ("--offload-params",), "none, cpu or nvme (zero3 only; fsdp and fsdp2 "
         "fine-tuning: cpu, FSDP's CPU offload of parameters, gradients and optimizer).", ESTIMATES,
         default="none", value_type=OPT_STR),
    _opt("reduce_dtype", ("--reduce-dtype",),
         "The dtype gradients are reduced in: fp32, or the gradients' own (bf16 under bf16-mixed, fp16 "
         "under fp16-mixed).", ESTIMATES, value_type=OPT_STR, default_help="the gradient dtype"),
    # FP8 training (zerocalc.request.fp8 parses these into one Fp8Setting)
    _opt("fp8", ("--fp8",),
         "FP8 recipe: none; torchao's tensorwise, rowwise, rowwise-gw-hp (fsdp2); "
         "Transformer Engine's delayed, current, blockwise, mxfp8 (megatron).", ESTIMATES,
         default="none", value_type=STR),
    _opt("fp8_all_gather", ("--fp8-all-gather",),
         "All-gather the FP8 weights in FP8 (FSDP2 float8 all-gather, tensorwise; Megatron-LM "
         "--fp8-param-gather).", ESTIMATES, kind=Kind.SWITCH, value_type="bool | None",
         negative="--no-fp8-all-gather", default_help="off"),
    _opt("fp8_precompute_scales", ("--fp8-precompute-scales",),
         "With --fp8-all-gather under fsdp2: every weight's FP8 scale in one all-reduce after the "
         "optimizer step (torchao's precomputed dynamic scales).", ESTIMATES, default=False,
         kind=Kind.FLAG, value_type=BOOL),
    _opt("fp8_model_init", ("--fp8-model-init",),
         "Keep only the FP8 weights, no high-precision copy (Transformer Engine quantized_model_init).",
         ESTIMATES, default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("fp8_skip", ("--fp8-skip",),
         "Modules left in high precision, a comma list matched inside each module's name, zerocalc's or "
         "torchtitan's (output, attention.wq; torchtitan filter_fqns).", ESTIMATES, value_type=LIST,
         metavar="MODULES", default_help="none (megatron: output)"),
    # ---------------------------------------------------------------------------------- the step
    _opt("seq_len", ("--seq-len",),
         "s: tokens per sequence, 4096 or 8k (k = 1,024, M = 1,048,576: 8k = 8,192); activations need "
         "--model.",
         ESTIMATES | {PLAN}, value_type=OPT_NUM,
         default_help="2048, or the model's learned positions where fewer"),
    _opt("micro_batch", ("--micro-batch",), "b: sequences per micro-batch per GPU.", ESTIMATES,
         default=1, value_type=NUM),
    _opt("grad_accum", ("--grad-accum", "-A"), "A: micro-batches per optimizer step.", ESTIMATES,
         default=1, value_type=NUM),
    _opt("grad_sync", ("--grad-sync",),
         "every or last: gradients reduced every micro-batch, or only the last (no_sync; FSDP2: requires "
         "gradient sync off).", ESTIMATES, value_type=OPT_STR,
         default_help="each framework's; PyTorch: every"),
    _opt("zeropp", ("--zeropp",), "DeepSpeed ZeRO++ for zero3: all, or a comma list of qwz, hpz, qgz.",
         ESTIMATES, value_type=LIST),
    _opt("recompute", ("--recompute",),
         "Activation recomputation: none, selective, full, or op (torchtitan's selective_ac_option = "
         "\"op\": saves every other matmul's and the attention kernel's outputs); auto: full where PEFT's "
         "k-bit preparation checkpoints (--quantize with --kbit-prepare), else none.",
         ESTIMATES, default="auto", value_type=STR),
    _opt("checkpoint_every", ("--checkpoint-every",),
         "With --recompute full: only every N-th layer checkpointed (the N-th, the 2N-th and so on), the "
         "others keep their activations (torchtitan's selective_ac_option N).",
         ESTIMATES, default=1, value_type=NUM, metavar="N"),
    _opt("loss", ("--loss",),
         "The cross-entropy: full (the model code's, on the whole logits), chunked (torchtune's "
         "CEWithChunkedOutputLoss: the logits in chunks, one upcast at a time), fused-linear (Liger "
         "Kernel's fused linear cross-entropy: head and loss fused per chunk of tokens, no logits) or "
         "shifted (transformers 4.36-4.45's: fp32 logits in the output, a shifted fp32 copy).",
         ESTIMATES, default="full", value_type=STR),
    _opt("loss_chunks", ("--loss-chunks",),
         "With --loss chunked: the output chunks (num_output_chunks).", ESTIMATES, value_type=OPT_NUM,
         metavar="N", default_help="torchtune's 8"),
    _opt("keep_output", ("--keep-output",),
         "How long the training loop holds the model's output (its logits): none (only the loss: "
         "transformers' Trainer, torchtune, torchtitan), step (to the end of the micro-batch's backward and "
         "step, then dropped) or next (until the next forward returns: `outputs = model(**batch); "
         "loss = outputs.loss; loss.backward()` in a loop).",
         ESTIMATES, default="none", value_type=STR),
    _opt("compile", ("--compile",),
         "torch.compile (Inductor): none, model (torchtitan: each transformer block; hf: the whole forward, "
         "its loss included), loss (torchtitan's loss function) or model,loss (torchtitan's default "
         "compile.components); fused kernels change what the step saves and how long it takes.",
         ALL_ESTIMATES, default="none", value_type=STR),
    _opt("flash_attention", ("--flash-attention",), "Flash attention (no s² terms).", ALL_ESTIMATES,
         kind=Kind.SWITCH, value_type="bool | None", negative="--no-flash-attention",
         default_help="the model code's: SDPA's flash kernel for every transformers family, eager without "
         "one (GPT-3)"),
    _opt("model_impl", ("--model-impl",),
         "The model's code: hf (transformers 5.17), megatron (fused kernels), torchtitan; --framework "
         "megatron runs megatron's.",
         ALL_ESTIMATES, default="hf", value_type=STR),
    _opt("optimizer_impl", ("--optimizer-impl",),
         "torch.optim Adam implementation: foreach, fused or for-loop.",
         ESTIMATES, default="foreach", value_type=STR),
    _opt("prefetch", ("--prefetch",), "ZeRO-3/FSDP units gathered ahead of the current one.",
         frozenset({MEMORY}), default=1, value_type=NUM),
    _opt("wrap", ("--wrap",), "ZeRO-3/FSDP unit: block (one per layer) or model.", frozenset({MEMORY}),
         default="block", value_type=STR),
    _opt("ddp_bucket", ("--ddp-bucket",),
         "DDP's gradient bucket (DistributedDataParallel's bucket_cap_mb), a size with its unit: 25MiB.",
         ESTIMATES, value_type=OPT_NUM, default_help="25MiB, first bucket 1MiB"),
    _opt("reduce_bucket", ("--reduce-bucket",),
         "ZeRO-1/2 reduce bucket, elements (DeepSpeed's reduce_bucket_size): 5e8 or 500M (K, M, B: powers "
         "of 1,000).", ESTIMATES, default="5e8",
         value_type=NUM),
    _opt("allgather_bucket", ("--allgather-bucket",),
         "ZeRO-1/2 all-gather bucket, elements (DeepSpeed's allgather_bucket_size): 5e8 or 500M (K, M, B: "
         "powers of 1,000).", frozenset({MEMORY}),
         default="5e8", value_type=NUM),
    _opt("expandable_segments", ("--expandable-segments",),
         "The caching allocator with expandable segments on (a PyTorch allocator setting): its reserve.",
         frozenset({MEMORY}), default=False, kind=Kind.FLAG, value_type=BOOL),
    # ---------------------------------------------------------------------------------- fine-tuning
    _opt("optimizer_in_backward", ("--optimizer-in-backward",),
         "Each trained parameter's optimizer step as soon as its gradient is ready, the gradient freed "
         "then (torchtune's optimizer_in_bwd: register_optim_in_bwd_hooks).", ESTIMATES, default=False,
         kind=Kind.FLAG, value_type=BOOL),
    _opt("offload_activations", ("--offload-activations",),
         "Saved activations of the model's forward moved to pinned host memory and brought back in backward "
         "(torchtune's enable_activation_offloading: OffloadActivations, with streams); needs --recompute "
         "full.", frozenset({MEMORY}), default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("lora_rank", ("--lora-rank",),
         "LoRA of rank R on the targets (PEFT 0.21), the base frozen; 0: off.", FINETUNE,
         value_type=OPT_NUM, metavar="R", default_help="0: full training, or --adapter-config's r"),
    _opt("lora_alpha", ("--lora-alpha",), "lora_alpha: scales the update (no byte depends on it).",
         FINETUNE, value_type=FLOAT, metavar="A", default_help="PEFT's 8"),
    _opt("lora_targets", ("--lora-targets",),
         "all-linear (every Linear but the LM head), or a comma list of PEFT module names (q_proj,v_proj).",
         FINETUNE, value_type=LIST, metavar="NAMES", default_help="PEFT's for the model family"),
    _opt("lora_dropout", ("--lora-dropout",), "lora_dropout P, 0 ≤ P < 1.", FINETUNE, value_type=FLOAT,
         metavar="P", default_help="0"),
    _opt("dora", ("--dora",), "DoRA (use_dora): a magnitude vector per adapted layer.", FINETUNE,
         default=False, kind=Kind.FLAG, value_type=BOOL),
    _opt("autocast_adapter_dtype", ("--autocast-adapter-dtype",),
         "LoRA: PEFT's adapters upcast to fp32 on a 16-bit base (get_peft_model's autocast_adapter_dtype, "
         "PEFT ≥ 0.12); --no-autocast-adapter-dtype: in the base's dtype, as PEFT before 0.12 made them.",
         FINETUNE, kind=Kind.SWITCH, value_type="bool | None", negative="--no-autocast-adapter-dtype",
         default_help="on"),
    _opt("modules_to_save", ("--modules-to-save",),
         "Modules trained in full beside the adapters (a trainable copy each), a comma list: lm_head.",
         FINETUNE, value_type=LIST, metavar="NAMES"),
    _opt("quantize", ("--quantize",),
         "The frozen base's weights stored by bitsandbytes 0.50: none, nf4, fp4 (4-bit) or int8 (LLM.int8).",
         FINETUNE, value_type=OPT_STR, default_help="config.json's quantization_config, else none"),
    _opt("double_quant", ("--double-quant",),
         "4-bit: the absmax values quantised again (bnb_4bit_use_double_quant).", FINETUNE,
         kind=Kind.SWITCH, value_type="bool | None", negative="--no-double-quant",
         default_help="config.json's, else off (BitsAndBytesConfig's)"),
    _opt("quant_storage", ("--quant-storage",),
         "4-bit: the packed data's dtype (bnb_4bit_quant_storage): uint8, int8, bf16, fp16 or fp32; bf16 for "
         "FSDP.", FINETUNE, value_type=OPT_STR, default_help="config.json's, else uint8"),
    _opt("kbit_prepare", ("--kbit-prepare",),
         "With --quantize: PEFT's k-bit training preparation, every other parameter cast to fp32 "
         "(peft/utils/other.py).",
         FINETUNE, kind=Kind.SWITCH, value_type="bool | None", negative="--no-kbit-prepare",
         default_help="on"),
    _opt("freeze", ("--freeze",),
         "Full fine-tuning with these modules frozen, a comma list of names (embed_tokens,layers.0).",
         FINETUNE, value_type=LIST, metavar="NAMES"),
    _opt("adapter_config", ("--adapter-config",),
         "A PEFT adapter_config.json (LoRA): its r, targets, dropout, DoRA, modules_to_save (flags override "
         "it).", FINETUNE, value_type=OPT_STR, metavar="FILE"),
    # ---------------------------------------------------------------------------------- the links
    _opt("calibration", ("--calibration",), "A calibration JSON written by `zerocalc bench`.",
         frozenset({COMM, PLAN}), value_type="str | Calibration | None"),
    _opt("compute_calibration", ("--compute-calibration",),
         "A compute table written by `zerocalc bench --compute` for the step time (else the GPU preset's).",
         frozenset({COMM, PLAN}), value_type=OPT_STR, metavar="FILE"),
    _opt("intra_node_bw", ("--intra-node-bw",), "Bus bandwidth per GPU inside a node, e.g. 450GB/s.",
         frozenset({COMM}), value_type=FLOAT),
    _opt("inter_node_bw", ("--inter-node-bw",), "Bus bandwidth per GPU across nodes, e.g. 50GB/s.",
         frozenset({COMM}), value_type=FLOAT),
    _opt("latency", ("--latency",), "Latency α per collective: 20us, 0.05ms, 2e-5 (s).", frozenset({COMM}),
         value_type=FLOAT, default_help="20us"),
    _opt("tokens_per_step", ("--tokens-per-step",),
         "T: tokens per optimizer step (all GPUs), e.g. 4M (k = 1,024, M = 1,048,576: 4M = 4,194,304).",
         frozenset({COMM}), value_type=OPT_NUM),
    _opt("tflops", ("--tflops",), "F: achieved TFLOP/s per GPU, e.g. 400.", frozenset({COMM}),
         value_type=FLOAT),
    # ---------------------------------------------------------------------------------- the search
    _opt("global_batch", ("--global-batch", "-B"),
         "Per optimizer step: tokens (4194304, or 4M with k = 1,024, M = 1,048,576; a multiple of "
         "--seq-len) or sequences (512seq, 2kseq = 2,048). b × A × N equals it exactly.", frozenset({PLAN}),
         value_type=OPT_NUM),
    _opt("objective", ("--objective",), "time (shortest step), gpus (fewest GPUs) or memory (lowest peak).",
         frozenset({PLAN}), default="time", value_type=STR),
    _opt("top", ("--top", "-k"), "K: configurations shown.", frozenset({PLAN}), default=5, value_type=NUM),
    # ---------------------------------------------------------------------------------- launch configs
    _opt("deepspeed", ("--deepspeed",),
         "A DeepSpeed ds_config.json: its ZeRO stage, offload, buckets, batch, precision, ZeRO++ (flags "
         "override it).", ESTIMATES, value_type=OPT_STR, request=False),
    _opt("torchtitan", ("--torchtitan",),
         "A torchtitan job TOML: its degrees, local batch, seq len, checkpointing, reshard (flags override "
         "it).", ESTIMATES, value_type=OPT_STR, request=False),
    _opt("accelerate", ("--accelerate",),
         "An accelerate config (FSDP or DeepSpeed): processes, precision, sharding (flags override it).",
         ESTIMATES, value_type=OPT_STR, request=False),
    # ---------------------------------------------------------------------------------- the output
    _opt("units", ("--units", "-u"), "GiB, GB, MiB, MB, TiB, TB or B.", ESTIMATES | {PLAN}, default="GiB",
         value_type=STR, request=False),
    _opt("per_unit", ("--per-unit",), "One row per FSDP unit, DDP or DeepSpeed bucket, or broadcasting rank.",
         frozenset({COMM}), default=False, kind=Kind.FLAG, value_type=BOOL, request=False),
    _opt("timeline", ("--timeline",),
         "With --model: draw allocated and reserved memory over the step's events, per strategy.",
         frozenset({MEMORY}), default=False, kind=Kind.FLAG, value_type=BOOL, request=False),
    _opt("snapshot_out", ("--snapshot-out",),
         "With --model and one --strategy: write the predicted step as a PyTorch memory snapshot "
         "(python -m torch.cuda._memory_viz trace_plot FILE -o out.html draws it).",
         frozenset({MEMORY}), value_type=OPT_STR, request=False, metavar="FILE"),
    _opt("html", ("--html",),
         "Write the result's figures to FILE: one self-contained HTML page (plotly.js and the data inline, "
         "nothing loaded from the network; needs pip install 'zerocalc[html]'). memory: with --model.",
         ALL_ESTIMATES, value_type=OPT_STR, request=False, metavar="FILE"),
    _opt("json", ("--json",), "Print the result as JSON (exact integer bytes).", ESTIMATES | {PLAN},
         default=False, kind=Kind.FLAG, value_type=BOOL, request=False),
    _opt("all_candidates", ("--all-candidates",),
         "With --json: every candidate searched in candidates, not only the top rows (megabytes for a "
         "large search).", frozenset({PLAN}), default=False, kind=Kind.FLAG, value_type=BOOL,
         request=False),
)  # fmt: skip
"""Every option, in the order the commands list them."""


def options_for(command: Command, request_only: bool = False) -> tuple[Option, ...]:
    """The options ``command`` takes, in :data:`OPTIONS`' order."""
    return tuple(o for o in OPTIONS if command in o.commands and (o.request or not request_only))


def option(command: Command, name: str) -> Option:
    """The option ``name`` of ``command``."""
    for candidate in options_for(command):
        if candidate.name == name:
            return candidate
    raise KeyError(f"{command.value} has no option {name!r}")


def given(command: Command, name: str, value: object) -> bool:
    """Whether ``command``'s option ``name`` was given ``value``: unset is None; a flag's off is its
    default, a switch's off (``--no-kbit-prepare``) is given."""
    if value is None:
        return False
    return value is not False or option(command, name).kind is Kind.SWITCH


LAUNCH_CONFIGS: tuple[str, ...] = ("deepspeed", "torchtitan", "accelerate")
"""The options naming a launch configuration file, each read as the :class:`~zerocalc.request.launch.
LaunchFormat` of its name: not part of the request, what the file sets is."""


def library_options(command: Command) -> tuple[Option, ...]:
    """The keywords of ``command``'s library function: its request options and its launch configs."""
    return tuple(o for o in options_for(command) if o.request or o.name in LAUNCH_CONFIGS)


FLAGS: dict[str, str] = {o.name: o.flag for o in OPTIONS}
"""The flag each concept (``{gpus_per_node}``) is on the command line. A name means one flag in every
command that takes it (tests/cli/test_options.py)."""
NEGATIVE_FLAGS: dict[str, str] = {o.name: o.negative for o in OPTIONS if o.negative is not None}
"""A switch's negative flag by concept (``flash_attention`` → ``--no-flash-attention``); a message names
it ``{no_flash_attention}``."""


OptionsEcho = Annotated[
    dict[str, Any] | None,
    Field(
        default=None,
        description="every option of the command as given (its default where not given), keyed by the "
        "library's keyword: zerocalc.request.options.echo",
    ),
]
"""The ``options`` field of a command's result (:func:`echo`)."""


FINETUNE_OPTIONS = (
    "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora", "autocast_adapter_dtype",
    "modules_to_save", "quantize", "double_quant", "quant_storage", "kbit_prepare", "freeze",
    "adapter_config",
)  # fmt: skip
"""The fine-tuning options, echoed only where one is set: a full training run's echo holds none."""
LORA_FIELDS = (
    "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora", "autocast_adapter_dtype",
    "modules_to_save",
)  # fmt: skip
"""The options that describe LoRA (each needs ``lora_rank`` or ``adapter_config``)."""


SAVER_OPTIONS = ("loss", "loss_chunks", "optimizer_in_backward", "offload_activations")
"""The memory savers of fine-tuning recipes, echoed only where one is set off its default: a run without
them echoes none (its JSON as before they existed)."""
LOOP_OPTIONS = ("keep_output",)
"""What the training loop holds, echoed only where set off its default, as the savers."""
KERNEL_OPTIONS = ("compile", "async_tp")
"""How the step's kernels are built (torch.compile, and its micro-pipelined TP), echoed only where set off
their defaults, as the savers."""
_ECHOED_WHERE_SET = (SAVER_OPTIONS, LOOP_OPTIONS, KERNEL_OPTIONS)


def echo(command: Command, values: dict[str, Any]) -> dict[str, Any]:
    """The JSON's ``options``: every request option of ``command`` with the value it was given (its
    default where not given), keyed by its keyword, as the library takes it back; the fine-tuning options
    (:data:`FINETUNE_OPTIONS`) only in a fine-tuning run's, the savers (:data:`SAVER_OPTIONS`), the
    loop's (:data:`LOOP_OPTIONS`) and the kernels' (:data:`KERNEL_OPTIONS`) only where one of them is set."""
    echoed = {}
    tuning = any(values.get(name) not in (None, False) for name in FINETUNE_OPTIONS)
    options = options_for(command, request_only=True)
    defaults = {o.name: o.default for o in options}  # the command's own (plan's --loss is not memory's)

    def at_default(name: str) -> bool:
        value = values.get(name)
        return name not in defaults or value is None or str(value) == str(defaults[name])

    unset = {name for group in _ECHOED_WHERE_SET if all(map(at_default, group)) for name in group}
    for o in options:
        if (o.name in FINETUNE_OPTIONS and not tuning) or o.name in unset:
            continue
        value = values.get(o.name, o.default)
        if value is not None and o.default is not None and str(value) == str(o.default):
            value = o.default  # the CLI's text of the default is the default
        if o.name == "model" and value is not None and not isinstance(value, str):
            value = getattr(value, "name", str(value))
        if o.name == "calibration" and value is not None and not isinstance(value, str):
            value = values.get("calibration_name") or "(a Calibration object)"
        if isinstance(value, tuple):
            value = list(value)
        echoed[o.name] = _typed(o, value)
    return echoed


def _typed(o: Option, value: Any) -> Any:
    """A number typed as text (the CLI's ``--gpus 8``) as the number it is (``8``), where the option takes
    numbers: the JSON echoes what the library would be given, not the shell's string."""
    if not isinstance(value, str):
        return value
    text = value.strip().replace("_", "")
    if "int" in o.value_type and _WHOLE.fullmatch(text):
        return int(text)
    if "float" in o.value_type and _DECIMAL.fullmatch(text):
        return float(text)
    return value


_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def as_given(
    result: Any, command: Command, options: dict[str, Any], name_of: Any, notes: list[str] | None = None
) -> Any:
    """A ``command`` result as its caller reads it: its notes naming inputs with ``name_of`` (flags for the
    CLI, keywords for the library: :func:`~zerocalc.base.errors.with_names`), the options it was given
    (:func:`echo`) and the launch configs' ``notes`` after its own."""
    from zerocalc.base.errors import with_names

    named = with_names(result, name_of)
    return named.model_copy(
        update={"options": echo(command, options), "notes": [*named.notes, *(notes or [])]}
    )
