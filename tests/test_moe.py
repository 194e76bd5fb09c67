"""Mixture of experts (model/moe.py): each router against its formula written out, the dropless dispatch against
a per-token loop over the chosen experts, the balance terms and the loss-free bias, cached decoding that chooses
the experts recomputation chooses, the settings it refuses, and a training run (its logs, its resume)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from data_helpers import metrics, train_in_process
from errors import ConfigError
from generation.engine import Engine
from model import ModelConfig, Transformer
from model.moe import MoE
from settings import compose_config
from storage.checkpoint import load_checkpoint
from training.config import model_config
from weights import far_from_init

ROUTERS = ["softmax", "sigmoid"]


def moe_model(seed: int = 0, **settings) -> Transformer:
    """A tiny MoE model (6 experts of 12, 2 per token), its weights far from init, in float64."""
    cfg = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context_length=32, ffn="moe",
               n_experts=6, experts_per_token=2, expert_d_ff=12) | settings
    return far_from_init(Transformer(ModelConfig(**cfg)), seed).double()


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


@pytest.mark.parametrize("router", ROUTERS)
def test_the_router_and_the_dispatch_are_the_formula_token_by_token(router):
    """Each token's output, written out: its k highest of p + b (b chooses, never weighs), the gates p / sum(p)
    over those k, each chosen expert's SwiGLU of its own [W1_e; W3_e] and W2_e, and the shared experts' SwiGLU.
    In float64 the dispatch (sort, one matmul per expert, index_add) sums in another order: ~1e-16 apart."""
    moe: MoE = moe_model(router=router, n_shared_experts=1).blocks[0].ffn
    E, d_e, d = 6, 12, 32
    with torch.no_grad():
        moe.bias.copy_(torch.linspace(-0.5, 0.5, E, dtype=torch.float64))  # a bias that changes some choices
    x = torch.randn(3, 7, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = moe(x).reshape(-1, d)
    w_in = moe.experts_in.weight.view(E, 2, d_e, d)
    w_out = moe.experts_out.weight.view(E, d_e, d)
    shared_in, shared_out = moe.shared.w_in.weight.view(2, d_e, d), moe.shared.w_out.weight
    biased_differs = 0
    for n, token in enumerate(x.reshape(-1, d)):
        scores = moe.router.weight @ token
        p = scores.softmax(-1) if router == "softmax" else scores.sigmoid()
        chosen = sorted(range(E), key=lambda e: -(p[e] + moe.bias[e]))[:2]
        biased_differs += chosen != sorted(range(E), key=lambda e: -p[e])[:2]
        gates = p[chosen] / p[chosen].sum()
        expected = sum(g * swiglu(token, w_in[e, 0], w_in[e, 1], w_out[e].T) for g, e in zip(gates, chosen))
        expected = expected + swiglu(token, shared_in[0], shared_in[1], shared_out)
        torch.testing.assert_close(y[n], expected, rtol=1e-12, atol=1e-12)
    assert biased_differs > 0  # the bias moved some token's choice, and the gates stayed p's


def test_the_cpus_grouped_gemm_dispatch_is_the_loops_in_float32():
    """On a CPU in float32 the experts run through F.grouped_mm, in float64 (every other test here) through one
    matmul per expert: the same block, forward and backward, on the same routing. float32 rounds each of the d = 32
    and d_e = 12 products' sums to 2^-24 relative and the two orders differ: 1e-5 of the largest output (gradient)
    is about a hundred such steps, where a misplaced expert or gate moves outputs of std ~1 by O(1)."""
    moe64: MoE = moe_model(n_shared_experts=1).blocks[0].ffn
    moe32 = copy.deepcopy(moe64).float()
    x64 = torch.randn(3, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    x32 = x64.detach().float().requires_grad_()
    with torch.no_grad():
        chosen, gates, *_ = moe64.route(x64.reshape(-1, 32))
    y64 = moe64.experts(x64.reshape(-1, 32), chosen, gates)
    y32 = moe32.experts(x32.reshape(-1, 32), chosen, gates.float())
    grad = torch.randn_like(y64)
    y64.backward(grad)
    y32.backward(grad.float())
    assert y64.std() > 0.5
    for ours, exact in ((y32, y64), (x32.grad, x64.grad), (moe32.experts_in.weight.grad, moe64.experts_in.weight.grad),
                        (moe32.experts_out.weight.grad, moe64.experts_out.weight.grad)):
        assert (ours.double() - exact).abs().max() <= 1e-5 * exact.abs().max()


def test_top1_gates_are_the_routers_probability_so_the_loss_trains_the_router():
    """With k = 1 the gate is p itself (Switch): renormalised over one expert it would be 1, and the language-model
    loss would give the router no gradient. k = 2 renormalises (Mixtral, Qwen3-MoE, DeepSeek-V3)."""
    tokens = torch.randint(64, (2, 9), generator=torch.Generator().manual_seed(0))
    for k in (1, 2):
        model = moe_model(experts_per_token=k).train()
        moe = model.blocks[0].ffn
        inputs = []
        hook = moe.register_forward_hook(lambda _m, args, _out: inputs.append(args[0].reshape(-1, 32)))
        model(tokens).logsumexp(-1).mean().backward()  # a loss of the logits alone: no balance term
        hook.remove()
        routing = moe.route(inputs[0])
        p = routing.probs.gather(-1, routing.chosen)
        torch.testing.assert_close(routing.gates, p if k == 1 else p / p.sum(-1, keepdim=True))
        assert moe.router.weight.grad.abs().sum() > 0, k


def test_the_balance_terms_are_switchs_loss_and_the_z_loss():
    """aux = E sum_e f_e P_e (1 when loads and scores are uniform), z = mean logsumexp(s)^2, each the mean over the
    MoE blocks, the model's auxiliary losses router_aux and router_z; aux_loss weighs them by the coefficients; a dense
    model has none."""
    model = moe_model(router_aux_coef=0.01, router_z_coef=0.001, dense_layers=1)
    tokens = torch.randint(64, (2, 9), generator=torch.Generator().manual_seed(0))
    model(tokens)
    moe = model.blocks[1].ffn
    inputs = []  # the MoE block's input, from a second forward of the same tokens
    handle = moe.register_forward_hook(lambda _m, args, _out: inputs.append(args[0].reshape(-1, 32)))
    model(tokens)
    handle.remove()
    scores = moe.router(inputs[0])
    p = scores.softmax(-1)
    chosen = p.topk(2, dim=-1).indices
    f = torch.stack([(chosen == e).sum() for e in range(6)]).double() / chosen.numel()
    assert list(model.moe_layers()) == [1]
    terms = model.aux_losses()
    assert list(terms) == ["router_aux", "router_z"]
    torch.testing.assert_close(terms["router_aux"], 6 * (f * p.mean(0)).sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(terms["router_z"], scores.logsumexp(-1).square().mean(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.aux_loss(terms), 0.01 * terms["router_aux"] + 0.001 * terms["router_z"])
    # taken once: the model keeps no graph after the step's loss took it, and a copy of it can be made
    assert model.aux_losses() == {} and copy.deepcopy(model) is not None
    with torch.no_grad():  # a forward without gradients (eval, decode) adds no terms
        model(tokens)
    assert model.aux_losses() == {}
    uniform = torch.full((6,), 1 / 6, dtype=torch.float64)
    assert 6 * (uniform * uniform).sum().item() == pytest.approx(1.0)  # the balanced value aux is read against
    dense = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, context_length=32))
    dense(tokens)
    assert dense.aux_losses() == {} and dense.aux_loss({}) == 0.0 and dense.moe_layers() == {}


def test_the_loss_free_bias_moves_each_expert_toward_the_mean_load_and_gets_no_gradient():
    model = moe_model(router="sigmoid", router_bias_rate=0.1).train()
    moe = model.blocks[0].ffn
    tokens = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(0))
    model(tokens).sum().backward()
    counts = moe.step_counts.clone()
    assert counts.sum() == 4 * 16 * 2  # every token's 2 choices, counted in training
    assert moe.bias.grad is None and "bias" in moe.state_dict() and "step_counts" not in moe.state_dict()
    model.after_optimizer_step(lambda c: c)
    expected = 0.1 * torch.sign(counts.mean() - counts)
    torch.testing.assert_close(moe.bias, expected)
    assert (moe.step_counts == 0).all()  # the next step counts afresh
    # eval forwards leave the counts alone
    model.eval()
    with torch.no_grad():
        model(tokens)
    assert (moe.step_counts == 0).all()


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("shared, dense_layers", [(0, 0), (1, 1)])
def test_cached_decoding_chooses_the_experts_recomputation_chooses(router, shared, dense_layers):
    """Greedy decoding with the KV cache against recomputing the prefix, in float64: the same tokens, logits to
    1e-10, and at each new position the same k experts in every MoE block."""
    model = moe_model(router=router, n_shared_experts=shared, dense_layers=dense_layers,
                      router_bias_rate=0.01 if router == "sigmoid" else 0.0)
    with torch.no_grad():
        for moe in model.moe_layers().values():
            moe.bias.copy_(torch.randn(6, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.3)
    choices = {True: [], False: []}

    def run(use_cache: bool):
        hooks = [moe.register_forward_hook(lambda m, args, _out: choices[use_cache].append(
            m.route(args[0].reshape(-1, 32))[0].view(args[0].shape[0], args[0].shape[1], -1)[:, -1]))
                 for moe in model.moe_layers().values()]
        steps = Engine(model).generate([[1, 5, 9, 13], [2, 40, 3, 63]], 8, temperature=0, use_cache=use_cache)
        out = torch.stack(list(steps), dim=1)
        for hook in hooks:
            hook.remove()
        return out

    cached, recomputed = run(True), run(False)
    assert torch.equal(cached, recomputed)
    assert len(choices[True]) == len(choices[False]) > 0
    for a, b in zip(choices[True], choices[False]):
        assert torch.equal(a.sort(-1).values, b.sort(-1).values)
    tokens = torch.cat([torch.tensor([[1, 5, 9, 13], [2, 40, 3, 63]]), cached], dim=1)
    cache = model.new_kv_cache(2, tokens.shape[1])
    with torch.no_grad():
        stepped = torch.cat([model(tokens[:, :4], 0, cache)] + [model(tokens[:, t:t + 1], t, cache)
                                                                for t in range(4, tokens.shape[1])], dim=1)
        torch.testing.assert_close(stepped, model(tokens), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("overrides, message", [
    (["model.n_experts=8"], "model.n_experts=8 is a setting of ffn=moe, but model.ffn=swiglu"),
    (["model.router=sigmoid"], "model.router='sigmoid' is a setting of ffn=moe, but model.ffn=swiglu"),
    (["ffn=relu", "model.router_aux_coef=0.01"], "model.router_aux_coef=0.01 is a setting of ffn=moe, but "
                                                 "model.ffn=relu"),
    (["ffn=moe", "model.n_experts=1"], "model.n_experts=1 must be an integer >= 2 with ffn=moe"),
    (["ffn=moe", "model.experts_per_token=0"], "model.experts_per_token=0 must be an integer >= 1 with ffn=moe"),
    (["ffn=moe", "model.experts_per_token=9"], "model.experts_per_token=9 must be at most model.n_experts=8"),
    (["ffn=moe", "model.expert_d_ff=0"], "model.expert_d_ff=0 must be an integer >= 1 with ffn=moe"),
    (["ffn=moe", "model.n_shared_experts=-1"], "model.n_shared_experts=-1 must be an integer >= 0 with ffn=moe"),
    (["ffn=moe", "model.dense_layers=4"], "model.dense_layers=4 leaves no block of model.n_layers=4 with experts"),
    (["ffn=moe", "model.router=top1"], "model.router='top1' must be one of softmax, sigmoid"),
    (["ffn=moe", "model.router_aux_coef=-0.01"], "model.router_aux_coef=-0.01 must be a number >= 0"),
    (["ffn=moe", "model.router_z_coef=-1"], "model.router_z_coef=-1.0 must be a number >= 0"),
    (["ffn=moe", "model.router_bias_rate=-0.001"], "model.router_bias_rate=-0.001 must be a number >= 0"),
])
def test_settings_moe_cannot_take_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        model_config(compose_config(overrides))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_moe_group_holds_the_dense_ffns_active_parameters():
    """ffn=moe on llama_tiny: 8 experts of 176 (d_ff 352 / 2), 2 per token: a token's FFN has the dense one's
    parameters, plus the router's 128 x 8 per block."""
    model = Transformer(model_config(compose_config(["ffn=moe"])))
    dense = Transformer(model_config(compose_config([])))
    assert (model.cfg.n_experts, model.cfg.experts_per_token, model.cfg.expert_width) == (8, 2, 176)
    assert model.active_params() == dense.num_params() + 4 * 128 * 8
    assert model.num_params() == model.active_params() + 4 * 6 * 3 * 176 * 128  # 6 idle experts a block


def test_a_run_logs_its_balance_and_routing_and_resumes_the_bias_bit_exactly(workdir, tiny, monkeypatch, capsys):
    """train.py with ffn=moe, the sigmoid router, its loss-free bias, the aux and z losses and Muon: the loss falls,
    train_loss is the language model's alone beside router_aux and router_z, each eval logs every block's loads,
    MaxVio and entropy, the bias moved and is saved; stopped at step 6 and resumed, the run ends on the weights and
    biases of one that never stopped; a refused setting is one line, exit 2, and no run dir."""
    moe = ["ffn=moe", "model.n_experts=4", "model.router=sigmoid", "model.router_bias_rate=0.01",
           "model.router_z_coef=0.001", "model.n_shared_experts=1", "optim=muon", "train.lr=0.01",
           "train.max_steps=12", "train.eval_interval=6"]
    whole, parts = workdir / "moe-whole", workdir / "moe-parts"
    assert train_in_process(whole, [*tiny, *moe], monkeypatch) == 0
    logged = metrics(whole)
    losses = [m["train_loss"] for m in logged]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3
    assert all(m["router_aux"] > 0 and m["router_z"] > 0 for m in logged)
    evals = [m for m in logged if "val_bpb" in m]
    layers = Transformer(model_config(compose_config([*tiny, *moe]))).moe_layers()
    for m in evals:
        for layer in layers:
            loads = [m[f"moe/load/{layer}/{e}"] for e in range(4)]
            assert sum(loads) == pytest.approx(1.0)
            assert m[f"moe/max_vio/{layer}"] == pytest.approx(max(loads) / (sum(loads) / 4) - 1)
            assert 0 < m[f"moe/entropy/{layer}"] <= 1
    model, _ = load_checkpoint(whole)
    assert any(moe.bias.abs().sum() > 0 for moe in model.moe_layers().values())

    assert train_in_process(parts, [*tiny, *moe, "train.max_steps=6", "train.lr_decay_steps=12"], monkeypatch) == 0
    assert train_in_process(parts, [*tiny, *moe, "train.resume=true", "train.max_steps=12"], monkeypatch) == 0
    resumed, _ = load_checkpoint(parts)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        if name.endswith("ffn.bias"):  # the loss-free bias: the same choices, the same steps, bit for bit
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    capsys.readouterr()
    refused = workdir / "moe-refused"
    assert train_in_process(refused, [*tiny, "ffn=moe", "model.experts_per_token=9"], monkeypatch) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: model.experts_per_token=9 must be at most model.n_experts=8"
    assert not refused.exists()
