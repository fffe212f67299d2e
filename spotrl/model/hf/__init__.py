"""Hugging Face checkpoints (Qwen2 / Qwen2.5 / Llama 3) in and out of our NNX transformer.

config.py        config.json <-> ModelConfig; a run config's `model` section completed from it
safetensors.py   safetensors headers and tensor data (local files and fsspec URLs)
loader.py        tensor names, checks and loading (sharded on a mesh); a run's policy and tokenizer
tokenizer.py     tokenizer.json and the chat template behind our tokenizer interface
export.py        our parameters written as a checkpoint that `transformers` loads unchanged
"""
