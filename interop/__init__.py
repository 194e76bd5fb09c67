"""Other tools' LLaMA: hf_llama.py maps configs, weights and tokenizers to and from transformers' (export.py, and
storage/checkpoint.py's loading of a LlamaForCausalLM directory); gguf_llama.py writes llama.cpp's GGUF file."""
