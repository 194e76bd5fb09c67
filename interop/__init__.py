"""Other tools' LLaMA (and Qwen3, LLaMA with QK-norm): hf_llama.py maps configs, weights and tokenizers to and from
transformers' (export.py, and load.py, which reads a LlamaForCausalLM or Qwen3ForCausalLM directory or this repo's
checkpoint); gguf_llama.py writes llama.cpp's GGUF file."""
