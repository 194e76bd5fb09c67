"""transformers' LLaMA: hf_llama.py maps configs, weights and tokenizers both ways (export.py, and
storage/checkpoint.py's loading of a LlamaForCausalLM directory)."""
