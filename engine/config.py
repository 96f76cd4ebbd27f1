"""Everything a user configures, as pydantic models, and how presets, files and flags merge.

A `RunConfig` is the whole truth about a run: it is written to the run directory as
`config.toml`, stored in every checkpoint, and rebuilt from there by `--resume`,
`sample` and `attach`. Precedence when building one: preset < config file < flags.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.errors import UserError

Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
Attention = Literal["flash", "manual"]
Device = Literal["auto", "cuda", "mps", "cpu"]


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a TOML file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    """GPT-2 shape and the model-side switches (attention kernel, padding, checkpointing)."""

    n_layer: int = Field(12, ge=1)
    n_head: int = Field(12, ge=1)
    n_embd: int = Field(768, ge=1)
    block_size: int = Field(1024, ge=1, description="context length: positions the model has")
    vocab_size: int | None = Field(
        None, ge=2, description="real vocabulary; None takes it from the dataset"
    )
    pad_vocab: bool = Field(True, description="pad the embedding to a multiple of 64 (50257 -> 50304)")
    bias: bool = True
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    attention: Attention = "flash"
    grad_checkpointing: bool = False

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        return self

    @property
    def padded_vocab_size(self) -> int:
        assert self.vocab_size is not None, "vocab_size is resolved from the dataset first"
        return -(-self.vocab_size // 64) * 64 if self.pad_vocab else self.vocab_size


class DataConfig(_Strict):
    """Where tokens come from and how batches are built."""

    path: str | None = Field(None, description="dataset directory; None = the embedded stdlib corpus")
    vocab_size: int = Field(
        50257, ge=2, description="vocab of nanoGPT/llm.c files, which carry none"
    )
    preload: bool = Field(True, description="read the token files into RAM instead of np.memmap")
    vectorized: bool = Field(True, description="build a batch in one numpy gather, not a Python loop")
    pin_memory: bool = Field(True, description="pinned host buffers + non_blocking copies (CUDA)")
    prefetch: bool = Field(True, description="build the next batch on a background thread")


class OptimConfig(_Strict):
    """AdamW and the LR schedule: linear warmup, then cosine to min_lr."""

    lr: float = Field(6e-4, gt=0)
    min_lr: float = Field(6e-5, ge=0)
    warmup_steps: int = Field(100, ge=0)
    decay_steps: int | None = Field(None, ge=1, description="end of the cosine; None = max_steps")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0 disables clipping")
    fused: bool | None = Field(None, description="fused AdamW kernel; None = on for CUDA")

    @model_validator(mode="after")
    def _min_below_peak(self) -> OptimConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}")
        return self


class SpeedConfig(_Strict):
    """Device and the compute switches."""

    device: Device = "auto"
    precision: Precision = Field(
        "auto", description="auto = bf16 on GPUs that have it, else fp16 on CUDA, else fp32"
    )
    compile: bool = False
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "default"
    )
    parallel: Literal["auto", "ddp", "fsdp"] = Field(
        "auto", description="under torchrun: ddp replicates the model, fsdp shards it (FSDP2); "
        "auto = ddp unless the estimator says only a shard fits the GPU"
    )


class TrainConfig(_Strict):
    """Batch geometry, run length and bookkeeping intervals."""

    batch_size: int = Field(16, ge=1, description="micro-batch: sequences per forward pass")
    block_size: int | None = Field(None, ge=1, description="tokens per sequence; None = model context")
    grad_accum: int = Field(1, ge=1)
    max_steps: int = Field(1000, ge=1)
    eval_interval: int = Field(100, ge=1)
    eval_batches: int = Field(20, ge=1)
    log_interval: int = Field(1, ge=1, description="steps between step events (host syncs)")
    ckpt_interval: int = Field(500, ge=1)
    keep_last: int = Field(3, ge=1, description="checkpoints kept besides best")
    seed: int = 1337
    sample_tokens: int = Field(48, ge=0, description="tokens generated at each eval for the dashboard (0 = none)")
    on_save_error: Literal["continue", "stop"] = Field(
        "continue", description="a checkpoint write fails (disk full, no permission): warn and retry "
        "at the next interval, or stop the run"
    )
    max_bad_steps: int = Field(
        5, ge=1, description="consecutive steps with a NaN/Inf loss or grad norm (each skipped) before the run stops"
    )


class RunConfig(_Strict):
    """One training run, fully described."""

    preset: str | None = None
    out_dir: str | None = None
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    speed: SpeedConfig = SpeedConfig()
    train: TrainConfig = TrainConfig()

    @model_validator(mode="after")
    def _block_fits_context(self) -> RunConfig:
        T = self.train.block_size
        if T is not None and T > self.model.block_size:
            raise ValueError(
                f"block size {T} is above the model's context {self.model.block_size}; "
                f"pass --block-size {self.model.block_size} or less"
            )
        return self

    @property
    def seq_len(self) -> int:
        return self.train.block_size or self.model.block_size

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.seq_len

    def to_toml(self) -> str:
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))


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
    """Validate a nested dict into a RunConfig, or raise UserError with one line."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
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


def read_toml(path: Path, what: str = "config") -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{what} file {path} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {what} file {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{what} file {path} is not valid TOML: {err}; fix the file") from None


def preset_names() -> list[str]:
    files = resources.files("presets").iterdir()
    return sorted(p.name.removesuffix(".toml") for p in files if p.name.endswith(".toml"))


def load_preset(name: str) -> dict[str, Any]:
    """A preset by name (presets/NAME.toml) or by path to a TOML file."""
    if name.endswith(".toml"):
        return read_toml(Path(name), "preset")
    if name not in preset_names():
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(preset_names())}")
    text = resources.files("presets").joinpath(f"{name}.toml").read_text()
    return tomllib.loads(text) | {"preset": name}


def set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    """d['a']['b'] = value for dotted='a.b', creating the sections on the way."""
    *sections, key = dotted.split(".")
    for s in sections:
        d = d.setdefault(s, {})
    d[key] = value


def resolve(
    preset: str | None = None, file: Path | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """preset < config file < flags (`overrides` maps dotted names like 'optim.lr' to values)."""
    data: dict[str, Any] = load_preset(preset) if preset else {}
    if file is not None:
        data = merge(data, read_toml(file))
    nested: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        set_dotted(nested, dotted, value)
    return build(merge(data, nested))
