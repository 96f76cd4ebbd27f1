"""Everything a user configures, as pydantic models, and how presets, files and flags merge.

A `RunConfig` is the whole truth about a run: it is written to the run directory as
`config.toml`, stored in every checkpoint, and rebuilt from there by `--resume`,
`sample` and `attach`. Precedence when building one: preset < config file < flags.
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from engine.errors import Invalid, Refusal, UserError
from engine.switch_matrix import check_config

Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
Attention = Literal["flash", "manual"]
Device = Literal["auto", "cuda", "mps", "cpu"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
# speed.tune_budget: a share of the planned steps ("20%"), steps ("60") or seconds ("90s")
TUNE_BUDGET = r"^(100(\.0+)?%|\d{1,2}(\.\d+)?%|[1-9]\d{0,6}s?)$"


def _tune_budget(text: str) -> str:
    if not re.fullmatch(TUNE_BUDGET, text):
        raise ValueError(f"{text!r} is no budget: give a share of the planned steps (20%), "
                         "steps (60) or seconds (90s)")
    return text


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a TOML file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# Upper bounds of the integer settings: far above any real run, far below int64 (what torch
# and numpy index with), so a huge number is refused in one line instead of overflowing later.
MAX_LAYERS = 1024
MAX_WIDTH = 2**17  # embedding width, heads
MAX_CONTEXT = 2**20  # tokens per sequence
MAX_VOCAB = 2**32  # uint32 token files
MAX_BATCH = 2**16  # sequences per micro-batch, micro-batches per step
MAX_STEPS = 10**12  # any step count or interval
MAX_COUNT = 10**6  # evals' batches, kept checkpoints, bad steps in a row
MAX_SAMPLE_TOKENS = 2**16
DEFAULT_VOCAB = 8192  # entries of the BPE `prepare` trains unless told (the default dataset's too)
SEED_LIMIT = 2**32  # seeds are 0 .. 2**32 - 1 (numpy's range)


# The setup form's sections, in the form's order (the speed switches first: what the product
# toggles, on the form's first screen); a setting without one keeps the preset's value.
WEIGHTS = "Starting weights"
BATCH = "Batch and schedule"
DEVICE = "Device"
SWITCH = "Speed switches"
RECIPE = "Recipe"  # the speedrun's tricks: each changes what is computed, so a change is a new run
FORM_SECTIONS = (SWITCH, DEVICE, BATCH, RECIPE, WEIGHTS)
# OpenAI's GPT-2 on the Hugging Face Hub (engine/prep/hf.py)
PRETRAINED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
LOGGERS = ("tensorboard", "wandb", "csv")  # engine/run/loggers.py


def _meta(form: str | None = None, live: bool = False, **more: Any) -> dict[str, Any]:
    """A setting's description beyond its type (engine.settings reads it): its form section,
    whether a live run may change it (a speed switch: engine.run.segments.SWITCHES), and
    optionally `flag` (a CLI flag other than `--field-name`; None = no flag), `label` (the
    form's name for it, other than the field's), `blank` (what a blank input means) and
    `metavar` (its value in `--help`). Where a switch sits on the speed ladder is the
    benchmark's business, not the engine's: bench/rungs.py."""
    return {"form": form, "live": live, **more}


class ModelConfig(_Strict):
    """GPT-2 shape and the model-side switches (attention kernel, padding, checkpointing)."""

    init_from: str | None = Field(
        None,
        min_length=1,
        description=(
            f"pretrained GPT-2 weights to start from: {', '.join(PRETRAINED)} (Hugging Face Hub, "
            "cached) or a transformers directory; they decide the shape (new runs only)"
        ),
        json_schema_extra=_meta(
            WEIGHTS,
            label="start from",
            metavar="NAME|DIR",
            blank="random weights",
        ),
    )
    n_layer: int = Field(
        12,
        ge=1,
        le=MAX_LAYERS,
        description="transformer blocks",
    )
    n_head: int = Field(
        12,
        ge=1,
        le=MAX_WIDTH,
        description="attention heads",
    )
    n_embd: int = Field(
        768,
        ge=1,
        le=MAX_WIDTH,
        description="embedding width",
    )
    block_size: int = Field(
        1024,
        ge=1,
        le=MAX_CONTEXT,
        description="the model's context length (positions)",
        json_schema_extra=_meta(flag="--context", label="model context"),
    )
    vocab_size: int | None = Field(
        None,
        ge=2,
        le=MAX_VOCAB,
        description="real vocabulary (default: the dataset's; nanoGPT/llm.c files: 50257)",
    )
    pad_vocab: bool = Field(
        True,
        description=(
            "pad the vocab to a multiple of 64, 50257 -> 50304 "
            "(reported 3-25% faster; docs/benchmarks.md)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    bias: bool = Field(
        True,
        description="biases in Linear and LayerNorm",
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="dropout probability",
    )
    attention: Attention = Field(
        "flash",
        description=(
            "flash = SDPA (reported ~1.35x, O(T) memory; docs/benchmarks.md); "
            "manual = masked softmax"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    grad_checkpointing: bool = Field(
        False,
        description=(
            "recompute each block in backward: less activation memory, ~30% more compute"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    loss: Literal["plain", "chunked", "auto"] = Field(
        "plain",
        description=(
            "chunked = the lm_head matmul and cross-entropy computed in row chunks, never holding "
            "the whole B x T x V logits (the largest memory item at GPT-2 sizes; docs/memory.md); "
            "auto = the device's choice: plain on a GPU where it fits, else chunked (as on a CPU)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    # The speedrun's architecture switches (modded-nanogpt); engine/train/model.py acts on each.
    mlp: Literal["gelu", "relu2"] = Field(
        "gelu",
        description="MLP activation: relu2 = relu(x)^2 "
        "(modded-nanogpt, with qk-norm and zero-init: -32%)",
        json_schema_extra=_meta(RECIPE),
    )
    qk_norm: bool = Field(
        False,
        description="RMS-norm q and k per head before attention "
        "(modded-nanogpt, with relu2 and zero-init: -32%)",
        json_schema_extra=_meta(RECIPE),
    )
    positions: Literal["learned", "rotary"] = Field(
        "learned",
        description="rotary = rotary embeddings on q, k (no learned position table; "
        "modded-nanogpt: -30% with a tuned lr)",
        json_schema_extra=_meta(RECIPE),
    )
    tie_head: bool = Field(
        True,
        description="lm_head shares wte's matrix; off: its own "
        "(modded-nanogpt's untied head: -10%)",
        json_schema_extra=_meta(RECIPE),
    )
    zero_init_proj: bool = Field(
        False,
        description="attention's and MLP's output projections (and an untied head) start at 0 "
        "(modded-nanogpt, with relu2 and qk-norm: -32%)",
        json_schema_extra=_meta(RECIPE),
    )
    logit_softcap: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="tanh cap on the logits: c * tanh(logits / c) (modded-nanogpt: 30; with "
        "value residual and momentum warm-up: -24%)",
        json_schema_extra=_meta(RECIPE, blank="no cap"),
    )
    value_embeds: bool = Field(
        False,
        description="an extra embedding table whose output is mixed into the values of the first "
        "and last layers (modded-nanogpt: -15%)",
        json_schema_extra=_meta(RECIPE),
    )
    unet_skips: bool = Field(
        False,
        description="the first half's block outputs added, with learned weights, to the second "
        "half's inputs in reverse order (modded-nanogpt: -8%)",
        json_schema_extra=_meta(RECIPE),
    )
    value_residual: bool = Field(
        False,
        description="each layer's v mixed with the first layer's v by a learned lambda "
        "(modded-nanogpt, with softcap and momentum warm-up: -24%)",
        json_schema_extra=_meta(RECIPE),
    )
    attn_window: int | None = Field(
        None,
        ge=1,
        le=MAX_CONTEXT,
        description="sliding-window attention: each token sees at most this many before it "
        "(modded-nanogpt's document-masked and windowed attention: -30%)",
        json_schema_extra=_meta(RECIPE, blank="the whole context"),
    )
    fp8_head: bool = Field(
        False,
        description="lm_head matmul in FP8 (modded-nanogpt, Hopper: -8%); not built yet: refused",
        json_schema_extra=_meta(RECIPE),
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        if self.positions == "rotary" and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"rotary positions need an even head size; n_embd {self.n_embd} / n_head "
                f"{self.n_head} is {self.n_embd // self.n_head}"
            )
        return self

    @property
    def padded_vocab_size(self) -> int:
        assert self.vocab_size is not None, "vocab_size is resolved from the dataset first"
        return -(-self.vocab_size // 64) * 64 if self.pad_vocab else self.vocab_size

    # Where each recipe switch acts, declared once: the model (engine/train/model.py) builds from
    # these, and the parameter count, the estimator and the FLOP count read them, so none of them
    # re-derives which layers a switch touches (tests/train/test_recipe_model.py checks all three
    # against the real model, for every recipe switch this class declares).
    @property
    def value_embed_layers(self) -> frozenset[int]:
        """The layers whose v gets the value embedding (a learned gate each): the first and last."""
        return frozenset({0, self.n_layer - 1}) if self.value_embeds else frozenset()

    @property
    def value_residual_layers(self) -> frozenset[int]:
        """The layers mixing their v with the first one's (a learned lambda each): all after it."""
        return frozenset(range(1, self.n_layer)) if self.value_residual else frozenset()

    @property
    def unet_skip_count(self) -> int:
        """U-net skips: the first half's outputs, a learned weight each, into the second half."""
        return self.n_layer // 2 if self.unet_skips else 0

    @property
    def learned_scalars(self) -> int:
        """The recipe's learned mixing weights (1-D parameters): skips, gates and lambdas."""
        return self.unet_skip_count + len(self.value_embed_layers) + len(self.value_residual_layers)

    @property
    def vocab_tables(self) -> int:
        """(Vp x C) matrices: wte (the lm_head when tied), an untied lm_head, value embeddings."""
        return 1 + (not self.tie_head) + self.value_embeds

    def n_params(self, vocab_size: int | None = None) -> int:
        """GPT-2's parameter count (tied embedding once), in closed form: instant for any size.
        Per block: 12 C^2 weights, plus 13 C of biases and LayerNorms (2 C without biases);
        the recipe switches add their tables (untied head, value embeds), drop wpe (rotary)
        and add their learned scalars. `vocab_size` stands in while the dataset has not
        decided it."""
        vocab = self.vocab_size or vocab_size
        assert vocab is not None, "vocab_size is resolved from the dataset first"
        v = -(-vocab // 64) * 64 if self.pad_vocab else vocab
        C, L = self.n_embd, self.n_layer
        per_block = 12 * C * C + (13 if self.bias else 2) * C
        wpe = self.block_size * C if self.positions == "learned" else 0
        final_norm = (2 if self.bias else 1) * C
        return self.vocab_tables * v * C + wpe + L * per_block + final_norm + self.learned_scalars


class DataConfig(_Strict):
    """Where tokens come from and how batches are built."""

    path: str | None = Field(
        None,
        description=(
            "dataset directory (ours, nanoGPT train.bin/val.bin, or llm.c shards); "
            "default: the stdlib corpus"
        ),
        json_schema_extra=_meta(flag="--data", label="dataset"),
    )
    vocab_size: int = Field(
        50257,
        ge=2,
        le=MAX_VOCAB,
        description="vocab of nanoGPT/llm.c files, which carry none",
        json_schema_extra=_meta(flag=None),
    )
    preload: bool = Field(
        True,
        description=(
            "read the token files into RAM instead of reading each batch from disk "
            "(reported 2-3x faster random reads)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    vectorized: bool = Field(
        True,
        description=(
            "build a batch in one numpy gather, not a per-row Python loop (docs/benchmarks.md)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    pin_memory: bool = Field(
        True,
        description="pinned host buffers + non_blocking copies (CUDA)",
        json_schema_extra=_meta(SWITCH, live=True),
    )
    prefetch: bool = Field(
        True,
        description=(
            "build the next batch on a background thread while a GPU computes (ignored on CPU)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    align_docs: bool = Field(
        False,
        description="each training row starts at a document start, after an end-of-text token "
        "(modded-nanogpt); needs a dataset that records its end-of-text id",
        json_schema_extra=_meta(RECIPE),
    )


class OptimConfig(_Strict):
    """The optimizer (AdamW, or Muon for the blocks' matrices + AdamW for the rest) and the LR
    schedule: linear warmup, then cosine to min_lr, or warmup-stable-decay (wsd)."""

    lr: float = Field(
        6e-4,
        gt=0,
        allow_inf_nan=False,
        description=(
            "peak learning rate (AdamW's; with optimizer muon, "
            "the embeddings', lm_head's and 1-D parameters')"
        ),
        json_schema_extra=_meta(BATCH),
    )
    min_lr: float = Field(
        6e-5,
        ge=0,
        allow_inf_nan=False,
        description="learning rate at the end of the decay",
        json_schema_extra=_meta(BATCH),
    )
    warmup_steps: int = Field(
        100,
        ge=0,
        le=MAX_STEPS,
        description="linear warmup steps",
        json_schema_extra=_meta(BATCH),
    )
    decay_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="step where the decay reaches min-lr (default: max-steps)",
    )
    schedule: Literal["cosine", "wsd"] = Field(
        "cosine",
        description=(
            "cosine = warmup, then cosine down to min-lr at decay-steps; wsd = warmup, a stable "
            "phase at the peak lr, then a linear decay to min-lr over the last decay-fraction of "
            "the steps (a run extended at resume keeps every earlier step's lr: only a decay not "
            "yet begun moves to the new end)"
        ),
        json_schema_extra=_meta(BATCH),
    )
    decay_fraction: float = Field(
        0.2,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description=(
            "schedule wsd: the share of the steps (to decay-steps, "
            "default max-steps) spent decaying to min-lr"
        ),
        json_schema_extra=_meta(BATCH),
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description=(
            "adamw = AdamW for every parameter; muon = Muon (momentum orthogonalized by "
            "Newton-Schulz; modded-nanogpt reaches GPT-2's loss in fewer steps with it) for the "
            "2-D weight matrices inside the transformer blocks at --muon-lr, AdamW at --lr for the "
            "embeddings, the tied lm_head and the 1-D parameters; Muon keeps one state buffer per "
            "weight instead of AdamW's two. Not a live switch: the optimizer state differs, so a "
            "change is a new run, not a toggle"
        ),
        json_schema_extra=_meta(BATCH),
    )
    muon_lr: float = Field(
        0.02,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Muon's peak learning rate (optimizer muon; modded-nanogpt's 0.02); "
            "the schedule scales it like --lr, its floor is min-lr x muon-lr / lr"
        ),
        json_schema_extra=_meta(BATCH),
    )
    muon_momentum: float = Field(
        0.95,
        ge=0,
        lt=1,
        description="Muon's (Nesterov) momentum (optimizer muon)",
        json_schema_extra=_meta(BATCH),
    )
    muon_momentum_warmup: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description=(
            "steps over which Muon's momentum ramps linearly from 0.85 to --muon-momentum "
            "(0 = off; optimizer muon; modded-nanogpt's momentum warm-up, with value residual and "
            "softcap: -24%)"
        ),
        json_schema_extra=_meta(RECIPE, label="momentum warm-up"),
    )
    weight_decay: float = Field(
        0.1,
        ge=0,
        allow_inf_nan=False,
        description=(
            "AdamW weight decay on its 2-D parameters (the matrices and embeddings; with "
            "optimizer muon the embeddings only: Muon's matrices take none, as in modded-nanogpt)"
        ),
    )
    beta1: float = Field(
        0.9,
        ge=0,
        lt=1,
        description="AdamW beta1",
    )
    beta2: float = Field(
        0.95,
        ge=0,
        lt=1,
        description="AdamW beta2",
    )
    eps: float = Field(
        1e-8,
        gt=0,
        allow_inf_nan=False,
        description="AdamW epsilon",
    )
    grad_clip: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="clip the global grad norm to this (0 = off)",
        json_schema_extra=_meta(BATCH),
    )
    fused: bool | None = Field(
        None,
        description=(
            "fused AdamW kernel (default: on for CUDA and CPU; off, the guard's skip copies "
            "what a step changes)"
        ),
        json_schema_extra=_meta(SWITCH, live=True, flag="--fused-adamw"),
    )

    def decay_end(self, max_steps: int) -> int:
        """The step where the lr reaches min_lr: decay_steps, else the run's max steps."""
        return self.decay_steps or max_steps

    def decay_start(self, max_steps: int) -> int:
        """The step the decay begins: the warmup's end for cosine; for wsd the start of the last
        decay_fraction of the steps to decay_end (never inside the warmup)."""
        end = self.decay_end(max_steps)
        if self.schedule == "cosine":
            return self.warmup_steps
        return max(self.warmup_steps, end - round(self.decay_fraction * end))

    @model_validator(mode="after")
    def _min_below_peak(self) -> OptimConfig:
        if self.min_lr > self.lr:
            raise Invalid(
                f"min_lr {self.min_lr} is above lr {self.lr}",
                {"optim.min_lr": f"{self.lr} or less"},
            )
        return self


