"""python -m data [Hydra overrides]: build (or reuse) the tokenizer and token cache of a data config
and print what is in it, e.g. `python -m data data=text data.path='books/*.txt' data.vocab_size=8192`."""
import sys
import time

from omegaconf import OmegaConf

from cli import run_command
from data import prepare_data
from settings import compose_config


def main(overrides: list[str]) -> None:
    if status := run_command(lambda: prepare(overrides)):
        sys.exit(status)


def prepare(overrides: list[str]) -> None:
    cfg = compose_config(overrides)
    started = time.perf_counter()
    data = prepare_data(cfg.data, cfg.model.context_length, OmegaConf.select(cfg, "train.micro_batch_size", default=1))
    print(f"prepare_data: {time.perf_counter() - started:.2f} s, vocab {data.tokenizer.vocab_size}, cache {data.cache_dir}")
    for split, s in data.stats.items():
        print(f"{split}: {s['documents']} documents, {s['characters']:,} characters, {s['bytes']:,} bytes, "
              f"{s['tokens']:,} tokens, {data.bytes_per_token[split]:.3f} bytes/token")


if __name__ == "__main__":
    main(sys.argv[1:])
