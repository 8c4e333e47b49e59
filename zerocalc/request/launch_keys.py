"""Every key of the three launch formats, sorted once: *modelled*, *harmless* or *refused*.

* **modelled**: :mod:`zerocalc.request.launch` reads it into an option (``zero_optimization.stage`` →
  ``--strategy``), or checks it against what zerocalc models (``overlap_comm`` at its stage's default);
* **harmless**: it has no bearing on memory, communication or step time per step (logging, paths, the
  learning rate and its schedule, steps, seeds, checkpoint files, the launcher's addresses), listed in a
  note;
* **refused**: it changes the numbers in a way zerocalc does not model; a file that sets it to anything but
  its *inert* values (the framework's default, which is what zerocalc models) is refused in one line naming
  the key. A key none of these tables names is refused too: never silently ignored.

A table maps a dotted key (``zero_optimization.offload_param.device``) to its :class:`KeyRule`; a key ending
in ``.*`` stands for every key under it (``tensorboard.*``), the longest such prefix deciding. One table per
format, each naming the version its keys are read from.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, NamedTuple

from zerocalc.base.errors import InputError


class Sort(StrEnum):
    MODELLED = "modelled"
    HARMLESS = "harmless"
    REFUSED = "refused"


class KeyRule(NamedTuple):
    sort: Sort
    why: str = ""
    """Harmless: what the key is about; refused: what it changes that zerocalc does not model."""
    inert: tuple[Any, ...] = ()
    """Refused keys: the values at which the key changes nothing (its default), accepted."""


class KeyTable(NamedTuple):
    name: str
    """What a key of this format is, with its article (``a ds_config key``)."""
    source: str
    """Where the keys are defined: the framework, its version and files."""
    rules: dict[str, KeyRule]


MODELLED = KeyRule(Sort.MODELLED)


def harmless(why: str) -> KeyRule:
    return KeyRule(Sort.HARMLESS, why)


def refused(why: str, *inert: Any) -> KeyRule:
    return KeyRule(Sort.REFUSED, why, inert)


LOGGING = harmless("logging, profiling and monitoring")
PATHS = harmless("a path or a name")
SCHEDULE = harmless("the learning rate, its schedule and the optimizer's hyper-parameters")
STEPS = harmless("steps and seeds")
CHECKPOINTS = harmless("checkpoint files")
LAUNCHER = harmless("the launcher: hosts, ports, ranks, timeouts")


# --------------------------------------------------------------------------------------------- DeepSpeed
_DS = "DeepSpeed 0.19.8"
_Z = "zero_optimization."
DEEPSPEED_KEYS = KeyTable(
    name="a ds_config key",
    source=f"{_DS} deepspeed/runtime/config.py, constants.py, precision_config.py, zero/config.py, "
    "zero/offload_config.py",
    rules={
        # read by zerocalc.request.launch_deepspeed.deepspeed_config
        **dict.fromkeys(
            (
                "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps",
                "train_batch_size",
                "bf16.enabled",
                "bfloat16.enabled",
                "fp16.enabled",
                "communication_data_type",
                "optimizer.type",
                f"{_Z}stage",
                f"{_Z}offload_optimizer.device",
                f"{_Z}offload_param.device",
                f"{_Z}reduce_bucket_size",
                f"{_Z}allgather_bucket_size",
                f"{_Z}zero_quantized_weights",
                f"{_Z}zero_hpz_partition_size",
                f"{_Z}zero_quantized_gradients",
                f"{_Z}overlap_comm",
            ),
            MODELLED,
        ),
        "steps_per_print": LOGGING,
        "wall_clock_breakdown": LOGGING,
        "memory_breakdown": LOGGING,
        "dump_state": LOGGING,
        "log_level": LOGGING,
        "flops_profiler.*": LOGGING,
        "tensorboard.*": LOGGING,
        "wandb.*": LOGGING,
        "csv_monitor.*": LOGGING,
        "comet.*": LOGGING,
        "comms_logger.*": LOGGING,
        "timers.*": LOGGING,
        "optimizer.params.*": SCHEDULE,
        "optimizer.params.amsgrad": refused("AMSGrad keeps a third state per parameter", False),
        "optimizer.legacy_fusion": harmless("the fp16 optimizer's fused kernel (the same states)"),
        "scheduler.*": SCHEDULE,
        "gradient_clipping": harmless("gradient clipping (a norm, the gradients' bytes unchanged)"),
        "prescale_gradients": harmless("where gradients are divided by the world (the same bytes)"),
        "gradient_predivide_factor": harmless("where gradients are divided by the world (the same bytes)"),
        "gradient_allreduce_op": harmless("mean or sum of the reduction (the same bytes)"),
        "zero_allow_untested_optimizer": harmless("a check on the client's optimizer"),
        "zero_force_ds_cpu_optimizer": harmless("a check on the offload optimizer"),
        "dataloader_drop_last": harmless("the data loader"),
        "disable_python_gc": harmless("Python's garbage collector"),
        "vocabulary_size": harmless("read by curriculum learning only (refused)"),
        "checkpoint.*": CHECKPOINTS,
        "nebula.*": CHECKPOINTS,
        "datastates.*": CHECKPOINTS,
        "aio.*": harmless("NVMe I/O queues (the NVMe rate is zerocalc's stated assumption)"),
        "fp16.loss_scale": harmless("loss scaling"),
        "fp16.initial_scale_power": harmless("loss scaling"),
        "fp16.loss_scale_window": harmless("loss scaling"),
        "fp16.hysteresis": harmless("loss scaling"),
        "fp16.consecutive_hysteresis": harmless("loss scaling"),
        "fp16.min_loss_scale": harmless("loss scaling"),
        "fp16.auto_cast": refused("casting the model's inputs to fp16", False),
        "fp16.fp16_master_weights_and_grads": refused("fp16 master weights and gradients", False),
        **{
            f"{section}.{key}": rule
            for section in ("bf16", "bfloat16")
            for key, rule in (
                ("check_grad_overflow", harmless("an overflow check (a flag reduced)")),
                ("immediate_grad_update", refused("the BF16 optimizer's gradient update in backward", False)),
                ("bf16_master_weights_and_grads", refused("bf16 master weights and gradients", False)),
                ("bf16_optimizer_states", refused("bf16 optimizer states", False)),
            )
        },
        "torch_autocast.enabled": refused("torch.autocast in place of DeepSpeed's mixed precision", False),
        "torch_autocast.*": harmless("read only with torch_autocast.enabled (refused)"),
        "amp.enabled": refused("NVIDIA Apex AMP", False),
        "amp.*": harmless("read only with amp.enabled (refused)"),
        "data_types.grad_accum_dtype": refused("the gradient accumulation dtype", None),
        "data_types.param_dtype": refused("the parameters' dtype", None),
        "data_types.buffer_dtype": refused("the buffers' dtype", None),
        "data_types.keep_in_fp32_modules": refused("modules kept in fp32", "auto"),
        "seq_parallel_communication_data_type": harmless("read only with sequence parallelism (refused)"),
        "sequence_parallel_size": refused("DeepSpeed-Ulysses sequence parallelism via ds_config", 1),
        "disable_allgather": refused("broadcasts in place of all-gathers", False),
        "sparse_gradients": refused("sparse embedding gradients", False),
        "managed_gradient_accumulation": refused("the client stepping every micro-batch", True),
        "use_data_before_expert_parallelism": refused("the expert and data-parallel groups' order", False),
        "activation_checkpointing.partition_activations": refused(
            "DeepSpeed's activation checkpointing, deepspeed.checkpointing", False
        ),
        "activation_checkpointing.contiguous_memory_optimization": refused(
            "DeepSpeed's activation checkpointing, deepspeed.checkpointing", False
        ),
        "activation_checkpointing.cpu_checkpointing": refused(
            "DeepSpeed's activation checkpointing, deepspeed.checkpointing", False
        ),
        "activation_checkpointing.*": harmless("DeepSpeed's activation checkpointing's bookkeeping"),
        "pipeline.*": refused("DeepSpeed's pipeline engine, PipelineModule"),
        "sparse_attention.*": refused("DeepSpeed's sparse attention"),
        "progressive_layer_drop.enabled": refused("progressive layer dropping", False),
        "progressive_layer_drop.*": harmless("read only with progressive_layer_drop.enabled (refused)"),
        "eigenvalue.enabled": refused("eigenvalue computation between steps", False),
        "eigenvalue.*": harmless("read only with eigenvalue.enabled (refused)"),
        "quantize_training.enabled": refused("quantized training, MoQ", False),
        "quantize_training.*": harmless("read only with quantize_training.enabled (refused)"),
        "curriculum_learning.enabled": refused("curriculum learning: the sequence length varies", False),
        "curriculum_learning.*": harmless("read only with curriculum_learning.enabled (refused)"),
        "data_efficiency.enabled": refused("data efficiency: sampling and routing change the batch", False),
        "data_efficiency.*": harmless("read only with data_efficiency.enabled (refused)"),
        "compression_training.*": refused("compression training"),
        "elasticity.enabled": refused("elastic training: the batch follows the GPUs", False),
        "elasticity.*": harmless("read only with elasticity.enabled (refused)"),
        "autotuning.enabled": refused("the autotuner: it runs other configurations", False),
        "autotuning.*": harmless("read only with autotuning.enabled (refused)"),
        "hybrid_engine.enabled": refused("the hybrid (RLHF) engine", False),
        "hybrid_engine.*": harmless("read only with hybrid_engine.enabled (refused)"),
        "weight_quantization.*": refused("weight quantization"),
        "compile.*": refused("DeepSpeed's compiler passes, DeepCompile"),
        "tensor_parallel.*": refused("DeepSpeed AutoTP: give --tp with a framework that models it"),
        "expert_parallel.*": refused("DeepSpeed AutoEP: give --ep with a framework that models it"),
        # zero_optimization (DeepSpeedZeroConfig, populate_by_name: a field's name or its alias)
        f"{_Z}contiguous_gradients": refused("gradients not copied to a contiguous buffer", True),
        f"{_Z}reduce_scatter": refused("all-reduce in place of reduce-scatter", True),
        f"{_Z}use_multi_rank_bucket_allreduce": refused("one all-reduce of several ranks' buckets", True),
        f"{_Z}allgather_partitions": refused("broadcasts in place of the partitions' all-gather", True),
        f"{_Z}compute_grad_norm": harmless("the gradient norm (one scalar reduced)"),
        f"{_Z}load_from_fp32_weights": CHECKPOINTS,
        f"{_Z}elastic_checkpoint": CHECKPOINTS,
        f"{_Z}sub_group_size": refused("the ZeRO-3 optimizer step in other sub-groups", 10**9),
        f"{_Z}cpu_offload": refused("the deprecated offload switch: give offload_optimizer.device", False),
        f"{_Z}cpu_offload_param": refused("the deprecated offload switch: give offload_param.device", False),
        f"{_Z}cpu_offload_use_pin_memory": harmless("pinned host memory (the same bytes)"),
        **{
            f"{_Z}{name}": rule
            for names, rule in (
                (
                    ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
                    refused("ZeRO-3 prefetching other than DeepSpeed's default", 5 * 10**7),
                ),
                (
                    ("stage3_param_persistence_threshold", "param_persistence_threshold"),
                    refused("which parameters stay gathered (zerocalc models the default)", 10**5),
                ),
                (
                    ("stage3_model_persistence_threshold", "model_persistence_threshold"),
                    refused("a cap on parameters that stay gathered", 2**63 - 1),
                ),
                (
                    ("stage3_max_live_parameters", "max_live_parameters"),
                    refused("a cap on gathered parameters", 10**9),
                ),
                (
                    ("stage3_max_reuse_distance", "max_reuse_distance"),
                    refused("parameters kept gathered for reuse", 10**9),
                ),
                (
                    ("stage3_module_granularity_threshold", "module_granularity_threshold"),
                    refused("ZeRO-3 leaf modules by size", 0),
                ),
                (
                    ("stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"),
                    refused("all-reduce in place of the parameters' all-gather", False),
                ),
                (
                    ("stage3_allgather_sequential", "allgather_sequential"),
                    refused("parameters gathered one by one", False),
                ),
                (
                    (
                        "stage3_gather_16bit_weights_on_model_save",
                        "gather_16bit_weights_on_model_save",
                        "stage3_gather_fp16_weights_on_model_save",
                    ),
                    CHECKPOINTS,
                ),
            )
            for name in names
        },
        f"{_Z}ignore_unused_parameters": harmless("a check on unused parameters"),
        f"{_Z}legacy_stage1": refused("DeepSpeed's legacy ZeRO-1", False),
        f"{_Z}round_robin_gradients": refused("gradients partitioned round robin", False),
        f"{_Z}parameter_alignment": refused("parameters aligned in their partitions", False),
        f"{_Z}zero_quantized_nontrainable_weights": refused("frozen weights quantized", False),
        f"{_Z}memory_efficient_linear": refused(
            "the linear layers without their memory-efficient autograd function", True
        ),
        f"{_Z}pipeline_loading_checkpoint": CHECKPOINTS,
        f"{_Z}override_module_apply": harmless("module.apply under zero.Init"),
        f"{_Z}log_trace_cache_warnings": LOGGING,
        f"{_Z}enable_sanity_checks": harmless("sanity checks"),
        f"{_Z}save_muon_momentum_buffer_in_memory": refused("the Muon optimizer", False),
        f"{_Z}leaf_module.*": refused("ZeRO-3 leaf modules, gathered whole"),
        f"{_Z}zenflow.*": refused("ZenFlow: stale gradients updated on the host"),
        f"{_Z}offload_optimizer.nvme_path": PATHS,
        f"{_Z}offload_optimizer.pin_memory": harmless("pinned host memory (the same bytes)"),
        f"{_Z}offload_optimizer.fast_init": harmless("how the offloaded optimizer is initialised"),
        f"{_Z}offload_optimizer.buffer_count": refused("NVMe swap buffers other than the default", 4),
        f"{_Z}offload_optimizer.pipeline_read": refused("NVMe reads overlapped with the step", False),
        f"{_Z}offload_optimizer.pipeline_write": refused("NVMe writes overlapped with the step", False),
        f"{_Z}offload_optimizer.ratio": refused("part of the optimizer offloaded", 1, 1.0),
        f"{_Z}offload_optimizer.super_offload": refused("SuperOffload", False),
        f"{_Z}offload_optimizer.cpuadam_cores_perc": harmless("the host cores CPU Adam runs on"),
        f"{_Z}offload_param.nvme_path": PATHS,
        f"{_Z}offload_param.pin_memory": harmless("pinned host memory (the same bytes)"),
        f"{_Z}offload_param.buffer_count": refused("NVMe parameter buffers other than the default", 5),
        f"{_Z}offload_param.buffer_size": refused("NVMe parameter buffers other than the default", 10**8),
        f"{_Z}offload_param.max_in_cpu": refused("parameters kept on the host other than the default", 10**9),
    },
)


# -------------------------------------------------------------------------------------------- torchtitan
_TT = "torchtitan v0.2.2 torchtitan/config/job_config.py (and v0.1.0 config_manager.py, commit 9dec370's)"
_AC_FORCE_DEFAULT = ["moe.router.gate"]
"""``ActivationCheckpoint.per_op_sac_force_recompute_mm_shapes_by_fqns``' default (v0.2.2)."""
TORCHTITAN_KEYS = KeyTable(
    name="a torchtitan job key",
    source=_TT,
    rules={
        # read by launch_torchtitan.torchtitan_config (the older layout's under their v0.2.2 names)
        **dict.fromkeys(
            (
                "model.name",
                "model.flavor",
                "optimizer.name",
                "optimizer.implementation",
                "optimizer.fused",
                "optimizer.early_step_in_backward",
                "training.local_batch_size",
                "training.global_batch_size",
                "training.seq_len",
                "training.mixed_precision_param",
                "training.mixed_precision_reduce",
                "activation_checkpoint.mode",
                "activation_checkpoint.selective_ac_option",
                "parallelism.data_parallel_shard_degree",
                "parallelism.data_parallel_replicate_degree",
                "parallelism.fsdp_reshard_after_forward",
                "parallelism.tensor_parallel_degree",
                "parallelism.context_parallel_degree",
                "parallelism.pipeline_parallel_degree",
                "parallelism.pipeline_parallel_schedule",
                "parallelism.pipeline_parallel_schedule_csv",
                "parallelism.pipeline_parallel_split_points",
                "parallelism.pipeline_parallel_microbatches",
                "parallelism.pipeline_parallel_microbatch_size",
                "parallelism.pipeline_parallel_layers_per_stage",
                "parallelism.pipeline_parallel_first_stage_less_layers",
                "parallelism.pipeline_parallel_last_stage_less_layers",
                "parallelism.module_fqns_per_model_part",
                "parallelism.expert_parallel_degree",
                "parallelism.expert_tensor_parallel_degree",
            ),
            MODELLED,
        ),
        "job.*": PATHS,
        "profiling.*": LOGGING,
        "metrics.*": LOGGING,
        "model.hf_assets_path": PATHS,
        "model.tokenizer_path": PATHS,
        "model.print_after_conversion": LOGGING,
        "model.norm_type": refused("a norm other than RMSNorm, 9dec370's norm_type", "rmsnorm"),
        "optimizer.lr": SCHEDULE,
        "optimizer.beta1": SCHEDULE,
        "optimizer.beta2": SCHEDULE,
        "optimizer.eps": SCHEDULE,
        "optimizer.weight_decay": SCHEDULE,
        "lr_scheduler.*": SCHEDULE,
        "training.dataset": PATHS,
        "training.dataset_path": PATHS,
        "training.dataloader.*": harmless("the data loader's host workers"),
        "training.max_norm": harmless("gradient clipping (a norm, the gradients' bytes unchanged)"),
        "training.steps": STEPS,
        "training.warmup_steps": SCHEDULE,
        "training.seed": STEPS,
        "training.deterministic": STEPS,
        "training.gc_freq": harmless("Python's garbage collector"),
        "training.gc_debug": harmless("Python's garbage collector"),
        "training.dtype": refused("bf16 training without fp32 master weights under FSDP2", "float32"),
        "training.enable_cpu_offload": refused("FSDP2's CPU offload, CPUOffloadPolicy", False),
        "training.compile": MODELLED,
        "training.debug_moe_force_load_balance": harmless("balanced routing, as zerocalc assumes"),
        "training.disable_loss_parallel": refused("the loss without loss parallelism", False),
        "parallelism.disable_loss_parallel": refused("the loss without loss parallelism", False),
        "parallelism.enable_async_tensor_parallel": MODELLED,
        "parallelism.enable_compiled_autograd": refused("compiled autograd", False),
        "parallelism.pipeline_parallel_expert_parallel_overlap": harmless("read by DualPipeV only (refused)"),
        "parallelism.context_parallel_rotate_method": refused("K/V rotated by all-to-all", "allgather"),
        "parallelism.context_parallel_load_balancer": refused("another CP load balancer", "headtail"),
        "parallelism.expert_parallel_comm_backend": refused("DeepEP's all-to-all", "standard"),
        "checkpoint.*": CHECKPOINTS,
        "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": refused(
            "other matmuls forced to recompute under op SAC", _AC_FORCE_DEFAULT
        ),
        "activation_checkpoint.early_stop": refused("recomputation stopped early", False),
        "activation_checkpoint.memory_budget": harmless("read only with mode memory_budget (refused)"),
        "activation_checkpoint.visualize_memory_budget_pareto": LOGGING,
        "activation_checkpoint.preserve_rng_state": harmless("the RNG state kept (a few bytes)"),
        "activation_checkpoint.determinism_check": harmless("a check on recomputation"),
        "activation_checkpoint.debug": LOGGING,
        # read by launch_torchtitan._titan_compile
        **dict.fromkeys(("compile.enable", "compile.components", "compile.backend"), MODELLED),
        # FP8 (v0.2.2 [quantize.linear.float8] and converter "quantize.linear.float8", v0.1.0 [float8] and
        # converter "float8"): read by launch_torchtitan._titan_fp8; MX and grouped-GEMM converters are
        # refused there, their settings read only by them
        **dict.fromkeys(
            (
                "model.converters",
                *(
                    f"{table}.{key}"
                    for table in ("quantize.linear.float8", "float8")
                    for key in (
                        "enable_fsdp_float8_all_gather",
                        "precompute_float8_dynamic_scale_for_fsdp",
                        "recipe_name",
                        "filter_fqns",
                    )
                ),
            ),
            MODELLED,
        ),
        **dict.fromkeys(
            ("quantize.linear.float8.emulate", "float8.emulate"),
            refused("emulated FP8 GEMMs (upcast, then a high-precision matmul)", False),
        ),
        "float8.force_recompute_fp8_weight_in_bwd": refused(
            "the FP8 weight recomputed in backward in place of the saved one", False
        ),
        "float8.enable_float8_linear": refused("9dec370's float8 switch (give model.converters)", False),
        "quantize.*": harmless("read only by an mx or grouped-GEMM converter (refused)"),
        "float8.*": harmless("read only by the float8 converter of 9dec370's layout (refused)"),
        "mx.*": harmless("read only by an mx converter (refused)"),
        "comm.*": LAUNCHER,
        "comm.mode": harmless("a test backend (fake_backend, local_tensor): what the real job allocates"),
        "memory_estimation.*": harmless("torchtitan's own memory estimation mode"),
        "fault_tolerance.enable": refused("torchft replica groups", False),
        "fault_tolerance.*": harmless("read only with fault_tolerance.enable (refused)"),
        "experimental.custom_import": PATHS,
        "experimental.custom_args_module": PATHS,
        "experimental.enable_async_tensor_parallel": MODELLED,
        "experimental.enable_compiled_autograd": refused("compiled autograd", False),
        "experimental.context_parallel_rotate_method": refused("K/V rotated by all-to-all", "allgather"),
        "validation.enable": refused("validation between steps: its forward peak is not modelled", False),
        "validation.*": harmless("read only with validation.enable (refused)"),
        "debug.seed": STEPS,
        "debug.deterministic": STEPS,
        "debug.deterministic_warn_only": STEPS,
        "debug.moe_force_load_balance": harmless("balanced routing, as zerocalc assumes"),
    },
)