# Settings that act only under one value of another: the wsd decay's size, Muon's own. Preflight
# warns when one is given without it (engine/run/preflight.py); compare shows them on the rows
# trained under it wherever that setting differs (engine/inspect/compare.py).
ONLY_UNDER: dict[str, tuple[str, str]] = {
    "optim.decay_fraction": ("optim.schedule", "wsd"),
    "optim.muon_lr": ("optim.optimizer", "muon"),
    "optim.muon_momentum": ("optim.optimizer", "muon"),
    "optim.muon_momentum_warmup": ("optim.optimizer", "muon"),
}


class SpeedConfig(_Strict):
    """Device and the compute switches."""

    device: Device = Field(
        "auto",
        description="where to train (auto: cuda > mps > cpu)",
        json_schema_extra=_meta(DEVICE),
    )
    precision: Precision = Field(
        "auto",
        description=(
            "auto = bf16 on GPUs that have it, else fp16 on CUDA, else fp32; reported on GPT-2: "
            "tf32 ~3x fp32 (Ampere+), bf16 ~1.1x more, fp16 uses a GradScaler (docs/benchmarks.md)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    compile: bool = Field(
        False,
        description=(
            "torch.compile (reported 1.5-2.3x; the first steps are slow while it compiles)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    compile_mode: CompileMode = Field(
        "default",
        description="torch.compile mode",
        json_schema_extra=_meta(SWITCH, live=True),
    )
    compile_scope: Literal["model", "blocks"] = Field(
        "blocks",
        description=(
            "what torch.compile compiles: blocks = one transformer block, reused by every layer, "
            "plus the loss head (a cold compile that does not grow with depth: 12-layer gpt2 on "
            "CPU 2.6x shorter, +1.6% ms/step); model = the whole forward as one graph (fusion "
            "across blocks, the longest compile; docs/benchmarks.md)"
        ),
        json_schema_extra=_meta(SWITCH, live=True),
    )
    tune: bool = Field(
        False,
        description=(
            "tune while training: try the live speed switches as segments, keep the fastest "
            "for the rest of the run and save it for this machine and model shape "
            "(docs/training.md)"
        ),
        json_schema_extra=_meta(DEVICE),
    )
    tune_budget: Annotated[str, AfterValidator(_tune_budget)] = Field(
        "20%",
        description=(
            "what --tune may spend exploring: a share of the planned steps (20%), steps (60) "
            "or seconds (90s)"
        ),
        json_schema_extra=_meta(DEVICE, metavar="N%|N|Ns"),
    )
    from_tuned: bool = Field(
        False,
        description=(
            "start from the switches --tune found fastest on this machine for this model shape and "
            "tokens per step (flags given with it win)"
        ),
        json_schema_extra=_meta(DEVICE),
    )
    parallel: Literal["auto", "ddp", "fsdp"] = Field(
        "auto",
        description=(
            "with --nproc/torchrun: ddp replicates the model, fsdp (FSDP2) shards it; "
            "auto = ddp unless the estimator says only a shard fits the GPU"
        ),
    )


class TrainConfig(_Strict):
    """Batch geometry, run length and bookkeeping intervals."""

    batch_size: int = Field(
        16,
        ge=1,
        le=MAX_BATCH,
        description="micro-batch: sequences per forward pass",
        json_schema_extra=_meta(BATCH, live=True),
    )
    block_size: int | None = Field(
        None,
        ge=1,
        le=MAX_CONTEXT,
        description="tokens per sequence (default: the model's context)",
        json_schema_extra=_meta(BATCH, blank="model context"),
    )
    grad_accum: int = Field(
        1,
        ge=1,
        le=MAX_BATCH,
        description="micro-batches per optimizer step",
        json_schema_extra=_meta(BATCH, live=True),
    )
    max_steps: int = Field(
        1000,
        ge=1,
        le=MAX_STEPS,
        description="optimizer steps to train to",
        json_schema_extra=_meta(BATCH),
    )
    max_time: float | None = Field(
        None,
        gt=0,
        le=10**7,
        allow_inf_nan=False,
        description="a wall-clock budget in seconds for this command: at the first step boundary "
        "past it the run saves a checkpoint and stops, as Ctrl-C does (`--resume` goes on)",
        json_schema_extra=_meta(metavar="SECONDS", blank="no limit"),
    )
    eval_interval: int = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description="steps between val-loss evals",
        json_schema_extra=_meta(BATCH),
    )
    eval_batches: int = Field(
        20,
        ge=1,
        le=MAX_COUNT,
        description="val batches per eval",
    )
    log_interval: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        description="steps between step reports (read a step late: the device never waits)",
    )
    ckpt_interval: int = Field(
        500,
        ge=1,
        le=MAX_STEPS,
        description="steps between checkpoints",
        json_schema_extra=_meta(BATCH),
    )
    keep_last: int = Field(
        3,
        ge=1,
        le=MAX_COUNT,
        description="checkpoints kept besides best.pt",
        json_schema_extra=_meta(BATCH),
    )
    seed: int = Field(
        1337,
        ge=0,
        lt=SEED_LIMIT,
        description="random seed (same seed + config on CPU = same loss curve)",
        json_schema_extra=_meta(BATCH),
    )
    sample_tokens: int = Field(
        48,
        ge=0,
        le=MAX_SAMPLE_TOKENS,
        description=(
            "tokens generated at each eval, shown in the dashboard and the console (0 = none)"
        ),
    )
    on_save_error: Literal["continue", "stop"] = Field(
        "continue",
        description=(
            "a checkpoint write fails (disk full, no permission): warn and retry "
            "at the next interval, or stop the run"
        ),
    )
    log: list[Literal["tensorboard", "wandb", "csv"]] = Field(
        [],
        description=(
            "also log what the dashboard shows to tensorboard (RUN/tensorboard), wandb (its env "
            "vars rule) or csv (RUN/metrics.csv); several allowed; events.jsonl stays the record"
        ),
    )
    max_bad_steps: int = Field(
        5,
        ge=1,
        le=MAX_COUNT,
        description=(
            "consecutive NaN/Inf steps (each skipped) before the run stops with a checkpoint "
            "of the last good state"
        ),
    )
    batch_ramp: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="steps over which the tokens per step ramp up to the full batch, by "
        "accumulating fewer micro-batches early (modded-nanogpt's batch-size schedule: -2%); "
        "0 = off",
        json_schema_extra=_meta(RECIPE),
    )

    @model_validator(mode="after")
    def _ramp_has_room(self) -> TrainConfig:
        """A ramp needs micro-batches to leave out (grad_accum > 1) and steps after it."""
        r, a, n = self.batch_ramp, self.grad_accum, self.max_steps
        if r and a == 1:
            raise Invalid(f"batch ramp {r} needs grad accumulation above 1: it ramps the "
                          "micro-batches a step accumulates", {"train.grad_accum": "2 or more"},
                          {"train.batch_ramp": 0})  # fmt: skip
        if r and r >= n:
            raise Invalid(f"batch ramp {r} is not below max steps {n}: the full batch would "
                          "never train", {"train.batch_ramp": f"{n - 1} or less"},
                          {"train.max_steps": f"{r + 1} or more"})  # fmt: skip
        return self

    def accum_at(self, step: int) -> int:
        """Micro-batches optimizer step `step` (0-based) accumulates: the batch ramp's
        ceil(grad_accum * (step + 1) / batch_ramp), at least 1, then grad_accum."""
        if step + 1 >= self.batch_ramp:
            return self.grad_accum
        return max(1, -(-self.grad_accum * (step + 1) // self.batch_ramp))


class RunConfig(_Strict):
    """One training run, fully described."""

    preset: str | None = None
    out_dir: str | None = None
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    speed: SpeedConfig = SpeedConfig()
    train: TrainConfig = TrainConfig()
    # what resolve changed on its own (fit_warmup)
    _notes: list[str] = PrivateAttr(default_factory=list)
    _preflighted: bool = PrivateAttr(default=False)  # judged by engine.run.preflight: Run.open asks

    @property
    def notes(self) -> list[str]:
        """One line each for what resolve decided that the user did not ask for: print them."""
        return self._notes

    @model_validator(mode="after")
    def _block_fits_context(self) -> RunConfig:
        T = self.train.block_size
        if T is not None and T > self.model.block_size:
            raise Invalid(
                f"block size {T} is above the model's context {self.model.block_size}",
                {"train.block_size": f"{self.model.block_size} or less"},
            )
        return self

    @model_validator(mode="after")
    def _warmup_before_the_end(self) -> RunConfig:
        """A warmup as long as the run never reaches the peak lr: refused, not kept silently (a
        warmup the user did not set follows a shortened run instead: fit_warmup, before this)."""
        w, n = self.optim.warmup_steps, self.train.max_steps
        if w >= n:
            raise Invalid(
                f"warmup steps {w} is not below max steps {n}: the lr would never reach its peak",
                {"optim.warmup_steps": f"{n - 1} or less" if n >= 2 else "0"},
                {"train.max_steps": f"{w + 1} or more"},
            )
        return self

    @model_validator(mode="after")
    def _supported_switches(self) -> RunConfig:
        """The switch combinations engine/switch_matrix.py refuses wherever this config's device
        may be (CUDA graphs with grad accumulation, with compile scope blocks, with FSDP2):
        refused here, so the CLI, the form and a live toggle all refuse them."""
        check_config(self.switch_values(), self.speed.device)
        return self

    def switch_values(self) -> dict[str, Any]:
        """{dotted setting: value} of every setting (what engine/switch_matrix.py reads)."""
        return {f"{section}.{name}": value for section, fields in self.model_dump().items()
                if isinstance(fields, dict) for name, value in fields.items()}  # fmt: skip

    @property
    def seq_len(self) -> int:
        return self.train.block_size or self.model.block_size

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.seq_len

    def tokens_at(self, step: int) -> int:
        """Tokens one rank trains on at optimizer step `step` (0-based): fewer in a batch ramp."""
        return self.train.batch_size * self.train.accum_at(step) * self.seq_len

    def to_toml(self) -> str:
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))


