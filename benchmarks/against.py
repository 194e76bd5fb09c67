"""--against DIR: this tree's model against the same model of another checkout, in one process on the same
weights, each through its own loss, AdamW and Engine."""
from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig
from torch import nn

from benchmarks.decode import our_generation
from benchmarks.sizes import Sizes
from benchmarks.timing import Device, speed_rows, speed_table, timed_alternately
from benchmarks.train_steps import Peer, peer, tokens_per_step
from errors import UsageError
from model import ModelConfig, Transformer
from training.config import model_config


REPO = Path(__file__).resolve().parents[1]


def own_modules(root: Path) -> Callable[[], dict]:
    """A function giving the loaded modules that either tree names as its own (model, training.optim, errors, ...)."""
    tops = {p.stem for base in (REPO, root) for p in base.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").is_file()}
    return lambda: {key: module for key, module in sys.modules.items() if key.partition(".")[0] in tops}


@contextmanager
def modules_of(root: Path):
    """Inside, an import of a module both trees name (`model`, `training.optim`) imports the checkout at root's.
    Its modules import each other by those same absolute names, so they cannot be loaded under other names beside
    ours: this tree's are set aside in the meantime and put back after, and the other tree's objects keep theirs."""
    loaded = own_modules(root)
    ours = loaded()
    for key in ours:
        del sys.modules[key]
    sys.path.insert(0, str(root))
    try:
        yield loaded
    finally:
        sys.path.remove(str(root))
        for key in loaded():
            del sys.modules[key]
        sys.modules.update(ours)


def import_tree(root: Path, names: tuple[str, ...]) -> list:
    """The modules `names` of the checkout at root, imported from its own files. A module that would come from
    anywhere else (a file the other tree lacks, found in this one) is refused."""
    with modules_of(root) as loaded:
        try:
            modules = [importlib.import_module(name) for name in names]
        except (ImportError, SyntaxError) as e:
            raise UsageError(f"--against={root}: cannot import its {' and '.join(names)}: {e}") from None
        strays = sorted(key for key, module in loaded().items()
                        if not Path(getattr(module, "__file__", None) or root).resolve().is_relative_to(root.resolve()))
        if strays:
            raise UsageError(f"--against={root}: {', '.join(strays)} came from outside it")
        return modules


@dataclass
class OtherTree:
    """Another checkout's model, training loss, optimizer and generation engine: what this tree's rows use."""
    root: Path
    config_class: type
    transformer: type
    loss_of: Callable
    make_optimizer: Callable
    engine: type

    @classmethod
    def load(cls, root: Path) -> "OtherTree":
        model, evaluate, optim, engine = import_tree(
            root, ("model", "training.evaluate", "training.optim", "generation.engine"))
        return cls(root, model.ModelConfig, model.Transformer, evaluate.next_token_loss, optim.make_optimizer,
                   engine.Engine)

    def twin(self, ours: Transformer) -> nn.Module:
        """Its model of our model's settings, with our weights; a setting it lacks must be at our default."""
        accepted, defaults = {f.name for f in fields(self.config_class)}, ModelConfig()
        settings = ours.cfg.to_dict()
        lacking = [f"model.{key}={value}" for key, value in settings.items()
                   if key not in accepted and value != getattr(defaults, key)]
        if lacking:
            raise UsageError(f"--against={self.root}: its ModelConfig has no {', '.join(lacking)}")
        if "attention" in accepted:  # older trees store the attention's name beside n_kv_heads
            settings["attention"] = ours.cfg.attention
        try:  # its own checks raise its own error classes, not ours
            model = self.transformer(self.config_class(**{k: v for k, v in settings.items() if k in accepted}))
            model.load_state_dict(ours.state_dict())
        except Exception as e:
            raise UsageError(f"--against={self.root}: it cannot build this model with its weights: "
                             f"{str(e).splitlines()[0]}") from None
        return model.to(ours.tok_emb.weight.device)


# The two trees' logits on the same weights and inputs: float32 through a few layers of reordered sums moves them
# by ~1e-6 of their scale, a model that computes something else by its whole scale; 1e-4 of it lies between.
SAME_LOGITS = 1e-4


def against_peers(other: OtherTree, settings: DictConfig, device: Device) -> dict[str, Peer]:
    """This tree's model of the settings and the other tree's twin, each with its own loss and AdamW, on one batch;
    refused unless both compute the same logits (else the A/B would time two models)."""
    ours = Transformer(model_config(settings)).to(device.name)
    theirs, mine = other.twin(ours), peer(ours, settings, device)
    with torch.no_grad(), device.autocast():
        logits = ours(mine.tokens[:, :-1])
        difference = (logits - theirs(mine.tokens[:, :-1])).abs().max().item()
    scale = logits.abs().max().item()
    if not difference <= SAME_LOGITS * scale:
        raise UsageError(f"--against={other.root}: its model's logits differ from this tree's by {difference:.3g} "
                         f"on the same weights (largest logit {scale:.3g}): it is another model")
    return {"this tree": mine, str(other.root): Peer(theirs, partial(other.loss_of, theirs), ours,
                                                     other.make_optimizer(theirs, settings.train), mine.tokens)}


def bench_against(other: OtherTree, peers: dict[str, Peer], sizes: Sizes, repeats: int, device: Device) -> dict:
    """The two trees' training steps, then their KV-cache decode at each batch, alternating."""
    label, ours = str(other.root), peers["this tree"].model
    seconds, _, _ = timed_alternately(f"training, this tree and {label}",
                                      {name: partial(p.step, device) for name, p in peers.items()}, repeats, device)
    results = {"against": label, "training": speed_rows(seconds, tokens_per_step(peers), label)}
    ours = Transformer(replace(ours.cfg, context_length=sizes.decode_context)).to(device.name).eval()
    theirs = other.twin(ours).eval()
    for batch in sizes.decode_batches:
        prompts = torch.randint(ours.cfg.vocab_size, (batch, sizes.prompt_tokens), device=device.name)
        seconds, last, _ = timed_alternately(f"decode, batch {batch}", {
            "this tree": our_generation(ours, prompts, sizes.new_tokens, True, device),
            label: our_generation(theirs, prompts, sizes.new_tokens, True, device, engine_class=other.engine)},
            repeats, device)
        results[f"decode_b{batch}"] = speed_rows(seconds, {name: batch * sizes.new_tokens for name in seconds}, label)
        # greedy tokens on the same weights: they part only on a near-tie of two logits
        results[f"decode_b{batch}_same_tokens"] = bool(torch.equal(last["this tree"][1], last[label][1]))
    return results


def against_tables(r: dict, sizes: Sizes) -> str:
    label = r["against"]
    tables = [speed_table(r["training"], "tree", label)]
    for batch in sizes.decode_batches:
        tables.append(speed_table(r[f"decode_b{batch}"], "tree", label, measure=f"decode tokens/s, batch {batch}")
                      + f"\n\nthe same {sizes.new_tokens} greedy tokens: {r[f'decode_b{batch}_same_tokens']}")
    return "\n\n".join(tables)
