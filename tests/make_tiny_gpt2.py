"""`python -m tests.make_tiny_gpt2 DIR`: a tiny random GPT-2 saved by transformers, with a
BPE tokenizer of its own, standing in for what the Hub's `gpt2` would give (issue 24).

It is what docs/training.md's "fine-tune GPT-2 on your text" walk-through and the tests start
from, offline: config.json + model.safetensors (save_pretrained) and tokenizer.json +
tokenizer_config.json (so AutoTokenizer loads it). Needs transformers (the test extras).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EOT = "<|endoftext|>"
TEXT = [
    "The quick brown fox jumps over the lazy dog. ",
    "A journey of a thousand miles begins with a single step. ",
    "To be or not to be, that is the question. ",
    "All that glitters is not gold; all who wander are not lost. ",
    "def add(a, b):\n    return a + b\n",
]


def make(out: Path, vocab_size: int = 384, n_layer: int = 2, n_head: int = 2, n_embd: int = 32, n_positions: int = 64) -> Path:
    """Write the tiny model directory at `out` (new or empty) and return it."""
    import torch
    import transformers

    from engine.prep.prepare import train_tokenizer

    tok = train_tokenizer([t * 20 for t in TEXT], vocab_size)
    V = tok.get_vocab_size()
    eot = tok.token_to_id(EOT)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions,
                                     vocab_size=V, bos_token_id=eot, eos_token_id=eot)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": n_positions,
               "bos_token": EOT, "eos_token": EOT, "unk_token": EOT}  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m tests.make_tiny_gpt2 DIR", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {make(Path(sys.argv[1]))}")