# ------------------------------------------------------------------------------------------- accelerate
_FC = "fsdp_config."
_DC = "deepspeed_config."
_F8 = "fp8_config."
ACCELERATE_KEYS = KeyTable(
    name="an accelerate config key",
    source="accelerate 1.15.0 accelerate/commands/config/config_args.py (ClusterConfig), cluster.py, "
    "utils/dataclasses.py; fp8_config 1.16.0",
    rules={
        # read by zerocalc.request.launch_accelerate.accelerate_config
        **dict.fromkeys(
            (
                "distributed_type",
                "mixed_precision",
                "num_processes",
                "num_machines",
                f"{_FC}fsdp_version",
                f"{_FC}fsdp_sharding_strategy",
                f"{_FC}fsdp_reshard_after_forward",
                f"{_FC}fsdp_activation_checkpointing",
                f"{_FC}fsdp_offload_params",
                f"{_FC}fsdp_auto_wrap_policy",
                f"{_FC}fsdp_backward_prefetch",
                f"{_FC}fsdp_use_orig_params",
                f"{_FC}fsdp_cpu_ram_efficient_loading",
                f"{_DC}zero_stage",
                f"{_DC}offload_optimizer_device",
                f"{_DC}offload_param_device",
                f"{_DC}gradient_accumulation_steps",
                f"{_DC}zero3_init_flag",
                # read by launch_accelerate._accelerate_fp8 (accelerate 1.16.0 AORecipeKwargs)
                f"{_F8}backend",
                f"{_F8}enable_fsdp_float8_all_gather",
            ),
            MODELLED,
        ),
        f"{_F8}pad_inner_dim": harmless(
            "torchao pads a GEMM's inner dimension to a multiple of 16: the Linear layers accelerate "
            "converts have both already, so only the weight gradient's token dimension, transiently"
        ),
        # TERecipeKwargs (utils/dataclasses.py; cluster.py writes amax_history_length and
        # amax_compute_algorithm, which the launcher exports under names the recipe does not read) and
        # 1.15's MSAMPRecipeKwargs: read only by a backend zerocalc refuses
        **dict.fromkeys(
            (
                f"{_F8}{name}"
                for name in (
                    "use_autocast_during_eval",
                    "margin",
                    "interval",
                    "fp8_format",
                    "amax_history_len",
                    "amax_history_length",
                    "amax_compute_algo",
                    "amax_compute_algorithm",
                    "override_linear_precision",
                    "use_mxfp8_block_scaling",
                )
            ),
            harmless("read only by backend TE (refused)"),
        ),
        f"{_F8}opt_level": harmless("read only by backend MSAMP (refused)"),
        f"{_F8}optimization_level": harmless("read only by backend MSAMP (refused)"),
        "compute_environment": LAUNCHER,
        "machine_rank": LAUNCHER,
        "gpu_ids": LAUNCHER,
        "main_process_ip": LAUNCHER,
        "main_process_port": LAUNCHER,
        "rdzv_backend": LAUNCHER,
        "same_network": LAUNCHER,
        "main_training_function": LAUNCHER,
        "enable_cpu_affinity": LAUNCHER,
        "mpirun_config.*": LAUNCHER,
        "debug": LOGGING,
        "use_cpu": refused("training on the CPU", False),
        "downcast_bf16": harmless("TPU only"),
        "tpu_name": harmless("TPU only"),
        "tpu_zone": harmless("TPU only"),
        "tpu_use_cluster": harmless("TPU only"),
        "tpu_use_sudo": harmless("TPU only"),
        "tpu_vm": harmless("TPU only"),
        "tpu_env": harmless("TPU only"),
        "command_file": harmless("TPU only"),
        "commands": harmless("TPU only"),
        "fp16": refused("the old fp16 switch: give mixed_precision", False),
        # read by launch_accelerate._accelerate_compile
        **dict.fromkeys(
            (
                "dynamo_backend",
                "dynamo_config.dynamo_backend",
                "dynamo_config.dynamo_mode",
                "dynamo_config.dynamo_use_regional_compilation",
            ),
            MODELLED,
        ),
        "dynamo_config.*": harmless("dynamic shapes and full graphs: the same fused kernels to first order"),
        **{
            f"parallelism_config.parallelism_config_{size}_size": refused(
                f"accelerate's ParallelismConfig {size} degree: give --{flag}", 1
            )
            for size, flag in (("tp", "tp"), ("cp", "cp"), ("dp_replicate", "strategy hybrid_shard"))
        },
        "parallelism_config.parallelism_config_dp_shard_size": harmless(
            "the sharded data-parallel degree: the GPUs over the other degrees"
        ),
        "parallelism_config.parallelism_config_cp_comm_strategy": harmless(
            "read only with a CP degree (refused)"
        ),
        "megatron_lm_config.*": harmless("read only with distributed_type MEGATRON_LM (refused)"),
        f"{_FC}fsdp_transformer_layer_cls_to_wrap": harmless("the decoder block's class: a unit per block"),
        f"{_FC}fsdp_min_num_params": harmless("read only with SIZE_BASED_WRAP (refused)"),
        f"{_FC}fsdp_forward_prefetch": refused("FSDP1's forward prefetch", False),
        f"{_FC}fsdp_state_dict_type": CHECKPOINTS,
        f"{_FC}fsdp_sync_module_states": harmless("rank 0's weights broadcast at creation"),
        f"{_DC}gradient_clipping": harmless("gradient clipping (a norm, the gradients' bytes unchanged)"),
        f"{_DC}zero3_save_16bit_model": CHECKPOINTS,
        f"{_DC}offload_optimizer_nvme_path": PATHS,
        f"{_DC}offload_param_nvme_path": PATHS,
        f"{_DC}deepspeed_config_file": refused("a ds_config.json named here: give it as --deepspeed"),
        f"{_DC}deepspeed_multinode_launcher": LAUNCHER,
        f"{_DC}deepspeed_hostfile": LAUNCHER,
        f"{_DC}deepspeed_inclusion_filter": LAUNCHER,
        f"{_DC}deepspeed_exclusion_filter": LAUNCHER,
        f"{_DC}deepspeed_moe_layer_cls_names": refused("ZeRO-3 leaf modules, gathered whole"),
    },
)


