"""Presets: the published GPT-2 shapes, and every preset valid as shipped."""

import pytest
import torch

from engine.config import ModelConfig, build, load_preset, preset_names
from engine.train.model import GPT

PUBLISHED = {  # parameters with GPT-2's 50257-id vocab, tied embeddings counted once
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_gpt2_presets_have_the_published_parameter_counts(name):
    model_cfg = ModelConfig(**load_preset(name)["model"], vocab_size=50257, pad_vocab=False)
    with torch.device("meta"):
        model = GPT(model_cfg)
    assert model.num_params() == PUBLISHED[name]


def test_every_preset_is_a_valid_run_config():
    names = preset_names()
    assert {"nano", "micro", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"} <= set(names)
    for name in names:
        cfg = build(load_preset(name))
        assert cfg.preset == name
        assert cfg.seq_len <= cfg.model.block_size
