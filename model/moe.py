"""Mixture of experts (ffn=moe): each token's FFN is k of E small SwiGLU experts, chosen per token by a router, plus
always-on shared experts (DeepSeekMoE). DeepSeek-V3, Qwen3-MoE, gpt-oss, OLMoE and Mixtral build their FFNs so.

    x: [N, d]  (the batch's B T tokens)
    s = x W_r                                  [N, E]   the router's scores, E = model.n_experts
    softmax router (Mixtral, Qwen3-MoE):   p = softmax(s)
    sigmoid router (DeepSeek-V3):          p = sigmoid(s)
    chosen = top-k over e of (p_e + b_e)       [N, k]   k = model.experts_per_token
    g = p_chosen / sum(p_chosen)               [N, k]   the gates: renormalised over the k chosen; with k = 1,
                                                        g = p_chosen (Switch): renormalised it would be 1, and
                                                        the router would learn from the balance losses alone
    y = sum_j g_j SwiGLU_{chosen_j}(x) + SwiGLU_shared(x),   SwiGLU_e(x) = (silu(x W1_e) * (x W3_e)) W2_e
        each expert W1_e, W3_e: [d, d_e], W2_e: [d_e, d] (d_e = model.expert_d_ff, by default the dense d_ff / k);
        the shared experts (model.n_shared_experts of them) are one SwiGLU of n_shared d_e, their sum

The router runs in float32 at least, whatever autocast computes the rest in: in bfloat16, sigmoid scores near 0.5 are 0.004
apart, so top-k would break many exact ties by expert index (transformers' routers compute in float32 too).

b: [E] is the loss-free balancing bias (Wang et al. 2024, DeepSeek-V3), a buffer: it moves which experts are
chosen, never their gates, and after each optimizer step (after_optimizer_step) it moves by model.router_bias_rate
towards balance, b_e += rate * sign(mean load - load_e), from that step's loads, outside the gradient.

The balance losses, the block's auxiliary losses (Transformer.aux_losses): weighted by model.router_aux_coef and
model.router_z_coef, they join the language-model loss (Transformer.aux_loss), each logged apart as router_aux and
router_z:
    aux = E * sum_e f_e P_e        f_e: the fraction of the N k choices that went to e; P_e: the mean over
                                   tokens of p_e / sum(p) (Switch, OLMoE): 1 when both are uniform
    z   = mean_n (logsumexp_e s_ne)^2     the router z-loss (ST-MoE): keeps the scores small

Dropless: every token reaches its k experts; nothing is capped or padded. The dispatch sorts the N k choices by
expert, runs each expert's SwiGLU on its own tokens (torch's grouped GEMM on a CPU, one matmul per weight per
expert elsewhere and in float64), and adds the gated outputs back to their tokens (index_add). The experts' weights are stacked in two nn.Linear weights, as the dense
FFN's are (so Muon orthogonalises each matrix on its own through stacked_rows, and init, decay and export treat
them alike): experts_in holds [W1_e^T; W3_e^T] for every e ([E 2d_e, d], nn.Linear's [out, in] rows), experts_out
each W2_e as x W2_e reads it ([E d_e, d]). Neither is called as a layer: the dispatch multiplies each expert's rows.
"""
import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from model.checks import is_number, is_whole
from model.ffn import FeedForward
from model.interfaces import FeedForwardKind


ROUTERS = ("softmax", "sigmoid")  # model.router
# its settings and their values without it: each is refused with a dense FFN unless it has that value
SETTINGS = {"n_experts": None, "experts_per_token": None, "expert_d_ff": None, "n_shared_experts": 0,
            "dense_layers": 0, "router": "softmax", "router_aux_coef": 0.0, "router_z_coef": 0.0,
            "router_bias_rate": 0.0}


def max_violation(load: torch.Tensor) -> float:
    """MaxVio (Wang et al. 2024) of loads [E]: max_e load_e / mean_e load_e - 1, 0 when the experts are balanced."""
    return (load.max() / load.mean() - 1).item()


def eager(method):
    """torch.compiler.disable(method), made at its first call under torch.compile: disable imports torch._dynamo,
    the largest part of a process's start (docs/performance.md), which a process that never compiles never needs."""
    disabled = []

    @functools.wraps(method)
    def call(*args, **kwargs):
        if not torch.compiler.is_compiling():
            return method(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(method))
        return disabled[0](*args, **kwargs)
    return call

class Routing(NamedTuple):
    chosen: torch.Tensor  # [N, k] the experts each token goes to
    gates: torch.Tensor  # [N, k] their weights
    scores: torch.Tensor  # [N, E] s, float32 at least
    probs: torch.Tensor  # [N, E] p


