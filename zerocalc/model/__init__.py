"""The model: architectures and their parameter tensors (`architecture`), Hugging Face config.json files
and the family records (`hf_config`), the family traits (`traits`), activations saved per layer
(`activations`) and each model code's saved tensors (`code`). Imports only :mod:`zerocalc.base`."""
