"""The model: architectures and their parameter tensors (`architecture`), Hugging Face config.json files
(`hf_config`), activations saved per layer (`activations`) and each implementation's saved tensors
(`model_impl`). Imports only :mod:`zerocalc.base`."""
