"""The report's page: one self-contained HTML file (figures as base64 data URIs, styles and script inline,
nothing fetched), its tables (the same ones go to W&B), and the KV-cache estimator, a form whose inline
JavaScript computes model/kv_cache.py's formula (each attention kind's cost of one position, its PER_POSITION, times
the positions held) as its fields change: a page opened without Python needs it in the browser's language, and
tests/test_report.py's browser test holds the two equal.
"""
import base64
import html
import json

from insight.blocks import NEAR_ZERO, STREAM_STATS
from model.block import ATTENTION_KINDS

# (id, title, what it shows and the chapter's point it measures, its figures' name prefixes, its tables)
SECTIONS = [
    ("kv-cache", "1. KV cache",
     "Every generated token's time, measured through the engine with the cache and without it: without, each step "
     "recomputes the whole prefix, so the step grows with the position t and the run as O(t²·d); with it, a step "
     "projects one token and reads the cached K and V, but its query still meets t keys, O(t·d), not O(1). The "
     "estimator computes what the cache costs in memory for any model, 2·L·H_kv·d_head·S·bytes·batch, or with "
     "multi-head latent attention (MLA: DeepSeek-V2/V3) L·(d_c + d_R)·S·bytes·batch, or for a Gated DeltaNet layer "
     "a fixed state of H_v·d_h² (and the conv's last inputs) at any S; the second figure plots Qwen3-Next's cache "
     "against the context, as it is (three linear layers to one attention layer), all linear and all attention. "
     "The table's uncached / cached is the whole generation's time without the cache over its time with it: how "
     "many times the cache sped this run up.",
     ("kv_cache",), ("kv_cache",)),
    ("attention-wiring", "2. Attention wiring: MHA, GQA, MQA",
     "Which K/V head each query head reads, found by zeroing one K/V head's value projection at a time and seeing "
     "which query heads' outputs move. Fewer K/V heads at the same width shrink the cache in proportion: MHA keeps "
     "one per query head, MQA one for all, GQA a group's.",
     ("attention_wiring",), ("wiring", "kv_heads")),
    ("attention-maps", "3. Attention maps",
     "The weights softmax(q·k/√D) of every layer and head on the prompt, query tokens down and key tokens across, "
     "and each head's entropy over ln(keys seen): 1 is uniform attention, 0 is all of it on one key. A Post-Norm or "
     "position=none model shows what the ablation's diagnostics found there, a near-uniform first layer. A Gated "
     "DeltaNet layer has no softmax: its map is the gate-faded q_i·k_j (Γ_i/Γ_j, j ≤ i) its state would read "
     "if the delta rule corrected nothing, on a red-blue scale centred on 0, and it has no entropy.",
     ("attention_maps", "attention_entropy"), ("entropy",)),
    ("positions", "4. Positions",
     "The same prompt read s positions later: with RoPE every layer's score of (q at m, k at n) stays the same up to "
     "rounding, since it depends on m − n only; absolute positions move it. Beside it the mean score against the "
     "distance m − n and, for an absolute table, the cosine between its positions' vectors.",
     ("shift_check", "score_distance", "position_table"), ("shift",)),
    ("residual-stream", "5. Norms and the residual stream",
     "Per block, on the prompt: the stream's rms, each branch's rms over the stream's, the mean cosine between "
     "positions, and the gradient norm of the block's weights for the prompt's next-token loss. Pre-Norm leaves the "
     "stream unnormalised, free to grow block by block, and gives the gradient an identity path to every block; "
     "Post-Norm renormalises the stream after each branch (rms near 1), so the gradient reaching the first blocks "
     "has passed through every norm above them. A branch / stream ratio is rms(the branch's output) over "
     "rms(the stream entering the block): above 1 the branch writes more than the stream carried. Block 0's is the "
     "one most free to be large: the stream entering it is the token embedding alone (rms 0.02 at GPT-2's "
     "initialisation), where a later block reads a stream the earlier branches have added to.",
     ("residual_stream",), ("stream",)),
    ("ffn", "6. FFN activations",
     "The distribution of the FFN's hidden activations on the prompt, a panel per checkpoint: SwiGLU's gate "
     "silu(x·W1), ReLU's, GELU's, or ReLU²'s relu(x·W1)², and the fraction of the units at zero or near it. ReLU "
     "and ReLU² zero every negative input exactly; SiLU and GELU let small negative values through, so the gate is "
     "rarely exactly closed. ReLU² squares what is left, so its few large inputs grow far past the many small ones: "
     "most of its units lie near zero beside the layer's rms, and its right tail reaches far past the panel's 99.9% "
     "quantile, which the panel states (the share beyond the axis and the largest value) instead of drawing.",
     ("ffn",), ("ffn",)),
    ("past-context", "7. Past the trained context",
     "The val split's bits per byte at each position of windows 1, 2 and 4 times the trained context, cut into "
     "non-overlapping chunks (evaluate.py's chunked mode; insight/lengths.py). Inside the context the loss falls as "
     "a token has more tokens before it; past it (dashed line) RoPE and the sinusoidal table meet angles that "
     "training never showed, and how the loss moves there is what docs/long_context.md measures, with the RoPE "
     "scalings that stretch a context (Position Interpolation, NTK-aware, YaRN). A learned table has no positions "
     "past its own; a checkpoint outside a training run dir has no val split to score.",
     ("lengths",), ("lengths",)),
    ("qk-norm", "8. QK-norm: the attention logits' scale",
     "Per layer, the largest attention logit |q·k|/√D that softmax reads (every head, causal pairs only) over the "
     "val split's windows at the trained context, the ones section 7 scores at 1x (the prompt for a checkpoint "
     "outside a training run). QK-norm (model.qk_norm=rmsnorm) RMS-normalises each q and k head before RoPE, so no "
     "logit can exceed √D·max|g_q|·max|g_k|, the bound column, whatever the projections do. Beside it the same "
     "logits with the norm bypassed: q and k straight from their projections, then RoPE, on the same block inputs. "
     "The norm makes the output blind to that raw scale, so training leaves it free to drift; the gap between the "
     "two columns is what the norm removes. A checkpoint without QK-norm has the as-trained column only: it has no "
     "norm to bypass and no gains to bound its logits, which its projections can grow without limit (at a high "
     "learning rate the logits blow up and softmax saturates). The chapter predates QK-norm (OLMo 2, Gemma 3, "
     "Qwen3 use it).",
     ("qk_logits",), ("qk_logits",)),
    ("experts", "9. Mixture of experts: the routing",
     "For a checkpoint with ffn=moe (model/moe.py), on the val windows of section 8 (or the prompt): how each MoE "
     "block's router spreads the tokens' k choices over its E experts (balance is 1/E each; MaxVio, the largest "
     "load over the mean minus 1, is 0 there), and the tokens each expert is chosen for most often, each with the "
     "share of that token's occurrences that chose it (k/E by chance, 1 when the expert takes it every time): "
     "an expert that takes a token far above chance has specialised in it. A dense checkpoint has no row.",
     ("experts",), ("experts",)),
]

