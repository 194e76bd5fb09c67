"""The one generation loop, shared by generate.py, training's samples and bench.py.

    prompts: [B, P] --prefill: one forward over the whole prompt--> logits [B, V] --sample--> ids [B]
    (num_samples N > 1: the B prompts are prefilled once, at batch B, and their K/V and last logits are
    copied to N rows each, so that sample j of prompt b is row b * N + j of a batch of B * N)
    then, per new token, either
      cached:    forward(ids [B, 1], start=n - 1, cache) -> logits [B, V]   K/V of the prefix come from the cache
      uncached:  forward(window [B, n], start=0)          -> logits [B, V]   the whole prefix is recomputed
    cache: each layer's k, v [B * N, n_kv_heads, max_len, head_dim] (model/kv_cache.py), max_len = min(context,
    P + max_new_tokens - 1), allocated once per generation and written in place (the last new token is never fed
    back); the token window beside it holds max_len + 1 ids per sample.
    How a generation meets the context is a ContextPolicy, chosen once per generation (Engine.context_policy):
    cached (it fits), streaming or rolling past it in the cache, sliding with re-prefills, or uncached.

The cached one-token steps can go through a `decoder` the caller gives (e.g. torch.compile of the model,
see generate.py --compile); the caller warms it up and times that, the engine only runs it.

Sampling: temperature 0 is greedy argmax. Otherwise softmax(logits / temperature), restricted to the
top_k largest logits (every logit tied with the k-th is kept) and then to the top_p nucleus: the
smallest set of most likely tokens whose probability sum exceeds top_p (among equal probabilities the
lower token id ranks first). A seed gives a torch.Generator of its own, so one seed gives one text.

Limits:
- All prompts of a batch have the same length; there is no padding. generate.py's N samples of one
  prompt are num_samples=N of a batch of one.
- The context is the model's trained one (model.context_length) unless the caller gives a longer one
  (generate.py --context, with a RoPE scaling for positions past the trained ones: docs/long_context.md).
- Sizes are checked against the memory free for them before they are allocated (generation/memory.py's
  memory_shortfall): the position tables of the context at construction, the cache and the token window at
  generate(); a size too large is a SamplingError naming the setting.
- A prompt longer than the context is cut from the left, keeping its last context tokens,
  with a warning on stderr.
- When a new token would not fit in the context, the window slides: the last context // 2
  tokens are kept and re-prefilled at positions 0 .. context // 2 - 1, then generation goes on.
  Positions restart at 0, so this works for RoPE, absolute and no positions alike; the cost is one
  prefill per context // 2 new tokens, and the model only sees the window.
- Dynamic NTK (model.rope_scaling=dynamic) scales with a sequence's length. A cached generation scales every
  position at the cache's length (its queries and keys alike; transformers rescales each step and keeps the
  keys of earlier scales); the uncached path recomputes the prefix at its current length.
- eos_id: a sample that emits it has ended; it keeps yielding eos_id until the whole batch has ended,
  which stops the run. eos_id=None: every sample runs for max_new_tokens.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from functools import partial

import torch

from errors import UsageError
from generation.memory import memory_shortfall
from model.block import rope_dim
from model.kv_cache import KVCache
from model.positions import table_bytes
from model.transformer import Transformer

MAX_NEW_TOKENS = 1_000_000


class SamplingError(UsageError):
    """A generation setting out of range; .setting is the argument's name, so a CLI can name its flag."""

    def __init__(self, setting: str, value, rule: str):
        self.setting, self.value, self.rule = setting, value, rule
        super().__init__(f"{setting}={value!r} {rule}")


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise SamplingError("max_new_tokens", max_new_tokens, f"must be in [1, {MAX_NEW_TOKENS:,}]")
    if not 0 <= temperature < math.inf:  # also rejects NaN
        raise SamplingError("temperature", temperature, "must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise SamplingError("top_k", top_k, "must be >= 1 (leave it out to keep every token)")
    if top_p is not None and not 0 < top_p <= 1:
        raise SamplingError("top_p", top_p, "must be in (0, 1]")


def check_sink_tokens(model: Transformer, sink_tokens: int, context: int) -> None:
    """StreamingLLM's sink tokens, against the cache they are kept in and the model: SamplingError where they cannot
    be, with the reason the model gives (Transformer.stream_refusal)."""
    if sink_tokens is None:
        return
    if not isinstance(sink_tokens, int) or not 0 <= sink_tokens < context:
        raise SamplingError("sink_tokens", sink_tokens, f"must be an integer in [0, the cache's {context} positions)")
    if refusal := model.stream_refusal(sink_tokens):
        raise SamplingError("sink_tokens", sink_tokens, refusal)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits: [B, V]; everything below the k-th largest logit becomes -inf."""
    kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits: [B, V]; keeps the smallest set of most likely tokens whose probability sum exceeds p.
    A token is kept when the tokens ranked before it sum to at most p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs > p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
           generator: torch.Generator | None) -> torch.Tensor:
    """logits: [B, V] -> next token ids [B]."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@dataclass
class GenerationStats:
    """Counts of one run, over the whole batch. The decode clock covers sampling and every forward after
    the prefill (slides included), not the time the caller spends between two tokens."""
    prompt_tokens: int = 0  # tokens prefilled: each prompt once, whatever num_samples
    generated_tokens: int = 0  # tokens of samples that had not ended, their EOS included
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cache_bytes: int = 0
    policy: str = ""  # the context policy that ran (ContextPolicy.name)
    cache_positions: int = 0  # the positions its cache held (0: none)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s else 0.0

    def __str__(self) -> str:
        return (f"prompt tokens {self.prompt_tokens} | generated tokens {self.generated_tokens} | "
                f"prefill {self.prefill_tokens_per_s:,.0f} tokens/s | decode {self.decode_tokens_per_s:,.0f} tokens/s | "
                f"context {self.policy}, {self.cache_positions:,} positions cached | KV cache {self.cache_bytes:,} bytes")


class Engine:
    def __init__(self, model: Transformer, tokenizer=None, decoder=None, context: int | None = None,
                 sink_tokens: int | None = None):
        """decoder: what runs the cached one-token steps, called as the model is (default: the model itself),
        e.g. torch.compile(model, dynamic=True); the prompt's prefill and the slides stay on the model.
        context: the positions a generation may use before it slides (default: model.context_length); a
        longer one raises PositionsError here for a learned table, and SamplingError for tables that would not fit
        in memory. sink_tokens S: a cached generation streams past the context (StreamingLLM): the full layers
        keep the first S positions and the last context - S (S = 0: the window alone), and nothing is
        re-prefilled; None: it slides."""
        self.model = model
        self.context = context or model.cfg.context_length
        check_sink_tokens(model, sink_tokens, self.context)
        self.sink_tokens = sink_tokens
        self._fit_tables(self.context, "context", self.context)
        self.decoder = model if decoder is None else decoder
        self.tokenizer = tokenizer  # needed by complete() only
        self.stats = GenerationStats()  # of the latest run, updated as it goes

    def _fit_tables(self, length: int, setting: str, value: int) -> None:
        """The position tables for `length` positions, or SamplingError naming the setting where they would not fit
        in memory (PositionsError for a learned table's end)."""
        cfg = self.model.cfg
        if shortfall := memory_shortfall({"the position tables": table_bytes(cfg, rope_dim(cfg), length)},
                                         self.model.tok_emb.weight.device):
            raise SamplingError(setting, value, shortfall)
        self.model.fit_positions(length)

    def context_policy(self, use_cache: bool, prompt_len: int, max_new_tokens: int) -> type[ContextPolicy]:
        """How a generation of these lengths meets the context, chosen once: within it, its cache (Cached); past it,
        in the cache itself where the layers roll or the sink tokens stream (Streaming: each position written once),
        else re-prefilling a slid window (Sliding); without a cache, recomputing the prefix (Uncached)."""
        if not use_cache:
            return Uncached
        if prompt_len + max_new_tokens - 1 <= self.context:
            return Cached
        return Streaming if self.sink_tokens is not None or self.model.rolls(self.context) else Sliding

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 use_cache: bool = True, eos_id: int | None = None, num_samples: int = 1):
        """Yields the new token ids of every sample, a LongTensor [B * num_samples], once per step; prompt b's
        samples are rows b * num_samples .. (b + 1) * num_samples - 1. The arguments are checked here,
        before the first token, so a bad one raises at the call."""
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples} must be >= 1")
        if not prompts or not all(prompts):
            raise ValueError("every prompt needs at least one token, e.g. BOS")
        if len({len(p) for p in prompts}) > 1:
            raise ValueError(f"prompts of one batch must have one length, got {sorted({len(p) for p in prompts})}")
        context, sinks = self.context, self.sink_tokens or 0
        if len(prompts[0]) > context:
            limit = (f"model.context_length={context}" if context == self.model.cfg.context_length
                     else f"the context of {context}")
            kept = f"its first {sinks} (the sink tokens) and last {context - sinks}" if sinks else f"its last {context}"
            print(f"warning: the prompt has {len(prompts[0])} tokens, more than {limit}; keeping {kept}",
                  file=sys.stderr)
            prompts = [p[:sinks] + p[len(p) - (context - sinks):] for p in prompts]
        device = self.model.tok_emb.weight.device
        policy = self.context_policy(use_cache, len(prompts[0]), max_new_tokens)
        if policy.runs_past_context:  # positions run past the context: their tables made once, not grown each step
            self._fit_tables(len(prompts[0]) + max_new_tokens, "max_new_tokens", max_new_tokens)
        self._check_memory(len(prompts) * num_samples, self._positions(len(prompts[0]), max_new_tokens), use_cache,
                           max_new_tokens)
        generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
        pick = partial(sample, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        return self._run(torch.tensor(prompts, device=device), num_samples, max_new_tokens, pick, policy, eos_id)

    def _positions(self, prompt_len: int, max_new_tokens: int) -> int:
        """The positions a generation holds at once, the cache's length (the last new token is never fed back)."""
        return min(self.context, prompt_len + max_new_tokens - 1)

    def _check_memory(self, batch: int, positions: int, use_cache: bool, max_new_tokens: int) -> None:
        """SamplingError when the token window (int64 ids) and the cache of `batch` samples would not fit in memory."""
        weight = self.model.tok_emb.weight
        needs = {"the token window": batch * (positions + 1) * 8,
                 "the KV cache": self.model.kv_cache_bytes(positions, batch, weight.dtype) if use_cache else 0}
        if shortfall := memory_shortfall(needs, weight.device):
            raise SamplingError("max_new_tokens", max_new_tokens, f"for {batch} samples of up to {positions:,} "
                                f"positions {shortfall}")

    def complete(self, prompt: str, max_new_tokens: int, temperature: float = 0.8, top_k: int | None = None,
                 seed: int | None = None) -> str:
        """BOS + prompt, continued until EOS or max_new_tokens; returns prompt and continuation, decoded together."""
        if self.tokenizer is None:
            raise ValueError("Engine.complete needs a tokenizer: Engine(model, tokenizer)")
        ids = [self.tokenizer.bos_id] + self.tokenizer.encode(prompt)
        new = [int(step[0]) for step in self.generate([ids], max_new_tokens, temperature, top_k, seed=seed,
                                                       eos_id=self.tokenizer.eos_id)]
        return self.tokenizer.decode(ids + new)

    @torch.inference_mode()
    def _run(self, prompt: torch.Tensor, num_samples: int, max_new_tokens: int, pick, policy_class: type[ContextPolicy],
             eos_id: int | None):
        model = self.model
        batch = prompt.shape[0] * num_samples
        policy = policy_class(self, prompt, num_samples, self._positions(prompt.shape[1], max_new_tokens))
        cache = policy.cache
        self.stats = stats = GenerationStats(prompt_tokens=prompt.numel(), policy=policy.name,
                                             cache_bytes=cache.nbytes if cache is not None else 0,
                                             cache_positions=cache.max_len if cache is not None else 0)
        ended = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
        was_training = model.training
        model.eval()
        try:
            clock = time.perf_counter()
            logits = self._prefill(prompt, num_samples, cache, policy.sink_tokens)
            stats.prefill_s = self._elapsed(clock)
            clock = time.perf_counter()
            for step in range(max_new_tokens):
                if step:
                    logits = policy.step(next_id)
                next_id = pick(logits)
                new_tokens = batch if eos_id is None else batch - int(ended.sum())
                stats.generated_tokens += new_tokens
                if eos_id is not None:
                    next_id = next_id.masked_fill(ended, eos_id)
                    ended |= next_id == eos_id
                finished = eos_id is not None and bool(ended.all())
                stats.decode_s += self._elapsed(clock)
                yield next_id
                if finished:
                    return
                clock = time.perf_counter()
        finally:
            model.train(was_training)

    def _prefill(self, prompt: torch.Tensor, num_samples: int, cache: KVCache | None,
                 sink_tokens: int | None = None) -> torch.Tensor:
        """One forward of the prompts [B, P] at batch B -> the last logits of every sample, [B * num_samples, V];
        the cache's rows of prompt b's samples get its K/V at positions 0 .. P - 1 (sink_tokens: the cache's)."""
        if num_samples == 1:
            return self._forward(prompt, 0, cache)
        # the batch's cache at the full cache's length, so that dynamic NTK scales the prompt as the rest
        once = None if cache is None else self.model.new_kv_cache(prompt.shape[0], cache.max_len,
                                                                   sink_tokens=sink_tokens)
        logits = self._forward(prompt, 0, once)
        if cache is not None:
            cache.fill_from(once, repeats=num_samples, length=prompt.shape[1])
        return logits.repeat_interleave(num_samples, dim=0)

    def _forward(self, tokens: torch.Tensor, start: int, cache: KVCache | None, model=None) -> torch.Tensor:
        """tokens [B, T] at positions start .. start + T - 1 -> logits of the last one, [B, V];
        model: the model (default) or the decoder."""
        return (self.model if model is None else model)(tokens, start, cache, last_only=True)[:, -1]

    def _elapsed(self, since: float) -> float:
        if self.model.tok_emb.weight.is_cuda:  # kernels run asynchronously; wait for them before reading the clock
            torch.cuda.synchronize()
        return time.perf_counter() - since


class ContextPolicy:
    """How one generation meets the context, chosen once (Engine.context_policy): it holds the generation's cache and
    computes the logits of each step after the prefill from the token just sampled, so that the step loop asks it
    nothing else. n: the tokens the model has read so far, at positions 0 .. n - 1."""
    name = ""
    runs_past_context = False  # whether positions go on past the context (their tables are made for them at once)
    sink_tokens: int | None = None  # the cache's (model/kv_cache.py's StreamingCache)

    def __init__(self, engine: Engine, prompt: torch.Tensor, num_samples: int, positions: int):
        self.engine, self.n = engine, prompt.shape[1]
        self.cache = self.new_cache(prompt.shape[0] * num_samples, positions)

    def new_cache(self, batch: int, positions: int) -> KVCache | None:
        return self.engine.model.new_kv_cache(batch, positions, sink_tokens=self.sink_tokens)

    def step(self, next_id: torch.Tensor) -> torch.Tensor:
        """Reads next_id [B] at position n: the cache holds every earlier one."""
        self.n += 1
        return self.engine._forward(next_id[:, None], self.n - 1, self.cache, self.engine.decoder)


class Cached(ContextPolicy):
    """The whole generation fits in the context, and in the cache."""
    name = "cached"


class Streaming(ContextPolicy):
    """Past the context in the cache itself: local layers roll through their window, and with sink tokens S the full
    layers keep the first S positions and roll through the rest (StreamingLLM). Nothing is re-prefilled."""
    runs_past_context = True

    def __init__(self, engine: Engine, prompt: torch.Tensor, num_samples: int, positions: int):
        self.sink_tokens = engine.sink_tokens  # None: the local layers roll alone
        self.name = "rolling" if self.sink_tokens is None else f"streaming ({self.sink_tokens} sink tokens)"
        super().__init__(engine, prompt, num_samples, positions)


class Uncached(ContextPolicy):
    """No cache: every step recomputes the whole prefix, the O(n^2) path the cache removes. The tokens the model sees
    are kept in a window; when a new token would not fit in the context, the window slides: its last context // 2
    tokens are kept and read again from position 0."""
    name = "uncached"

    def __init__(self, engine: Engine, prompt: torch.Tensor, num_samples: int, positions: int):
        super().__init__(engine, prompt, num_samples, positions)
        # the spare slot: the token that overflows, before the window slides
        self.window = torch.empty(prompt.shape[0] * num_samples, positions + 1, dtype=torch.long,
                                  device=prompt.device)
        self.window[:, :self.n] = prompt.repeat_interleave(num_samples, dim=0)
        self.keep = max(1, engine.context // 2)

    def new_cache(self, batch: int, positions: int) -> None:
        return None

    def append(self, next_id: torch.Tensor) -> bool:
        """Puts next_id in the window; whether that slid it."""
        self.window[:, self.n] = next_id
        self.n += 1
        if self.n <= self.engine.context:
            return False
        self.window[:, :self.keep] = self.window[:, self.n - self.keep:self.n]
        self.n = self.keep
        return True

    def step(self, next_id: torch.Tensor) -> torch.Tensor:
        self.append(next_id)
        return self.engine._forward(self.window[:, :self.n], 0, None)


class Sliding(Uncached):
    """Cached up to the context, then the window slides as Uncached's does and its tokens are re-prefilled into the
    cache: one prefill per context // 2 new tokens, and the model sees only the window."""
    name = "sliding"

    def new_cache(self, batch: int, positions: int) -> KVCache:
        return ContextPolicy.new_cache(self, batch, positions)

    def step(self, next_id: torch.Tensor) -> torch.Tensor:
        if self.append(next_id):
            return self.engine._forward(self.window[:, :self.n], 0, self.cache)
        return self.engine._forward(next_id[:, None], self.n - 1, self.cache, self.engine.decoder)


def compiled_decoder(engine: Engine, batch: int) -> float:
    """Gives the engine a torch.compile'd decoder (dynamic shapes: one graph serves every position) and
    compiles it on a throwaway generation of this batch size, so the run that follows only reuses its
    graphs; returns the seconds that took (docs/performance.md has them, cold and from torch's on-disk cache)."""
    engine.decoder = torch.compile(engine.model, dynamic=True, fullgraph=True)
    clock = time.perf_counter()
    # Positions 1, 2 and 3: torch.compile specialises an integer equal to 1, so position 1 (after a
    # one-token prompt) has a graph of its own, and the last step fills the cache exactly.
    for _ in engine.generate([[0]], 4, temperature=0, num_samples=batch):
        pass
    return time.perf_counter() - clock
