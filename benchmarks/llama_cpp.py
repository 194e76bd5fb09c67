"""llama.cpp (through llama-cpp-python, installed apart: scripts/bench_gguf.py, scripts/gguf_quality.py) on a GGUF
file that export.py wrote."""
from __future__ import annotations

from pathlib import Path

import llama_cpp


def open_llama_cpp(path: Path, n_ctx: int, threads: int, **settings) -> llama_cpp.Llama:
    """llama_cpp.Llama on `path`, quiet; on a CPU with AMX, without weight repacking (llama-cli --no-repack):
    llama.cpp's AMX repack of q8_0 weights segfaults at the first matmul there (llama.cpp issue 20824)."""
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def no_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params
    if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info():
        llama_cpp.llama_cpp.llama_model_default_params = no_repack  # Llama() has no argument for it
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               verbose=False, **settings)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults
