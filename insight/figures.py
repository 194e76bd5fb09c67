"""The report's figures, drawn from its numbers alone (the dict report.json holds), one PNG each.

Checkpoints share each figure: side by side in panels, or as lines of one colour each in the same axes,
labelled as the report labels them (by the switches in which they differ).
"""
import io
import math
import textwrap

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter


DPI = 100
TOKEN_LABELS_UP_TO = 48  # more tokens than this on an axis and every label would overlap its neighbours
TITLE_WIDTH = 44  # characters of a panel title's line: a 4.5-inch panel at 12 points holds about that


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def colour(i: int) -> str:
    return f"C{i % 10}"


def kv_cache(report: dict) -> Figure:
    fig = Figure(figsize=(11, 4), layout="constrained")
    per_token, total = fig.subplots(1, 2)
    for i, ckpt in enumerate(report["checkpoints"]):
        kv = ckpt["kv_cache"]
        for key, style, name in (("cached_s", "-", "KV cache"), ("uncached_s", "--", "no cache")):
            per_token.plot(kv["positions"], [s * 1e3 for s in kv[key]], style, color=colour(i),
                           label=f"{ckpt['label']}: {name}")
            running, sums = 0.0, []
            for s in kv[key]:
                running += s
                sums.append(running)
            total.plot(kv["positions"], sums, style, color=colour(i), label=f"{ckpt['label']}: {name}")
    per_token.set(xlabel="position t of the token fed in", ylabel="ms per generated token",
                  title="one step: O(t·d) with the cache, O(t·d² + t²·d) without")
    total.set(xlabel="tokens generated", ylabel="seconds in all", title="generation in all: the cache's saving grows with length")
    per_token.legend(fontsize=8)
    total.legend(fontsize=8)
    return fig


def kv_cache_by_context(report: dict) -> Figure:
    """Qwen3-Next's cache against the context, as it is (3:1), all linear and all full attention."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    by_context = report["estimator"]["by_context"]
    for i, (label, sizes) in enumerate(by_context["bytes"].items()):
        ax.plot(by_context["contexts"], [b / 2 ** 30 for b in sizes], "o-", color=colour(i), label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="context (positions)", ylabel="GiB per sequence (bf16)",
           title="Qwen3-Next's cache: K, V grow with the context, states do not")
    ax.legend(fontsize=8)
    return fig


def attention_wiring(report: dict) -> Figure:
    checkpoints = report["checkpoints"]
    fig = Figure(figsize=(5.5 * len(checkpoints), 6), layout="constrained")
    axes = fig.subplots(2, len(checkpoints), squeeze=False)
    for i, ckpt in enumerate(checkpoints):
        wiring, bars = axes[0][i], axes[1][i]
        reads = ckpt["attention_wiring"]["reads"]
        kv_heads = sorted({j for js in reads for j in js})
        kv_x = {j: sum(h for h, js in enumerate(reads) if j in js) / sum(j in js for js in reads) for j in kv_heads}
        for h, js in enumerate(reads):
            for j in js:
                wiring.plot([h, kv_x[j]], [1, 0], color=colour(j), lw=1.5)
        wiring.scatter(range(len(reads)), [1] * len(reads), s=300, marker="s", color="white", edgecolor="black", zorder=3)
        wiring.scatter([kv_x[j] for j in kv_heads], [0] * len(kv_heads), s=300, marker="s",
                       color=[colour(j) for j in kv_heads], zorder=3)
        for h in range(len(reads)):
            wiring.annotate(f"q{h}", (h, 1), xytext=(0, 12), textcoords="offset points", ha="center", fontsize=8)
        for j in kv_heads:
            wiring.annotate(f"kv{j}", (kv_x[j], 0), xytext=(0, -18), textcoords="offset points", ha="center", fontsize=8)
        wiring.set(xlim=(-0.7, len(reads) - 0.3), ylim=(-0.4, 1.4), xticks=[], yticks=[],
                   title=titled(f"{ckpt['label']}\nthe K/V head each query head reads (measured, block 0)"))
        sizes = ckpt["attention_wiring"]["cache_by_kv_heads"]
        names = [f"{s['attention']}\n{s['kv_heads']} K/V" for s in sizes]
        bars.bar(names, [s["bytes"] / 1e3 for s in sizes],
                 color=[colour(i) if s["this_model"] else "lightgrey" for s in sizes])
        for x, s in enumerate(sizes):
            bars.annotate(f"{s['bytes']:,}", (x, s["bytes"] / 1e3), ha="center", va="bottom", fontsize=8)
        bars.set(ylabel="kB: one sequence, full context, fp32", title="the cache at this width (this model in colour)")
    return fig


def titled(title: str) -> str:
    """A panel's title, each line wrapped: a checkpoint's label that lists every setting it differs in would run
    into the next panel's."""
    return "\n".join(textwrap.fill(line, TITLE_WIDTH) for line in title.split("\n"))