CACHE_KINDS = [kind.PER_POSITION for kind in ATTENTION_KINDS]  # what one position costs in a layer, by attention kind
CACHE_FIELDS = {field.name: field for kind in CACHE_KINDS for field in kind.fields}  # a width kinds share, once
ESTIMATOR_FIELDS = (("layers", "layers L"), *((field.name, field.label) for field in CACHE_FIELDS.values()),
                    ("seq", "sequence length S"), ("batch", "batch"), ("window", "window W (0: none)"),
                    ("local_layers", "local layers L_w"), ("linear_layers", "linear layers L_s"))
# fields that may be 0 (e.g. MLA's RoPE key, without RoPE), no window, no local or linear layer
WHOLE = (*(name for name, field in CACHE_FIELDS.items() if field.least == 0), "window", "local_layers",
         "linear_layers")
# the page's script computes each kind's cost of one position, and of a linear layer's fixed state, from its fields
# and terms (model/kv_cache.py)
PER_POSITION = {kind.name: {"fields": [field.name for field in kind.fields], "terms": kind.terms,
                            "state_terms": kind.state_terms} for kind in CACHE_KINDS}


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def tables(report: dict) -> dict[str, dict]:
    """Each table as {"columns": [...], "rows": [[...]]}: the page shows them, W&B gets them as wandb.Table."""
    rows = {name: [] for name in ("kv_cache", "wiring", "kv_heads", "entropy", "shift", "stream", "ffn", "lengths",
                                  "qk_logits", "experts")}
    for ckpt in report["checkpoints"]:
        label = ckpt["label"]
        kv = ckpt["kv_cache"]
        rows["kv_cache"].append([label, f"{kv['positions'][0]}-{kv['positions'][-1]}", _ms(kv["cached_s"][0]),
                                 _ms(kv["cached_s"][-1]), _ms(kv["uncached_s"][0]), _ms(kv["uncached_s"][-1]),
                                 round(sum(kv["uncached_s"]) / sum(kv["cached_s"]), 2), kv["cache_bytes"],
                                 kv["cache_bytes_per_token"]])
        reads = ckpt["attention_wiring"]["reads"]
        for j in sorted({j for js in reads for j in js}):
            rows["wiring"].append([label, j, " ".join(f"q{h}" for h, js in enumerate(reads) if j in js)])
        for size in ckpt["attention_wiring"]["cache_by_kv_heads"]:
            rows["kv_heads"].append([label, size["attention"], size["kv_heads"], size["bytes"],
                                     "yes" if size["this_model"] else ""])
        for layer, entropy in enumerate(ckpt["attention_maps"]["entropy"]):
            if None in entropy:  # a layer without softmax: its map has no entropy
                rows["entropy"].append([label, layer, "no softmax (a linear layer)", None])
            else:
                rows["entropy"].append([label, layer, " ".join(f"{e:.3f}" for e in entropy),
                                        round(sum(entropy) / len(entropy), 4)])
        check = ckpt["positions"]["shift_check"]
        for shift in check["shifts"]:
            differences = [d for d in shift["max_abs_diff"] if d is not None]  # the layers with softmax scores
            rows["shift"].append([label, ckpt["model"]["position"], check["tokens"], shift["shift"],
                                  max(differences, default=None),
                                  max((s for s in check["max_abs_score"] if s is not None), default=None)])
        stream = ckpt["residual_stream"]
        for block in range(len(stream["stream_rms"])):
            rows["stream"].append([label, block] + [stream[key][block] for key in STREAM_STATS])
        for layer, (zero, near) in enumerate(zip(ckpt["ffn"]["zero"], ckpt["ffn"]["near_zero"])):
            rows["ffn"].append([label, ckpt["ffn"]["kind"], layer, zero, near])
        lengths = ckpt["past_context"]
        if "unavailable" in lengths:
            rows["lengths"].append([label, None, None, None, None, None, lengths["unavailable"]])
        for result in lengths.get("results", []):
            inside = [b for b in result["buckets"] if b["end"] <= lengths["context_length"]]
            past = [b for b in result["buckets"] if b["start"] >= lengths["context_length"]]
            rows["lengths"].append([label, result["length"], result["length"] / lengths["context_length"],
                                    round(result["val_bpb"], 4), _mean_bpb(inside), _mean_bpb(past), ""])
        scale = ckpt["qk_logits"]
        for layer, as_trained in enumerate(scale["as_trained"]):
            rows["qk_logits"].append([label, scale["qk_norm"], layer, _read_on(scale), as_trained,
                                      scale["bypassed"][layer] if scale["bypassed"] else None,
                                      scale["bound"][layer] if scale["bound"] else None])
        for block in (ckpt.get("experts") or {}).get("blocks", []):
            for e, (load, top) in enumerate(zip(block["load"], block["top_tokens"])):
                rows["experts"].append([label, block["block"], round(block["max_vio"], 4), e, round(load, 4),
                                        ", ".join(f"{t['token']} ({t['count']}, {t['share']:.0%})" for t in top)])
    columns = {
        "kv_cache": ["checkpoint", "positions", "cached ms/token, first", "cached ms/token, last",
                     "uncached ms/token, first", "uncached ms/token, last", "uncached / cached, whole run",
                     "cache bytes (allocated: fp32, full context)", "cache bytes per token"],
        "wiring": ["checkpoint", "K/V head", "query heads that read it (measured)"],
        "kv_heads": ["checkpoint", "attention", "K/V heads", "cache bytes (fp32, full context)", "this model"],
        "entropy": ["checkpoint", "layer", "entropy per head", "mean"],
        "shift": ["checkpoint", "position", "tokens", "shift s", "largest |score difference|, any layer (float64)",
                  "largest |score|"],
        "stream": ["checkpoint", "block", "stream rms", "attention / stream", "FFN / stream", "cos between positions",
                   "gradient norm"],  # STREAM_STATS, in its order
        "ffn": ["checkpoint", "FFN", "layer", "fraction exactly 0", f"fraction |a| < {NEAR_ZERO} rms"],
        "lengths": ["checkpoint", "window (tokens)", "x trained context", "val bpb, chunked",
                    "positions inside the context", "positions past it", "note"],
        "qk_logits": ["checkpoint", "QK-norm", "layer", "read on", "max |q·k|/√D as trained",
                      "max |q·k|/√D, norm bypassed", "bound √D·max|g_q|·max|g_k|"],
        "experts": ["checkpoint", "block", "MaxVio", "expert", "load (share of the choices)",
                    "its most frequent tokens (count, share of the token's occurrences)"],
    }
    # the experts' table only where a checkpoint has experts: a dense report has no section 9
    return {name: {"columns": columns[name], "rows": rows[name]} for name in rows if rows[name] or name != "experts"}