class MoE(FeedForwardKind):
    hidden_activation = "silu(x·W1_e), each expert's gate on its tokens"  # what hidden_activations reads, named

    def __init__(self, cfg):
        super().__init__()
        E, d, d_e = cfg.n_experts, cfg.d_model, cfg.expert_width
        self.n_experts, self.k, self.expert_d_ff = E, cfg.experts_per_token, d_e
        self.sigmoid = cfg.router == "sigmoid"
        self.bias_rate = cfg.router_bias_rate
        self.router = nn.Linear(d, E, bias=False)
        self.experts_in = nn.Linear(d, E * 2 * d_e, bias=False)  # rows [W1_e^T; W3_e^T] for each e
        self.experts_in.stacked_rows = 2 * E * [d_e]
        self.experts_out = nn.Linear(d, E * d_e, bias=False)  # rows W2_e [d_e, d] for each e (a container, not a layer)
        self.experts_out.stacked_rows = E * [d_e]
        self.shared = FeedForward(d, cfg.n_shared_experts * d_e, "swiglu", bias=False) \
            if cfg.n_shared_experts else None
        self.register_buffer("bias", torch.zeros(E))  # loss-free balancing: saved, resumed, never trained
        self.register_buffer("step_counts", torch.zeros(E), persistent=False)  # choices since the last update
        self.last = {}  # the last forward's routing, detached: its loads, entropy and choices (evaluate, insight/)
        self.terms = {}  # a forward with gradients: the balance terms its loss adds, until taken (take_aux_losses)
        # each balance term's weight in the model's loss, by the name it is logged under
        self.aux_weights = {"router_aux": cfg.router_aux_coef, "router_z": cfg.router_z_coef}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        routing = self.route(x)
        y = self.experts(x, routing.chosen, routing.gates)
        if self.shared is not None:
            y = y + self.shared(x)
        self.record(routing)
        return y.view(shape)

    def route(self, x: torch.Tensor) -> Routing:
        """x: [N, d] -> the formula's choices and gates, in float32 at least (float64 stays float64)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            scores = F.linear(x.to(dtype), self.router.weight.to(dtype))
        probs = scores.sigmoid() if self.sigmoid else scores.softmax(dim=-1)
        chosen = (probs + self.bias).topk(self.k, dim=-1).indices
        gates = probs.gather(-1, chosen)
        if self.k > 1:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return Routing(chosen, gates, scores, probs)

    @eager  # per-expert shapes that vary with the data: eager, so that compiling the rest holds
    def experts(self, x: torch.Tensor, chosen: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """sum_j g_j SwiGLU_{chosen_j}(x), dropless: [N, d]. The N k choices sorted by expert, each expert's
        SwiGLU on its rows, the gated outputs added back to their tokens. The rows go through torch's grouped GEMM
        on a CPU (one call per weight for all the experts: the fastest dispatch measured there,
        docs/performance.md#a-mixture-of-experts-block), except in float64, which it has no kernel for; elsewhere
        (CUDA) through one matmul per expert."""
        E, d_e = self.n_experts, self.expert_d_ff
        flat = chosen.flatten()  # [N k], choice i is token i // k's
        order = flat.argsort(stable=True)
        counts = flat.bincount(minlength=E)
        tokens = order // self.k
        rows = x[tokens]  # [N k, d], expert by expert
        w_in = self.experts_in.weight.view(E, 2 * d_e, -1)
        w_out = self.experts_out.weight.view(E, d_e, -1)
        if x.device.type == "cpu" and x.dtype != torch.float64:
            offsets = counts.cumsum(0).to(torch.int32)  # where each expert's rows end
            gate, up = F.grouped_mm(rows, w_in.transpose(1, 2), offs=offsets).chunk(2, dim=-1)
            hidden = F.grouped_mm(F.silu(gate) * up, w_out, offs=offsets)
        else:
            hidden = []
            for e, x_e in enumerate(rows.split(counts.tolist())):
                gate, up = (x_e @ w_in[e].T).chunk(2, dim=-1)
                hidden.append((F.silu(gate) * up) @ w_out[e])
            hidden = torch.cat(hidden)
        y = (hidden * gates.flatten()[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, tokens, y)

    @eager  # its state (the counts, the terms) is kept between forwards
    def record(self, routing: Routing) -> None:
        """This forward's loads, router entropy and choices; with gradients, the balance terms its loss adds; in
        training, its choices for the bias's next update."""
        counts = routing.chosen.flatten().bincount(minlength=self.n_experts).to(routing.probs.dtype)  # exact
        load = counts / counts.sum()  # f_e
        shares = routing.probs / routing.probs.sum(dim=-1, keepdim=True)  # p_e / sum(p): softmax's p itself
        entropy = -(shares * shares.clamp_min(1e-30).log()).sum(dim=-1).mean() / math.log(self.n_experts)
        self.last = {"load": load, "entropy": entropy.detach(), "chosen": routing.chosen}
        if torch.is_grad_enabled():
            self.terms = {"router_aux": self.n_experts * (load * shares.mean(dim=0)).sum(),  # E sum_e f_e P_e
                          "router_z": routing.scores.logsumexp(dim=-1).square().mean()}
        if self.training:
            self.step_counts += counts.to(self.step_counts.dtype)

    # -------- its answers to the repo (model/interfaces.py's FeedForwardKind)
    @classmethod
    def from_config(cls, cfg) -> "MoE":
        return cls(cfg)

    def residual_weights(self) -> list[nn.Parameter]:
        """The weights this FFN writes into the residual stream with: every expert's W2, then the shared experts'
        (GPT-2's scaled init)."""
        return [self.experts_out.weight, *(self.shared.residual_weights() if self.shared is not None else [])]

    @classmethod
    def flops_per_token(cls, cfg, layer: int, seq_len: int) -> float:
        """Forward FLOPs per token of what runs for it (2 per multiply-add): the router's scores, 2 d E, and the
        k routed and the shared experts' SwiGLUs, 3 x 2 d d_e each; the E - k experts it skips cost it nothing.
        Any seq_len: each token alone."""
        d, d_e = cfg.d_model, cfg.expert_width
        return 2 * d * cfg.n_experts + (cfg.experts_per_token + cfg.n_shared_experts) * 3 * 2 * d * d_e

    def last_routing(self) -> dict[str, torch.Tensor]:
        """What its router did in the last forward, for what looks inside the model (validation metrics, insight/):
        "load" [E], the fraction of the N k choices each expert took; "entropy", the router's mean entropy over
        tokens / ln E; "chosen" [N, k], each token's experts."""
        return self.last

    def hidden_activations(self, x: torch.Tensor) -> torch.Tensor:
        """What looks inside the model (insight/) reads of its hidden units for the inputs x [..., d] of its last
        forward, flattened: silu(x W1_e), each expert's gate on the tokens its router sent it, expert by expert."""
        x, chosen = x.reshape(-1, x.shape[-1]), self.last["chosen"]
        w1 = self.experts_in.weight.view(self.n_experts, 2, self.expert_d_ff, -1)[:, 0]
        return torch.cat([F.silu(x[(chosen == e).any(dim=-1)] @ w1[e].T).flatten() for e in range(self.n_experts)])

    def take_aux_losses(self) -> dict[str, torch.Tensor]:
        """The last forward's balance terms, once: a step's loss takes them, and nothing keeps its graph after."""
        terms, self.terms = self.terms, {}
        return terms

    @torch.no_grad()
    def after_optimizer_step(self, reduce) -> None:
        """The loss-free bias, from the step's choices per expert, reduce(counts) giving every process's (a sum; a
        mean would do, the update reading only their signs against their mean): the underloaded experts' bias rises
        by the rate, the overloaded ones' falls. The counts start again."""
        if self.bias_rate:  # every process has the same rate: all of them reduce, or none
            counts = reduce(self.step_counts.clone())
            self.bias += self.bias_rate * torch.sign(counts.mean() - counts).to(self.bias.dtype)
        self.step_counts.zero_()

    # -------- its settings
    @classmethod
    def validate(cls, cfg) -> None:
        """The rules of its settings (SETTINGS): a ConfigError naming the first one broken."""
        for key in ("n_experts", "experts_per_token", "expert_d_ff", "n_shared_experts", "dense_layers"):
            value, least = getattr(cfg, key), {"n_experts": 2, "n_shared_experts": 0, "dense_layers": 0}.get(key, 1)
            if key == "expert_d_ff" and value is None:  # the rule: expert_width
                continue
            if not is_whole(value, least):
                raise ConfigError(f"model.{key}={value!r} must be an integer >= {least} with ffn=moe")
        if cfg.experts_per_token > cfg.n_experts:
            raise ConfigError(f"model.experts_per_token={cfg.experts_per_token} must be at most "
                              f"model.n_experts={cfg.n_experts}")
        if cfg.dense_layers >= cfg.n_layers:
            raise ConfigError(f"model.dense_layers={cfg.dense_layers} leaves no block of model.n_layers="
                              f"{cfg.n_layers} with experts; use a dense ffn")
        if cfg.router not in ROUTERS:
            raise ConfigError(f"model.router={cfg.router!r} must be one of {', '.join(ROUTERS)}")
        for key in ("router_aux_coef", "router_z_coef", "router_bias_rate"):
            value = getattr(cfg, key)
            if not (is_number(value) and 0 <= value < math.inf):
                raise ConfigError(f"model.{key}={value!r} must be a number >= 0")

    @classmethod
    def refuse_settings(cls, cfg) -> None:
        """A dense FFN is chosen: each of SETTINGS keeps its value without experts."""
        for key, dense in SETTINGS.items():
            if getattr(cfg, key) != dense:
                raise ConfigError(f"model.{key}={getattr(cfg, key)!r} is a setting of ffn=moe, but "
                                  f"model.ffn={cfg.ffn}")