def token_axes(ax, tokens: list[str], bottom: bool, left: bool) -> None:
    """The tokens as tick labels on the grid's outer edges only (ticks are most of a heat map's drawing time)."""
    ticks = list(range(len(tokens))) if len(tokens) <= TOKEN_LABELS_UP_TO else []
    ax.set_xticks(ticks if bottom else [], [tokens[t] for t in ticks] if bottom else [], rotation=90, fontsize=8)
    ax.set_yticks(ticks if left else [], [tokens[t] for t in ticks] if left else [], fontsize=8)


def attention_maps(report: dict, index: int) -> Figure:
    """One checkpoint's maps, layers down and heads across. Laid out by hand: constrained layout would measure
    every tick label of every map, a third of the figure's drawing time."""
    ckpt, tokens = report["checkpoints"][index], report["tokens"]
    weights, entropy = ckpt["attention_maps"]["weights"], ckpt["attention_maps"]["entropy"]
    layers, heads = len(weights), max(len(layer) for layer in weights)
    # 0.13 inch a token: a row of 8-point labels, legible where the page shows the figure 1280 pixels wide
    side, gap, left, bottom, top, right = 0.3 + 0.13 * min(len(tokens), TOKEN_LABELS_UP_TO), 0.35, 0.9, 0.9, 0.6, 1.1
    width, height = left + heads * (side + gap) + right, bottom + layers * (side + gap) + top
    fig = Figure(figsize=(width, height))
    image = None
    for l in range(layers):
        softmax = ckpt["attention_maps"]["softmax"][l]
        # a linear layer's gate-faded q . k takes either sign: a diverging scale of its own, centred on 0
        largest = max(abs(w) for head in weights[l] for row in head for w in row) or 1
        for h in range(len(weights[l])):
            ax = fig.add_axes(((left + h * (side + gap)) / width, (bottom + (layers - 1 - l) * (side + gap)) / height,
                               side / width, side / height))
            shown = ax.imshow(weights[l][h], **(dict(vmin=0, vmax=1, cmap="viridis") if softmax else
                                                dict(vmin=-largest, vmax=largest, cmap="RdBu_r")))
            image = shown if softmax else image
            token_axes(ax, tokens, bottom=l == layers - 1, left=h == 0)
            ax.set_title(f"layer {l} head {h}: " + (f"entropy {entropy[l][h]:.2f}" if softmax else
                                                    f"faded q·k, |max| {largest:.2g}"), fontsize=8)
    if image is not None:  # a softmax layer's scale (a linear layer's is in its titles)
        bar = fig.add_axes(((width - right + 0.2) / width, bottom / height, 0.15 / width,
                            layers * (side + gap) / height))
        fig.colorbar(image, cax=bar, label="attention weight (row: query, column: key)")
    fig.suptitle(ckpt["label"], y=1 - 0.15 / height, va="top")
    return fig


def attention_entropy(report: dict) -> Figure:
    checkpoints = report["checkpoints"]
    fig = Figure(figsize=(4.5 * len(checkpoints) + 1, 3.5), layout="constrained")
    axes = fig.subplots(1, len(checkpoints), squeeze=False)[0]
    for ax, ckpt in zip(axes, checkpoints):
        rows = ckpt["attention_maps"]["entropy"]
        heads = max(len(row) for row in rows)
        # a layer without softmax (None) and a layer of fewer heads show blank cells
        entropy = [[math.nan if value is None else value for value in row] + [math.nan] * (heads - len(row))
                   for row in rows]
        image = ax.imshow(entropy, vmin=0, vmax=1, cmap="magma", aspect="auto")
        for l, row in enumerate(entropy):
            for h, value in enumerate(row):
                if not math.isnan(value):
                    ax.annotate(f"{value:.2f}", (h, l), ha="center", va="center", fontsize=8,
                                color="black" if value > 0.6 else "white")
        ax.set(xlabel="head", ylabel="layer", xticks=range(heads), yticks=range(len(entropy)),
               title=titled(ckpt["label"]))
    fig.colorbar(image, ax=axes, label="entropy / ln(keys seen): 1 uniform, 0 one key")
    return fig