def _read_on(scale: dict) -> str:
    if scale["source"] == "val":
        return f"val split, {scale['windows']} windows of {scale['window_tokens']} tokens"
    return f"the prompt, {scale['window_tokens']} tokens (no val split)"


def _mean_bpb(buckets: list[dict]) -> float | None:
    tokens = sum(b["tokens"] for b in buckets)
    return round(sum(b["val_bpb"] * b["tokens"] for b in buckets) / tokens, 4) if tokens else None


def _cell(value) -> str:
    if value is None:  # nothing measured there
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


def _table(table: dict) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table["columns"])
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in table["rows"])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image(name: str, data: bytes) -> str:
    """The figure embedded, as a link to its PNG file beside the page (full size)."""
    return (f'<a href="{html.escape(name)}"><img src="data:image/png;base64,{base64.b64encode(data).decode()}" '
            f'alt="{html.escape(name)}" title="{html.escape(name)}: click for full size"></a>')


def _estimator(estimator: dict) -> str:
    first = estimator["presets"][0]
    fields = "".join(f'<label>{text} <input id="est-{key}" type="number" min="{int(key not in WHOLE)}" step="1" '
                     f'value="{first.get(key, "")}"></label>' for key, text in ESTIMATOR_FIELDS)
    kinds = "".join(f'<option value="{kind.name}"{" selected" if kind.name == first["cache"] else ""}>{kind.label}'
                    f'</option>' for kind in CACHE_KINDS)
    per_position = ", or ".join(f"{kind.formula(' × ')} for {kind.label}" for kind in CACHE_KINDS)
    dtypes = "".join(f'<option value="{d}"{" selected" if d == first["dtype"] else ""}>{d} ({b} bytes)</option>'
                     for d, b in estimator["bytes_per_element"].items())
    buttons = "".join(f'<button type="button" data-preset="{i}">{html.escape(p["name"])}</button>'
                      for i, p in enumerate(estimator["presets"]))
    return f"""<form id="estimator" onsubmit="return false">
<h3>KV-cache estimator</h3>
<p class="formula">bytes = (((L − L_w − L_s) × S + L_w × min(W, S)) × ({per_position}) + L_s × a linear layer's state) × batch × bytes per element</p>
<div class="fields"><label>cache <select id="est-cache">{kinds}</select></label>{fields}<label>dtype <select id="est-dtype">{dtypes}</select></label></div>
<div class="presets">{buttons}</div>
<p class="result"><output id="est-bytes"></output> bytes = <output id="est-gb"></output></p>
</form>
<script>
const BYTES_PER_ELEMENT = {json.dumps(estimator["bytes_per_element"])};
const PRESETS = {json.dumps(estimator["presets"])};
const FIELDS = {json.dumps([key for key, _ in ESTIMATOR_FIELDS])};
const PER_POSITION = {json.dumps(PER_POSITION)};
const WHOLE = {json.dumps(WHOLE)};
function refuse(message) {{
  document.getElementById("est-bytes").textContent = message;
  document.getElementById("est-gb").textContent = "";
}}
function recompute() {{
  const cache = document.getElementById("est-cache").value, n = {{}};
  for (const key of ["layers", ...PER_POSITION[cache].fields, "seq", "batch", "window", "local_layers", "linear_layers"]) {{
    const text = document.getElementById("est-" + key).value.trim();
    const zero = WHOLE.includes(key);  // MLA without RoPE has no RoPE key; 0 windows, 0 local layers
    if (!(zero ? /^(0|[1-9][0-9]*)$/ : /^[1-9][0-9]*$/).test(text)) {{
      return refuse(key + " must be a " + (zero ? "non-negative" : "positive") + " integer");
    }}
    n[key] = BigInt(text);
  }}
  if (n.local_layers > n.layers) return refuse("local_layers must be at most layers");
  const local = n.window > 0n ? n.local_layers : 0n;  // without a window every layer holds S positions
  if (local + n.linear_layers > n.layers) return refuse("linear_layers must be at most the layers that are not local");
  if (n.linear_layers > 0n && !PER_POSITION[cache].state_terms.length) return refuse("this cache has no fixed state: linear_layers must be 0");
  const held = n.window > 0n && n.window < n.seq ? n.window : n.seq;
  const slots = (n.layers - local - n.linear_layers) * n.seq + local * held;
  // a sum of terms, each a coefficient times a product of fields
  const sum = terms => terms.reduce(
    (total, [coefficient, names]) => total + names.reduce((product, name) => product * n[name], BigInt(coefficient)), 0n);
  const elements = slots * sum(PER_POSITION[cache].terms) + n.linear_layers * sum(PER_POSITION[cache].state_terms);
  const bytes = elements * n.batch * BigInt(BYTES_PER_ELEMENT[document.getElementById("est-dtype").value]);
  document.getElementById("est-bytes").textContent = bytes.toLocaleString("en-US");
  document.getElementById("est-gb").textContent = readable(Number(bytes));
}}
function readable(n) {{  // the largest unit that shows it to two decimals: 0.54 GB, 0.13 MB
  for (const [size, unit] of [[1e9, "GB"], [1e6, "MB"], [1e3, "kB"]]) {{
    if (n >= size / 100) return (n / size).toFixed(2) + " " + unit;
  }}
  return n + " bytes";
}}
function fill(preset) {{
  for (const key of FIELDS) if (key in preset) document.getElementById("est-" + key).value = preset[key];
  document.getElementById("est-cache").value = preset.cache;
  document.getElementById("est-dtype").value = preset.dtype;
  recompute();
}}
document.getElementById("estimator").addEventListener("input", recompute);
document.getElementById("estimator").addEventListener("change", recompute);
for (const button of document.querySelectorAll("#estimator button")) {{
  button.addEventListener("click", () => fill(PRESETS[Number(button.dataset.preset)]));
}}
recompute();
</script>"""


