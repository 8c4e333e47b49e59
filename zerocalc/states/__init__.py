"""Model states per GPU: the papers' accounting (`memory`), what PyTorch's frameworks allocate
per rank (`framework`) and DeepSpeed's own estimators (`deepspeed`)."""