def shift_check(report: dict) -> Figure:
    checkpoints = report["checkpoints"]
    fig = Figure(figsize=(4.5 * len(checkpoints), 4.2), layout="constrained")
    axes = fig.subplots(1, len(checkpoints), squeeze=False)[0]
    for i, (ax, ckpt) in enumerate(zip(axes, checkpoints)):
        check, first = ckpt["positions"]["shift_check"], ckpt["positions"]["shift_check"]["layer0"]
        if first is None:  # no layer has softmax scores (all linear): nothing to shift
            ax.set(xticks=[], yticks=[], title=titled(f"{ckpt['label']}\nno softmax layer: no scores to shift"))
            continue
        at_0, shifted = first["at_0"], first["shifted"]
        ax.scatter(at_0, shifted, s=6, color=colour(i))
        low, high = min(at_0 + shifted), max(at_0 + shifted)
        ax.plot([low, high], [low, high], color="grey", lw=0.8)
        worst = max(d for d in check["shifts"][-1]["max_abs_diff"] if d is not None)
        ax.set(xlabel="score of (q at m, k at n)", ylabel=f"score of (q at m + {first['shift']}, "
               f"k at n + {first['shift']})",
               title=titled(f"{ckpt['label']} ({ckpt['model']['position']}), layer {first['layer']}\nlargest "
                            f"difference, any layer: {worst:.2g}"))
    return fig


def score_distance(report: dict) -> Figure:
    checkpoints = report["checkpoints"]
    fig = Figure(figsize=(4.5 * len(checkpoints), 3.8), layout="constrained")
    axes = fig.subplots(1, len(checkpoints), squeeze=False, sharey=True)[0]
    for ax, ckpt in zip(axes, checkpoints):
        curves = [(l, curve) for l, curve in enumerate(ckpt["positions"]["score_by_distance"]) if curve is not None]
        for l, curve in curves:  # the layers with softmax scores
            ax.plot(range(len(curve)), curve, marker=".", label=f"layer {l}")
        ax.set(xlabel="distance m − n", title=titled(f"{ckpt['label']} ({ckpt['model']['position']})"
                                                    + ("" if curves else "\nno softmax layer: no scores")))
        if curves:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("mean q·k / √D over heads")
    return fig


