"""How bench.py measures (its modes' peers, timers and tables live in this package).

llama_tiny is what `python train.py [overrides]` trains. Every peer of ours is composed from configs/ and the
overrides as train.py composes them (settings.py), so every model.* and train.* setting reaches it: the
GPT-2 configuration and the one-switch rows add their group options (norm=layernorm, ...), the ablation's
variants `+experiment=ablation ablation=X`; train.py's AdamW of the composed train.* settings steps each one
(training/optim.py). --quick adds toy sizes to the overrides (QUICK_OVERRIDES). transformers'
LlamaForCausalLM gets its sizes and its weights (copied through interop/hf.py), the same inputs and the
same thread count. The timed runs alternate (A B C, C B A, A B C, ...) so that noise from other processes hits
every peer, and every figure is the median over --repeats runs after one untimed warm-up. Machines are
shared: compare the ratios, not the absolute figures. Every ratio "A vs B" is A's tokens/s over B's (above 1:
A is faster): the tables' last column (vs llama_tiny, vs baseline) is its row over the baseline row, and
each target (train_vs_gpt2, ...) is llama_tiny's figure over its peer's.

Training: tokens/s of forward + cross-entropy + backward + AdamW step on train.batch_size sequences of
llama_tiny's context, the optimizer built as train.py builds it (training/optim.py) for every peer:
    llama_tiny, eagerly (train.compile=false, the default) and, on a copy of the same weights, with its loss
    (forward and cross-entropy) through torch.compile as train.compile=true runs it (its untimed warm-up step
    compiles: that time is reported apart);
    this repo's GPT-2 configuration of the same sizes (norm=layernorm position=learned attention=mha ffn=gelu);
    transformers' LlamaForCausalLM and GPT2LMHeadModel (exact GELU, biases as GPT-2 has them), eagerly;
    llama_tiny with one component switched to the GPT-2 configuration's: what that component costs.
CPU runs fp32; --device cuda runs under bf16 autocast. One formula for every row:
    MFU = FLOPs per token * tokens/s / peak FLOP/s
    FLOPs per token = Transformer.flops_per_token(T, training=True), the model's own count of what runs
      (model/transformer.py): every matmul of this repo's model of that configuration, the LM head included
      (the embedding lookup multiplies nothing), a MoE's k routed and shared experts and its router, a window's
      span; 2 FLOPs per multiply-add, x3 for forward + backward. Attention: q k^T and att v each take T_keys * d
      multiply-adds per token and layer; under the causal mask a token sees T_keys = (T + 1) / 2 keys on
      average. (PaLM's convention counts all T: 12 L T d.)
    peak = the best n x n torch.matmul (n = 2048) of the run, timed between the training steps.
Decode: greedy, 512 new tokens after a 16-token prompt, at batch 1 and 8; tokens/s = batch * 512 / the wall
time of the whole generation, the prompt's prefill included. Ours through generation.engine.Engine with and
without the KV cache (the no-cache run once, at batch 1: it takes minutes at batch 8) and with the cache under
generation.engine.compiled_decoder (its warm-up run compiles the decode step: that time is reported apart), theirs through
generate(use_cache=True, do_sample=False, min_new_tokens=512). 16 + 512 tokens do not fit llama_tiny's
context, so both decode models have context_length = max_position_embeddings = 1024.
Prefill: one forward over a 256-token prompt into an empty cache, logits of the last position only
(what generation needs; transformers' generate asks for the same with logits_to_keep=1).
The weight-streaming limit: a batch-1 decode step reads every weight once, so it cannot beat
bandwidth / weight bytes tokens/s; bandwidth is the best of 5 copies of a 256 MB tensor (read + write).
--against DIR: did a change move the speed? This tree's model of the overrides against the same model of the
checkout in DIR (e.g. `git worktree add ../before <commit>`), both in this process on the same weights and
inputs, alternating: training steps through each tree's own loss and AdamW, and KV-cache decode through each
tree's own Engine at batch 1 and 8, as above; "vs DIR" is this tree's tokens/s over the other's. It refuses a
tree whose model computes other logits on the same weights (SAME_LOGITS), or cannot express the settings.
--caches: what each kind of cache buys at decode. The preset's model under attention=gqa (its K/V heads),
attention=mqa (one) and attention=mla (a latent, model/mla.py), on random weights: greedy decode as above at
batch 1 and 8, one generation of each in turn, alternating; tokens/s, cache bytes per token, parameters, and
"vs gqa", each row's tokens/s over GQA's, and what the generation holds: the cache (its bytes per token x the
prompt and new tokens x the batch) beside the weights. --long: the preset's context stretched 32x by YaRN
(model.rope_scaling=yarn, model.rope_factor=32, model.rope_original_context = the preset's context; 4,096 tokens
for llama_tiny) and a generation that fills it, where the cache, not the weights, is most of what decode reads.
--streaming: generation far past the trained context (STREAM_TOKENS new tokens after the 16-token prompt, at batch
1 and 8, greedy, random weights), three ways, alternating: the preset's model sliding as generate.py does by
default (every context / 2 tokens it re-prefills the last context / 2), the same model streaming with
STREAM_SINKS sink tokens and a rolling window (StreamingLLM, Engine(sink_tokens=...)), and the preset with every
layer local (model.window = context / 4) in its own rolling cache; "vs slide" is each row's tokens/s over the
sliding one's, and each cache's bytes are what it allocates.
"""
