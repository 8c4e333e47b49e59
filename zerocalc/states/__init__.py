"""Model states per GPU, each fact defined once: the papers' accounting (`memory`: bytes per parameter of
each state under a precision recipe and optimizer, and how each strategy shards them), Megatron-LM's
(`megatron`, from the same states), what PyTorch's frameworks allocate per rank (`framework`: FSDP1's flat
parameters, FSDP2's dim-0 rows, ZeroRedundancyOptimizer's partition) and DeepSpeed's own estimators
(`deepspeed`)."""