def position_table(report: dict) -> Figure | None:
    tabled = [c for c in report["checkpoints"] if c["positions"]["table_similarity"] is not None]
    if not tabled:
        return None
    fig = Figure(figsize=(4.5 * len(tabled) + 1, 4), layout="constrained")
    axes = fig.subplots(1, len(tabled), squeeze=False)[0]
    for ax, ckpt in zip(axes, tabled):
        image = ax.imshow(ckpt["positions"]["table_similarity"], vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set(xlabel="position j", ylabel="position i", title=titled(f"{ckpt['label']} ({ckpt['model']['position']})"))
    fig.colorbar(image, ax=axes, label="cos(PE[i], PE[j])")
    return fig


def residual_stream(report: dict) -> Figure:
    fig = Figure(figsize=(13, 3.6), layout="constrained")
    rms, ratios, cosine, grads = fig.subplots(1, 4)
    for i, ckpt in enumerate(report["checkpoints"]):
        stream, label = ckpt["residual_stream"], ckpt["label"]
        blocks = range(len(stream["stream_rms"]))
        rms.plot(blocks, stream["stream_rms"], marker="o", color=colour(i), label=label)
        ratios.plot(blocks, stream["attn_ratio"], marker="o", color=colour(i), label=f"{label}: attention")
        ratios.plot(blocks, stream["ffn_ratio"], marker="s", ls="--", color=colour(i), label=f"{label}: FFN")
        cosine.plot(blocks, stream["position_cos"], marker="o", color=colour(i), label=label)
        grads.plot(blocks, stream["grad_norm"], marker="o", color=colour(i), label=label)
    rms.set(xlabel="block", ylabel="rms of the stream leaving it", title="stream rms")
    ratios.set(xlabel="block", ylabel="rms(branch) / rms(stream entering)", title="branch / stream")
    cosine.set(xlabel="block", ylabel="mean cos between positions", title="positions alike?")
    grads.set(xlabel="block", ylabel="‖∂L/∂θ‖ of the block, one batch", yscale="log", title="gradient per block")
    for ax in (rms, ratios, cosine, grads):
        ax.legend(fontsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)
    return fig


def ffn(report: dict) -> Figure:
    """A density panel per checkpoint, beside each other: the kinds' scales differ too much for one axis (ReLU²
    squares its inputs, SwiGLU's gate stays near them), so each gets its own; then the near-zero fractions."""
    checkpoints = report["checkpoints"]
    fig = Figure(figsize=(4.2 * len(checkpoints) + 8, 3.8), layout="constrained")
    *densities, near = fig.subplots(1, len(checkpoints) + 1)
    width = 0.8 / len(checkpoints)
    for i, (density, ckpt) in enumerate(zip(densities, checkpoints)):
        f = ckpt["ffn"]
        density.stairs(f["density"], f["edges"], color=colour(i))
        smallest, largest = f["range"]
        density.set(xlabel="activation a (between its 0.1% and 99.9% quantiles)", yscale="log",
                    title=titled(f"{ckpt['label']}\n{f['activation']}"))
        # the cut tail is not in the bins; say how much of it there is and how far it reaches
        density.annotate(f"{f['beyond']:.2%} beyond the axis\nall within [{smallest:.3g}, {largest:.3g}]",
                         (0.97, 0.97), xycoords="axes fraction", ha="right", va="top", fontsize=8)
        layers = range(len(f["near_zero"]))
        near.bar([l + (i - (len(checkpoints) - 1) / 2) * width for l in layers], f["near_zero"], width * 0.9,
                 color=colour(i), label=f"{ckpt['label']}: |a| < 0.1 rms")
        near.plot([l + (i - (len(checkpoints) - 1) / 2) * width for l in layers], f["zero"], "k_", ms=14,
                  label="exactly 0" if i == 0 else None)
    densities[0].set_ylabel("density (every layer, every position)")
    near.set(xlabel="layer", ylabel="fraction of the hidden units", ylim=(0, 1), title="near zero",
             xticks=range(max(len(c["ffn"]["zero"]) for c in checkpoints)))
    near.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside: inside, it hid bars near 1
    return fig


def qk_logits(report: dict) -> Figure:
    """Per layer, the largest logit as trained (solid), with the QK-norm bypassed (dashed) and the norm's bound
    (dotted), one colour per checkpoint; log scale, since the raw projections' logits may be far larger."""
    checkpoints = report["checkpoints"]
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax = fig.subplots()
    for i, ckpt in enumerate(checkpoints):
        scale, label = ckpt["qk_logits"], ckpt["label"]
        layers = range(len(scale["as_trained"]))
        def line(values):  # a layer without softmax logits (None) is a gap
            return [math.nan if value is None else value for value in values]
        ax.plot(layers, line(scale["as_trained"]), "-o", color=colour(i), label=f"{label}: as trained")
        if scale["bypassed"] is not None:
            ax.plot(layers, line(scale["bypassed"]), "--s", color=colour(i), label=f"{label}: QK-norm bypassed")
            # a bar marker as well as the line: a one-layer model's bound is a single point
            ax.plot(layers, line(scale["bound"]), ":_", ms=16, color=colour(i),
                    label=f"{label}: bound √D·max|g_q|·max|g_k|")
    ax.set(xlabel="layer", ylabel="max |q·k| / √D, causal pairs", yscale="log",
           xticks=range(max(len(c["qk_logits"]["as_trained"]) for c in checkpoints)),
           title="the attention logits' scale, and what QK-norm bounds it to")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.1, 1, 10, not 10⁻¹, 10⁰, 10¹
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    ax.margins(x=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: the points stay visible
    return fig


def loss_by_position(lengths: dict) -> Figure:
    """evaluate.py's results (insight/lengths.py): val bpb per bucket of positions, one line per length, a panel per
    mode, the trained context (and the original one, after a longer fine-tune) marked."""
    modes = list(dict.fromkeys(r["mode"] for r in lengths["results"]))
    fig = Figure(figsize=(5.5 * len(modes), 3.8), layout="constrained")
    axes = fig.subplots(1, len(modes), squeeze=False, sharey=True)[0]
    for ax, mode in zip(axes, modes):
        rows = [r for r in lengths["results"] if r["mode"] == mode]
        for i, r in enumerate(rows):
            centres = [(b["start"] + b["end"]) / 2 for b in r["buckets"]]
            ax.plot(centres, [b["val_bpb"] for b in r["buckets"]], marker=".", color=colour(i),
                    label=f"L = {r['length']}: {r['val_bpb']:.3f}")
        for context, style in {lengths["original_context"]: ":", lengths["context_length"]: "--"}.items():
            ax.axvline(context, color="grey", linestyle=style, linewidth=1)
        stride = f", stride {rows[0]['stride']}" if mode == "sliding" and len(rows) == 1 else ""
        if mode == "streaming":
            sinks = rows[0].get("sink_tokens")
            stride = ", its own rolling cache" if sinks is None else f", {sinks} sink tokens" if sinks else \
                ", the window alone"
        ax.set(xscale="log", xlabel="position in the window (log)", title=f"{mode}{stride}")
        ax.legend(fontsize=8, title="window: val bpb", title_fontsize=8)
    scaling = lengths["rope_scaling"]
    axes[0].set_ylabel("val bpb of the tokens at that position")
    fig.suptitle(f"{lengths['position']}, trained at {lengths['context_length']} (dashed)"
                 + (f", {scaling} x{lengths['rope_factor']:g}" if scaling != "none" else ""), fontsize=10)
    return fig


def experts(report: dict) -> Figure | None:
    """Each MoE checkpoint's loads as a heatmap, its MoE blocks down and experts across, the share of the choices
    written in each cell (1/E is balance); None when no checkpoint has experts."""
    routed = [c for c in report["checkpoints"] if c.get("experts")]
    if not routed:
        return None
    fig = Figure(figsize=(1.0 + 0.7 * max(c["experts"]["n_experts"] for c in routed) * len(routed) + 1.5 * len(routed),
                          1.6 + 0.5 * max(len(c["experts"]["blocks"]) for c in routed)), layout="constrained")
    for ax, ckpt in zip(fig.subplots(1, len(routed), squeeze=False)[0], routed):
        routing = ckpt["experts"]
        loads = [b["load"] for b in routing["blocks"]]
        image = ax.imshow(loads, cmap="viridis", vmin=0, aspect="auto")
        for row, block_loads in enumerate(loads):
            for e, load in enumerate(block_loads):
                ax.text(e, row, f"{load:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if load < max(map(max, loads)) / 2 else "black")
        ax.set(xticks=range(routing["n_experts"]), yticks=range(len(loads)), xlabel="expert",
               yticklabels=[f"block {b['block']}" for b in routing["blocks"]],
               title=titled(f"{ckpt['label']}\n{routing['router']} router, k = {routing['k']}: balance is "
                            f"{1 / routing['n_experts']:.3f}"))
        fig.colorbar(image, ax=ax, label="share of the choices")
    return fig


def draw(report: dict) -> dict[str, bytes]:
    """Every figure as PNG bytes, by file name, in the page's order."""
    figures = {"kv_cache.png": kv_cache(report), "kv_cache_by_context.png": kv_cache_by_context(report),
               "attention_wiring.png": attention_wiring(report)}
    for i in range(len(report["checkpoints"])):
        figures[f"attention_maps_{i}.png"] = attention_maps(report, i)
    figures |= {"attention_entropy.png": attention_entropy(report), "shift_check.png": shift_check(report),
                "score_distance.png": score_distance(report), "position_table.png": position_table(report),
                "residual_stream.png": residual_stream(report), "ffn.png": ffn(report)}
    for i, ckpt in enumerate(report["checkpoints"]):
        if ckpt["past_context"].get("results"):
            figures[f"lengths_{i}.png"] = loss_by_position(ckpt["past_context"])
    figures["qk_logits.png"] = qk_logits(report)
    figures["experts.png"] = experts(report)
    return {name: png(fig) for name, fig in figures.items() if fig is not None}
