"""Text from a model: the prompt encoded, tokens sampled on the model's device, decoded.

`tokenizer` is any object with encode(text).ids, token_to_id and decode (tokenizers'
Tokenizer); the run's dashboard samples and `gpt2-tui sample` both generate here.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.train.model import GPT


def generate_text(
    model: GPT,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int | None = None,
) -> str:
    device = next(model.parameters()).device
    ids = tokenizer.encode(prompt).ids
    if not ids:  # an empty prompt starts after a document boundary
        eot = tokenizer.token_to_id("<|endoftext|>")
        ids = [eot if eot is not None else 0]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed) if seed is not None else gen.seed()
    x = torch.tensor([ids], dtype=torch.long, device=device)
    out = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist(), skip_special_tokens=False)
