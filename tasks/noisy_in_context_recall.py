"""Noisy in-context recall (MAD, Poli et al. 2024): in-context recall (tasks/in_context_recall.py) in which a
pair's slot holds two noise symbols instead, with probability data.noise:

    k v n n k v n n n n k v ...        noise from data.noise_vocab symbols of its own, after the content

The noise is never scored and never a key; a model must learn to pass over it. Chance: 2/V.
"""
from model.checks import is_number, is_whole
from tasks.in_context_recall import InContextRecall


class NoisyInContextRecall(InContextRecall):
    name = "noisy_in_context_recall"
    vocab_size = 16
    settings = {"noise": 0.2, "noise_vocab": 16}

    def noise_share(self) -> float:
        return self.values["noise"]

    @property
    def extra_symbols(self) -> int:
        return self.values["noise_vocab"]

    def validate(self) -> None:
        super().validate()
        noise, noise_vocab = self.values["noise"], self.values["noise_vocab"]
        self.needs(is_number(noise) and 0 <= noise < 1, f"data.noise={noise!r} must be in [0, 1)")
        self.needs(is_whole(noise_vocab),
                   f"data.noise_vocab={noise_vocab!r} must be a positive integer")