def rule_of(table: KeyTable, key: str) -> KeyRule | None:
    """``key``'s rule: its own, else that of the longest ``prefix.*`` above it; None: not a key of the
    format."""
    if key in table.rules:
        return table.rules[key]
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        rule = table.rules.get(".".join(parts[:end]) + ".*")
        if rule is not None:
            return rule
    return None


def _same(value: Any, inert: Any) -> bool:
    """``value`` is ``inert`` as the file wrote it: a boolean only as a boolean (``1`` is not ``true``)."""
    if isinstance(value, bool) or isinstance(inert, bool):
        return type(value) is type(inert) and value == inert
    return value == inert


def shown_value(value: Any) -> str:
    """A value as the file's formats write it (``false``, ``[]``, ``"float8"``)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def sort_keys(flat: dict[str, Any], table: KeyTable, where: str) -> tuple[str, ...]:
    """The harmless keys of ``flat`` (a file's keys, dotted), sorted; an :class:`InputError` naming the first
    key that is not the format's or that is refused at its value."""
    harmless_keys: list[str] = []
    for key, value in flat.items():
        if value is None or value == {}:  # null, or an empty table: it sets nothing
            continue
        rule = rule_of(table, key)
        if rule is None:
            raise InputError(
                f"{where}: {key} is not {table.name} zerocalc knows ({table.source}); accepted: the keys "
                "docs/launch-configs.md lists"
            )
        if rule.sort is Sort.HARMLESS:
            harmless_keys.append(key)
        elif rule.sort is Sort.REFUSED and not any(_same(value, inert) for inert in rule.inert):
            accepted = " or ".join(shown_value(v) for v in rule.inert if v is not None)
            accepted = f"{accepted} (or leave it out)" if accepted else "leave it out"
            raise InputError(f"{where}: {key} {value!r} is not modelled ({rule.why}); accepted: {accepted}")
    return tuple(sorted(harmless_keys))
