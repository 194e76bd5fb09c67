"""What report.py measures inside a checkpoint, one module per part of the chapter it follows, and how it shows it.

decode.py (the KV cache: time per token against position, with and without it), attention.py (which K/V head
each query head reads, the cache under MHA / GQA / MQA, attention weights and their entropy, the logits' scale
with QK-norm and with it bypassed), positions.py (RoPE's shift check, the score against distance, the absolute
table's similarity), blocks.py (the residual stream, the gradient per block, the FFN's activations), lengths.py
(the loss by position at any length, past the trained context: evaluate.py's too), figures.py (the PNGs, drawn
from the measured numbers alone) and page.py (the self-contained HTML page with its KV-cache estimator).
"""