def flag_of(dotted: str) -> str | None:
    """A setting's CLI flag: `--field-name`, unless its Field names another (or None)."""
    section, name = dotted.split(".")
    info = RunConfig.model_fields[section].annotation.model_fields[name]  # type: ignore[union-attr]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "flag" in extra:
        return extra["flag"]  # type: ignore[return-value]
    return "--" + name.replace("_", "-")


def cli_change(dotted: str, value: Any) -> str:
    """One change of a refusal's fix as the flag that makes it: '--block-size 512',
    '--no-compile', 'DIR to --data' (a path)."""
    flag = flag_of(dotted) or "--" + dotted
    if value is True or value is False:
        return flag if value else "--no-" + flag[2:]
    if isinstance(value, list):
        return f"{flag} {' '.join(map(str, value))}"
    return f"{value} to {flag}" if dotted == "data.path" else f"{flag} {value}"


Refusal.cli = staticmethod(cli_change)  # every refusal's fix, worded as flags on the command line

# ---------------------------------------------------------------- building a RunConfig


def one_line(err: ValidationError) -> str:
    """pydantic's multi-line report, squeezed into the one line the house rules ask for."""
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = f" (got {e['input']!r})" if where and not isinstance(e["input"], dict) else ""
        parts.append(f"{where}: {msg}{got}" if where else msg)
    return "invalid config: " + "; ".join(parts)


