"""RoPE scaling: the frequencies that let a model trained at L0 positions read more (model.rope_scaling).

RoPE turns pair i of a head (D dims, base b) by theta_i = b^(-2i/D) per position (model/positions.py). Past the
trained context L0 the slow pairs reach angles that training never showed. Each scaling, with factor s
(model.rope_factor, the new length over L0), changes the theta_i:

    none      theta_i
    linear    theta_i / s                          Position Interpolation (Chen et al. 2023): position m is read as
                                                   m / s, so s L0 positions span the angles L0 did
    ntk       (b s^(D/(D-2)))^(-2i/D)              NTK-aware (bloc97, 2023): a larger base; the fastest pair keeps its
                                                   speed, the slowest is divided by exactly s
    dynamic   ntk with s_L = s L / L0 - (s - 1)    dynamic NTK (emozilla, 2023): for a sequence of L > L0 positions,
                                                   so s_L is 1 at L0 and grows by s for every further L0; up to L0, none
    yarn      theta_i ((1 - r_i) + r_i / s)        YaRN (Peng et al. 2023): pairs that turn more than beta_fast = 32
                                                   times in L0 positions keep theta_i (r_i = 0), those that turn fewer
                                                   than beta_slow = 1 times are interpolated (r_i = 1), a linear ramp
                                                   between; and cos, sin are multiplied by 0.1 ln s + 1, which scales
                                                   every attention logit by its square (the softmax's temperature)

The ramp: the pair that turns n times in L0 positions is i(n) = D ln(L0 / (2 pi n)) / (2 ln b);
r_i = clamp((i - floor(i(beta_fast))) / (ceil(i(beta_slow)) - floor(i(beta_fast))), 0, 1).

These are transformers' definitions (rope_type linear, dynamic and yarn; ntk is its default type with the larger
base), computed in float32 in the same order, so the cos/sin tables agree to 1e-10 (tests/test_long_context.py's
test_rope_tables_equal_transformers_past_the_original_context).
"""
import math

import torch

SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn")
YARN_BETA_FAST = 32.0  # the paper's and transformers' defaults
YARN_BETA_SLOW = 1.0


DYNAMIC_NTK_STREAMS = "its frequencies change with the sequence's length, which a stream does not have"


def scales(scaling: str | None) -> bool:
    """Whether a --rope-scaling choice changes RoPE's frequencies (none, or no choice, leaves them)."""
    return scaling not in (None, "none")


def scaling_stream_refusal(scaling: str, sink_tokens: int | None) -> str | None:
    """Why a cache cannot go on past its length under this scaling (None: it can): dynamic NTK's frequencies depend on
    the length; YaRN's attention factor is on cos and sin, so the rotations that turn sink tokens on would compound it.
    sink_tokens None: the rolling caches alone, whose keys keep their positions."""
    if scaling == "dynamic":
        return f"with model.rope_scaling=dynamic: {DYNAMIC_NTK_STREAMS}"
    if scaling == "yarn" and sink_tokens:
        return ("with model.rope_scaling=yarn: the sinks are rotated on by composing RoPE's rotations, which YaRN's "
                "attention factor on cos and sin would scale again at each step")
    return None


def yarn_attention_factor(factor: float) -> float:
    return 0.1 * math.log(factor) + 1.0


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """The NTK-aware base: b s^(D/(D-2))."""
    return base * factor ** (head_dim / (head_dim - 2))


def rope_frequencies(head_dim: int, base: float, scaling: str = "none", factor: float = 1.0,
                     original: int = 0, length: int = 0) -> tuple[torch.Tensor, float]:
    """(theta_i: [D/2] float32, the factor on cos and sin) for a sequence of `length` positions (dynamic's only use
    of it) of a model trained at `original` positions."""
    exponents = torch.arange(0, head_dim, 2).float() / head_dim  # 2i / D
    if scaling == "ntk":
        base = ntk_base(base, factor, head_dim)
    elif scaling == "dynamic" and length > original:
        # in float32 tensors, as transformers computes it from the positions' tensor
        stretch = factor * torch.tensor(length) / original - (factor - 1)
        base = base * stretch ** (head_dim / (head_dim - 2))
    theta = 1.0 / base ** exponents
    if scaling == "linear":
        return theta / factor, 1.0
    if scaling != "yarn":
        return theta, 1.0
    turns_to_pair = lambda turns: head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(turns_to_pair(YARN_BETA_FAST)), 0)
    high = min(math.ceil(turns_to_pair(YARN_BETA_SLOW)), head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    keep = 1 - ramp  # the share of theta_i kept as it is, the rest interpolated
    powers = base ** exponents
    return (1.0 / (factor * powers)) * (1 - keep) + (1.0 / powers) * keep, yarn_attention_factor(factor)