STYLE = """body { font-family: system-ui, sans-serif; max-width: 1400px; margin: 1em auto; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } section { border-top: 1px solid #ccc; margin-top: 1.5em; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
.side { display: flex; gap: 1em; align-items: flex-start; } .side a { flex: 0 1 auto; min-width: 0; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; } th { background: #f3f3f3; }
td:first-child { text-align: left; }
code, .tokens { font-family: ui-monospace, monospace; } .tokens span { background: #eef; margin: 1px; padding: 0 2px; }
#estimator { background: #f7f7f2; padding: 0.5em 1em; border: 1px solid #ddd; max-width: 60em; }
#estimator label { margin-right: 1em; white-space: nowrap; } #estimator input { width: 6em; }
#estimator .presets { margin: 0.5em 0; } #estimator button { margin-right: 0.5em; }
.result { font-size: 1.2em; font-weight: bold; } .formula { font-family: ui-monospace, monospace; }"""


SWITCHES = ("norm", "norm_position", "position", "attention", "qk_norm", "ffn")
SIZES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "context_length")


def _checkpoint_row(ckpt: dict) -> str:
    switches, sizes = (", ".join(f"{key}={ckpt['model'][key]}" for key in keys) for keys in (SWITCHES, SIZES))
    return (f"<tr><td>{html.escape(ckpt['label'])}</td><td><code>{html.escape(ckpt['path'])}</code></td>"
            f"<td>{html.escape(switches)}</td><td>{sizes}</td><td>{ckpt['num_params']:,}</td></tr>")