def build(data: dict[str, Any]) -> RunConfig:
    """Validate a nested dict into a RunConfig, or raise UserError with one line (a validator's
    lone refusal keeps its fixes, for each front end to word)."""
    try:
        return RunConfig.model_validate(data)
    except (AttributeError, TypeError) as err:  # a value of the wrong shape reached a validator
        why = type(err).__name__
        raise UserError(f"invalid config: a value of the wrong shape ({why})") from None
    except ValidationError as err:
        (first, *more) = err.errors()
        why = first.get("ctx", {}).get("error")
        if not more and isinstance(why, Invalid) and not first["loc"]:
            raise UserError("invalid config: " + why.problem, *why.fixes, also=why.also) from None
        raise UserError(one_line(err)) from None


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` onto `base` (new dict; neither input is changed)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


CONFIG_CAP = 16 << 20  # a config file is a few hundred bytes
_TOML_TYPES = {
    bool: "a boolean",
    str: "a string",
    int: "an integer",
    float: "a float",
    list: "an array",
    dict: "a table",
}


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


def check_file_types(
    data: dict[str, Any], source: str, model: type[BaseModel] | None = None, prefix: str = ""
) -> dict[str, Any]:
    """Values read from a TOML file are taken as written: a boolean is not a number, a string is
    not a number or a boolean (`n_layer = true`, `batch_size = "8"`, `preload = "off"` are
    refused, where pydantic's lax mode took them for 1, 8 and false). One line naming the key,
    what it holds and what it should. Unknown keys and bounds are build()'s to judge; flags are
    typed by argparse and never pass through here. Returns `data`."""
    import json

    for key, value in data.items():
        field = (model or RunConfig).model_fields.get(key)
        if field is None:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if not isinstance(value, dict):  # merged, a value would drop the section's settings
                raise UserError(_not_a_table(source, f"{prefix}{key}", value))
            check_file_types(value, source, annotation, f"{prefix}{key}.")
            continue
        try:
            _adapter(annotation).validate_json(json.dumps(value, default=str), strict=True)
        except (ValidationError, ValueError) as err:
            got = next(
                (n for t, n in _TOML_TYPES.items() if isinstance(value, t)), type(value).__name__
            )
            msg = "not a valid value"
            if isinstance(err, ValidationError):
                msg = err.errors()[0]["msg"]
            shown = json.dumps(value, default=str)
            raise UserError(
                f"{source}: {prefix}{key} = {shown[:60]} is {got}; "
                f"{msg[0].lower()}{msg[1:]}: fix the file"
            ) from None
    return data



def _not_a_table(source: str, section: str, value: Any) -> str:
    """A section written as a value (`optim = "muon"`, `model = "gpt2-medium"`): one line
    naming it and the table it should be (a preset's name: the flag that picks the preset)."""
    import json

    shown = json.dumps(value, default=str)[:60]
    got = next((n for t, n in _TOML_TYPES.items() if isinstance(value, t)), type(value).__name__)
    fix = f"write its settings under [{section}], one a line"
    if section == "model" and isinstance(value, str) and value in preset_names():
        fix = f"{fix}, or pick the preset with --preset {value}"
    return f"{source}: {section} = {shown} is {got}, but {section} is a section of settings; {fix}"


def read_toml(path: Path, what: str = "config") -> dict[str, Any]:
    from engine import files

    try:
        # the user's own file: a link is theirs
        data = files.read_toml(path, CONFIG_CAP, follow_links=True)
    except FileNotFoundError:
        raise UserError(f"{what} file {path} does not exist; check the path") from None
    except tomllib.TOMLDecodeError as err:  # a ValueError: before the catch-all below
        raise UserError(f"{what} file {path} is not valid TOML: {err}; fix the file") from None
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {what} file {path}: {err}") from None
    except RecursionError:
        # tomllib recurses per nested array/table: thousands deep exhaust the stack
        raise UserError(
            f"{what} file {path} nests arrays or tables too deeply to read; fix the file"
        ) from None
    return check_file_types(data, f"{what} file {path}")


def preset_names() -> list[str]:
    """The presets, smallest model first (parameters at GPT-2's vocab; name breaks a tie):
    micro, nano, ... gpt2-xl, the order the form, `--help` and refusals list them in."""
    files = resources.files("presets").iterdir()
    names = [p.name.removesuffix(".toml") for p in files if p.name.endswith(".toml")]
    return sorted(names, key=lambda name: (_preset_params(name), name))


def _packaged_preset(name: str) -> dict[str, Any]:
    """One of our own presets (presets/NAME.toml, shipped in the package), as parsed TOML."""
    return tomllib.loads(resources.files("presets").joinpath(f"{name}.toml").read_text())


def _preset_params(name: str) -> int:
    try:
        model = _packaged_preset(name).get("model", {})
        return ModelConfig.model_validate(model).n_params(DataConfig().vocab_size)
    except (ValueError, TypeError, AttributeError):
        return MAX_STEPS  # an unreadable preset goes last; loading it names the problem


def load_preset(name: str) -> dict[str, Any]:
    """A preset by name (presets/NAME.toml) or by path to a TOML file."""
    if name.endswith(".toml"):
        return read_toml(Path(name), "preset")
    if name not in preset_names():
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(preset_names())}")
    return check_file_types(_packaged_preset(name), f"preset {name}") | {"preset": name}


def set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    """d['a']['b'] = value for dotted='a.b', creating the sections on the way."""
    *sections, key = dotted.split(".")
    for s in sections:
        d = d.setdefault(s, {})
    d[key] = value


def resolve(
    preset: str | None = None, file: Path | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """preset < config file < flags (`overrides` maps dotted names like 'optim.lr' to values);
    a warmup the flags did not set follows max steps they shortened (fit_warmup: config.notes)."""
    data: dict[str, Any] = load_preset(preset) if preset else {}
    if file is not None:
        data = merge(data, read_toml(file))
    nested: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        set_dotted(nested, dotted, value)
    data = merge(data, nested)
    note = fit_warmup(data, set(overrides or {}))
    config = build(data)
    config._notes = [note] if note else []
    return config


def fit_warmup(data: dict[str, Any], user_set: set[str]) -> str | None:
    """The one rule for a run shortened below its warmup (the CLI's resolve and the form's check
    both call it on the nested config before validating): when the user set max steps but not
    the warmup (that came from the preset, a config file or the default) and the warmup would
    not end before the run does, it becomes a tenth of the run. Changes `data`; returns the one
    line that says so, or None. Both set by the user and in conflict: the validator refuses."""
    if "train.max_steps" not in user_set or "optim.warmup_steps" in user_set:
        return None
    n = data.get("train", {}).get("max_steps", TrainConfig.model_fields["max_steps"].default)
    w = data.get("optim", {}).get("warmup_steps", OptimConfig.model_fields["warmup_steps"].default)
    if type(n) is not int or type(w) is not int or n < 1 or w < n:
        return None  # not numbers yet (pydantic refuses them), or the warmup fits
    # a new dict: a preset's stays as read
    data["optim"] = {**data.get("optim", {}), "warmup_steps": n // 10}
    return (
        f"warmup steps {w} -> {n // 10}: a tenth of the {n} max steps you set "
        f"(a warmup of {w} would outlast the run)"
    )


def overlay(data: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """`data` (a nested config dict) with dotted `overrides` on top, validated: flags over a
    preset, flags at resume over the run's config, a live toggle over the running one."""
    nested: dict[str, Any] = {}
    for dotted, value in overrides.items():
        set_dotted(nested, dotted, value)
    return build(merge(data, nested))
