"""Other tools' LLaMA: hf_llama.py maps configs, weights and tokenizers to and from transformers' (export.py, and
load.py, which reads a LlamaForCausalLM directory or this repo's checkpoint); gguf_llama.py writes llama.cpp's
GGUF file."""