def render(report: dict, figures: dict[str, bytes]) -> str:
    """The whole page: the checkpoints and the prompt, then each section's text, figures and tables."""
    all_tables = tables(report)
    checkpoints = "".join(_checkpoint_row(c) for c in report["checkpoints"])
    tokens = "".join(f"<span>{html.escape(t)}</span>" for t in report["tokens"])
    parts = [f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nanollama report</title>
<link rel="icon" href="data:,"><style>{STYLE}</style></head><body>
<h1>Inside the checkpoint{'s' if len(report['checkpoints']) > 1 else ''}</h1>
<p>Every number below is measured on these checkpoints (<code>python report.py</code>; all of them are in
<code>report.json</code> beside this page). Sections follow the chapter's demos, in its order.</p>
<table><thead><tr><th>label</th><th>checkpoint</th><th>switches</th><th>sizes</th><th>parameters</th></tr></thead>
<tbody>{checkpoints}</tbody></table>
<p>Prompt: <code>{html.escape(repr(report['prompt']))}</code>, {len(report['tokens'])} tokens with BOS:
<span class="tokens">{tokens}</span></p>"""]
    for section_id, title, text, prefixes, table_names in SECTIONS:
        if not all(name in all_tables for name in table_names):  # section 9 without a checkpoint with experts
            continue
        rows = ["".join(_image(name, data) for name, data in figures.items() if name.startswith(prefix))
                for prefix in prefixes]  # one row per figure; a figure drawn per checkpoint, side by side
        parts.append(f'<section id="{section_id}"><h2>{html.escape(title)}</h2><p>{html.escape(text)}</p>'
                     + "".join(f'<div class="side">{row}</div>' for row in rows if row)
                     + (_estimator(report["estimator"]) if section_id == "kv-cache" else "")
                     + "".join(_table(all_tables[name]) for name in table_names) + "</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
