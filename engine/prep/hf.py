"""GPT-2 weights in the Hugging Face layout <-> our model.

Why a module of its own: the Hub's GPT-2 (`openai-community/gpt2` and its larger siblings)
is where fine-tuning starts, and `transformers` is where a trained model goes next. The
two layouts differ in small, exact ways, all kept here:

- HF's attention and MLP use `Conv1D`, whose weight is (in, out): ours is `nn.Linear`,
  (out, in), so those four weights are transposed both ways;
- HF keys are `transformer.h.0.attn.c_attn.weight` (save_pretrained) or `h.0...` (the
  original upload); ours are the same names under `transformer.`; the causal-mask buffers
  (`attn.bias`, `attn.masked_bias`) of old files are not weights and are dropped;
- the lm_head is tied to wte on both sides (an untied HF head is refused);
- HF's vocab is the real one (50257); ours may be padded to a multiple of 64. Padded rows
  get the mean of the real rows, so each padded logit is the mean logit and (Jensen) the
  padding adds at most padding/vocab to the softmax mass: the first loss is at most
  log1p(47/50257) = 0.00094 above transformers' for GPT-2, where zero rows would dominate
  the softmax, GPT-2's logits being strongly negative.

Only `safetensors` and `huggingface_hub` (the `hf` extra) are needed, and each is
imported only by the function that uses it; `transformers` is never imported here.
"""

from __future__ import annotations

import json
import errno
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import files
from engine.config import PRETRAINED, RECIPE, ModelConfig, cli_change, flag_of
from engine.errors import UserError

HUB_NAMES = {name: f"openai-community/{name}" for name in PRETRAINED}
GPT2_VOCAB = 50257
EOT = "<|endoftext|>"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
MAX_CONFIG_BYTES = 1 << 20
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_BUFFERS = ("attn.bias", "attn.masked_bias")  # old uploads store the causal mask; not weights
_HUB_FILES = [CONFIG, WEIGHTS, "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "generation_config.json"]
SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")  # the ModelConfig fields a GPT-2 config.json decides


def _install_hint() -> str:
    return "pip install gpt2-tui[hf]"


def _need(module: str) -> Any:
    """Import an optional dependency, or one line saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"Hugging Face weights need the {module.split('.')[0]} package; {_install_hint()}") from None


# ------------------------------------------------------------------ finding the weights


def hub_cache_dir(cache_dir: Path | None = None) -> str:
    """Where huggingface_hub keeps downloads: the argument, else its own env-driven default."""
    if cache_dir is not None:
        return str(cache_dir)
    return str(_need("huggingface_hub.constants").HF_HUB_CACHE)


def _offline() -> bool:
    """HF_HUB_OFFLINE read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def resolve(name_or_dir: str | Path, cache_dir: Path | None = None) -> Path:
    """A directory holding config.json + model.safetensors: the path itself, or one of
    gpt2|gpt2-medium|gpt2-large|gpt2-xl through huggingface_hub's cache (downloading it
    when the network allows and HF_HUB_OFFLINE is not set). Any failure is one line."""
    text = str(name_or_dir)
    if text in HUB_NAMES:
        return _download(text, cache_dir)
    path = Path(text).expanduser()
    if not path.exists():
        raise UserError(
            f"--init-from {text}: neither a model name nor a directory; pass one of "
            f"{', '.join(HUB_NAMES)} or a directory holding {CONFIG} and {WEIGHTS}"
        )
    if not path.is_dir() or not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        raise UserError(
            f"--init-from {text}: no {CONFIG} + {WEIGHTS} there; pass a directory saved by "
            f"transformers' save_pretrained (safetensors) or one of {', '.join(HUB_NAMES)}"
        )
    return path


def _download(name: str, cache_dir: Path | None, files: list[str] | None = None, fix: str = "--init-from DIR") -> Path:
    """huggingface_hub's snapshot of `name` (only `files`), from its cache or the network."""
    hub = _need("huggingface_hub")
    errors = _need("huggingface_hub.errors")
    repo = HUB_NAMES[name]
    cache = hub_cache_dir(cache_dir)
    offline = _offline()
    try:
        got = hub.snapshot_download(
            repo, allow_patterns=files or _HUB_FILES, cache_dir=cache, local_files_only=offline
        )
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as err:
        if offline:
            raise UserError(
                f"{name} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set; "
                f"unset HF_HUB_OFFLINE on a machine with network to download it once, or pass {fix}"
            ) from None
        why = " ".join(str(err).split())[:120]
        raise UserError(
            f"cannot download {name} from the Hugging Face Hub (no network? {why}) and it is not in the "
            f"cache ({cache}); run once with network (it is cached), or pass {fix}"
        ) from None
    except (errors.HfHubHTTPError, OSError) as err:
        why = " ".join(str(err).split())[:160]
        raise UserError(f"downloading {name} ({repo}) failed: {why}; retry, or pass {fix}") from None
    path = Path(got)
    for file in files or [CONFIG, WEIGHTS]:
        if not (path / file).is_file():
            raise UserError(f"the cached {name} at {path} lacks {file}; delete that folder and retry with network")
    return path


def config_dir(name_or_dir: str | Path, cache_dir: Path | None = None) -> Path:
    """A directory holding the config.json of `name_or_dir`, enough to read its shape: for a
    Hub name only that file is fetched (kilobytes), so a run is sized and checked before the
    weights are downloaded."""
    text = str(name_or_dir)
    if text in HUB_NAMES:
        return _download(text, cache_dir, [CONFIG])
    return resolve(text, cache_dir)


def cached_config_dir(name_or_dir: str | Path, cache_dir: Path | None = None) -> Path | None:
    """As config_dir, but never over the network (the form asks on every change): None when a
    Hub model's config is not in the cache yet (or huggingface_hub is missing); a directory
    that holds no model is refused as config_dir refuses it."""
    text = str(name_or_dir)
    if text in HUB_NAMES:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        got = try_to_load_from_cache(HUB_NAMES[text], CONFIG, cache_dir=str(cache_dir) if cache_dir else None)
        return Path(got).parent if isinstance(got, str) else None
    return resolve(text, cache_dir)


def hub_tokenizer(name: str = "gpt2", cache_dir: Path | None = None) -> Path:
    """The Hub's tokenizer.json of a GPT-2 model (the real BPE: 50257 ids, eot 50256), from
    huggingface_hub's cache or, with network, downloaded into it (1.4 MB, no weights)."""
    return _download(name, cache_dir, ["tokenizer.json"], "--tokenizer PATH/tokenizer.json") / "tokenizer.json"


# ------------------------------------------------------------------ HF -> ours


def _read_config(directory: Path) -> dict[str, Any]:
    file = directory / CONFIG
    try:
        data = files.read_json(file, MAX_CONFIG_BYTES, follow_links=True)
    except files.Refused as err:
        if err.errno == errno.EFBIG:
            raise UserError(f"{file} is larger than a model config can be; pass a transformers GPT-2 directory") from None
        raise UserError(f"{file} cannot be read as JSON ({err.strerror}); pass a transformers GPT-2 directory") from None
    except (OSError, ValueError) as err:
        raise UserError(f"{file} cannot be read as JSON ({type(err).__name__}); pass a transformers GPT-2 directory") from None
    if not isinstance(data, dict):
        raise UserError(f"{file} is not a JSON object; pass a transformers GPT-2 directory")
    return data


def _number(cfg: Mapping[str, Any], key: str, file: Path, default: Any = None, kind: type = int) -> Any:
    """A config.json number as JSON wrote it: an int (or, for `kind` float, any finite number);
    a string, a bool, inf/NaN or a fraction where a count belongs is one line naming the key."""
    value = cfg.get(key, default)
    if key not in cfg and default is None:
        raise UserError(f"{file} lacks the GPT-2 shape field {key}; pass a transformers GPT-2 directory")
    ok = not isinstance(value, bool) and (
        isinstance(value, int) if kind is int else isinstance(value, (int, float)) and math.isfinite(value))
    if not ok:
        what = "a whole number" if kind is int else "a finite number"
        raise UserError(f"{file}: {key} is {str(value)[:40]!r} ({type(value).__name__}), not {what}; "
                        "pass an intact transformers GPT-2 directory")  # fmt: skip
    return value


def _unsupported(cfg: Mapping[str, Any], file: Path) -> str | None:
    """Why a GPT-2 config computes something our model does not, or None."""
    if cfg.get("model_type") not in (None, "gpt2"):
        return f"model_type {cfg.get('model_type')!r} is not gpt2"
    checks = [
        (cfg.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh"), "activation_function"),
        (abs(_number(cfg, "layer_norm_epsilon", file, 1e-5, float) - 1e-5) < 1e-12, "layer_norm_epsilon"),
        (cfg.get("n_inner") in (None, 4 * _number(cfg, "n_embd", file, 768)), "n_inner"),
        (cfg.get("scale_attn_weights", True) is True, "scale_attn_weights"),
        (cfg.get("scale_attn_by_inverse_layer_idx", False) is False, "scale_attn_by_inverse_layer_idx"),
        (cfg.get("tie_word_embeddings", True) is True, "tie_word_embeddings"),
        (cfg.get("add_cross_attention", False) is False, "add_cross_attention"),
    ]
    for ok, key in checks:
        if not ok:
            return f"{key} = {cfg.get(key)!r} differs from GPT-2's"
    return None


def read_shape(directory: Path) -> dict[str, int]:
    """The ModelConfig shape fields (n_layer, n_head, n_embd, block_size, vocab_size) a
    transformers GPT-2 config.json decides."""
    cfg = _read_config(directory)
    file = directory / CONFIG
    problem = _unsupported(cfg, file)
    if problem:
        raise UserError(f"{file}: {problem}, which our model does not compute; pass a GPT-2 model")
    return {
        "n_layer": _number(cfg, "n_layer", file),
        "n_head": _number(cfg, "n_head", file),
        "n_embd": _number(cfg, "n_embd", file),
        "block_size": _number(cfg, "n_positions" if "n_positions" in cfg else "n_ctx", file),
        "vocab_size": _number(cfg, "vocab_size", file),
    }


# The recipe switches (engine/train/model.py) that change what the model computes; zero_init_proj
# only changes where training starts, so weights trained with it are GPT-2's all the same.
INIT_ONLY = ("zero_init_proj",)


def recipe_switch(model: ModelConfig) -> tuple[str, Any] | None:
    """The first recipe switch of `model` away from GPT-2 that transformers' GPT-2 cannot compute,
    as (dotted setting, GPT-2's value), or None."""
    for name, info in ModelConfig.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("form") == RECIPE and name not in INIT_ONLY and getattr(model, name) != info.default:
            return f"model.{name}", info.default
    return None


def refuse_recipe(model: ModelConfig, source: str) -> None:
    """`--init-from` weights are GPT-2's: a model with a recipe switch on cannot take them (one line)."""
    hit = recipe_switch(model)
    if hit is not None:
        dotted, gpt2 = hit
        flag = cli_change(dotted, getattr(model, dotted[6:]))
        fixes = ({dotted: gpt2},) if gpt2 is not None else ()  # a value's None: no flag sets it, drop the flag
        raise UserError(
            f"--init-from {source}: GPT-2's weights cannot start a model with {flag} (a recipe switch "
            "transformers' GPT-2 does not compute)",
            *fixes, also="" if fixes else f"drop {flag.split()[0]}",
        )


def shape_config(
    directory: Path, base: ModelConfig | None = None, explicit: Mapping[str, Any] | None = None, source: str | None = None
) -> ModelConfig:
    """`base` (the user's model switches: pad_vocab, attention, dropout, loss...) with the
    shape the weights decide. `explicit` holds the shape fields the user set themselves
    (ModelConfig field name -> value): one that differs is refused, naming its flag; a recipe
    switch is refused (refuse_recipe)."""
    name = source or str(directory)
    refuse_recipe(base or ModelConfig(), name)
    shape = read_shape(directory)
    for key, value in (explicit or {}).items():
        if key in shape and value is not None and value != shape[key]:
            flag = flag_of(f"model.{key}") or f"model.{key}"
            raise UserError(
                f"{flag} {value} conflicts with {name}, whose weights have {key} {shape[key]}; "
                f"drop {flag} (the shape comes from the weights)"
            )
    data = (base or ModelConfig()).model_dump() | shape
    if not data.get("bias", True):
        raise UserError(f"--no-bias conflicts with {name}, whose weights have biases; drop it")
    from pydantic import ValidationError

    try:
        return ModelConfig.model_validate(data)
    except ValidationError as err:
        from engine.config import one_line

        raise UserError(f"{directory / CONFIG}: {one_line(err)}") from None


def weights_cap(model: ModelConfig) -> int:
    """The most bytes a model.safetensors of `model`'s shape holds: every tensor GPT-2's files
    may carry (the weights, an untied head, the attention masks) at 8 bytes a value, plus a
    header; a larger file is refused before a byte of it is read."""
    C, L, T, V = model.n_embd, model.n_layer, model.block_size, model.vocab_size or 0
    values = 2 * V * C + T * C + L * (12 * C * C + 13 * C + T * T) + 2 * C
    return 8 * values + files.MiB


def load_state(directory: Path, model: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights of `directory/model.safetensors` as our GPT's state_dict for `model`
    (whose shape must be the file's: build it with `shape_config`)."""
    st = _need("safetensors.torch")
    file = directory / WEIGHTS
    try:  # read under the cap first (a regular file, never a FIFO): safetensors parses bytes, never opens a path
        raw = st.load(files.read_bounded(file, weights_cap(model), follow_links=True))
    except files.Refused as err:
        raise UserError(f"{file} is refused ({err.strerror}); pass an intact model directory") from None
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        why = " ".join(str(err).split())[:120]
        raise UserError(f"{file} cannot be read as safetensors ({why}); pass an intact model directory") from None
    hf: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        key = key.removeprefix("transformer.")
        if ".".join(key.split(".")[-2:]) in _BUFFERS:  # h.N.attn.bias, not h.N.attn.c_attn.bias
            continue
        hf[key] = value
    head = hf.pop("lm_head.weight", None)
    if head is not None and not torch.equal(head, hf.get("wte.weight", head)):
        raise UserError(f"{file}: its lm_head is not tied to wte, unlike GPT-2; our model ties them")
    from engine.train.model import GPT

    with torch.device("meta"):
        wanted = GPT(model).state_dict()
    state: dict[str, torch.Tensor] = {}
    V, Vp = model.vocab_size, model.padded_vocab_size
    for key, meta in wanted.items():
        if key == "lm_head.weight":
            continue
        short = key.removeprefix("transformer.")
        if short not in hf:
            raise UserError(f"{file} lacks {short}; pass a complete GPT-2 model directory")
        value = hf.pop(short)
        if value.dim() != meta.dim():  # checked before .t() and the vocab padding, which assume it
            raise UserError(
                f"{file}: {short} has shape {tuple(value.shape)}, config.json says {tuple(meta.shape)}; "
                "the directory is inconsistent"
            )
        value = value.to(torch.float32)
        if short.endswith(_CONV1D):
            value = value.t()
        if short == "wte.weight" and Vp > V:
            value = torch.cat([value, value.mean(0, keepdim=True).expand(Vp - V, -1)])
        if value.shape != meta.shape:
            raise UserError(
                f"{file}: {short} has shape {tuple(value.shape)}, config.json says {tuple(meta.shape)}; the directory is inconsistent"
            )
        state[key] = value.contiguous()
    if hf:
        extra = ", ".join(sorted(hf)[:3])
        raise UserError(f"{file} holds weights GPT-2 has not ({extra}...); pass a GPT-2 model directory")
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


@dataclass(frozen=True)
class Pretrained:
    """What `--init-from` gives a run: the model config to train and its starting weights."""

    model: ModelConfig
    state: dict[str, torch.Tensor]
    directory: Path
    source: str  # what the user named: gpt2, or the directory


def init_from(
    name_or_dir: str | Path,
    base: ModelConfig | None = None,
    explicit: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
) -> Pretrained:
    """Everything `train --init-from X` needs, checked before anything is written."""
    directory = resolve(name_or_dir, cache_dir)
    source = str(name_or_dir)
    model = shape_config(directory, base, explicit, source)
    return Pretrained(model, load_state(directory, model), directory, source)


def load_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into a built GPT (keeping the tie: lm_head and wte are one tensor)."""
    model.load_state_dict(dict(state), strict=True)


# ------------------------------------------------------------------ ours -> HF


def export_problem(model: ModelConfig) -> str | None:
    """Why a model has no transformers GPT-2 equivalent (naming the setting), or None.
    Attention kernel, loss, grad checkpointing and vocab padding change how it is computed,
    not what, so they export."""
    if not model.bias:
        return "it was trained with bias = false (--no-bias), and transformers' GPT-2 always has biases"
    hit = recipe_switch(model)
    if hit is not None:
        flag = cli_change(hit[0], getattr(model, hit[0][6:]))
        return f"it was trained with {flag}, a recipe switch transformers' GPT-2 does not compute"
    return None


def hf_config(model: ModelConfig, eot_id: int | None) -> dict[str, Any]:
    """A transformers GPT2Config (as config.json) for `model`: the real vocab, tied head."""
    p = model.dropout
    cfg: dict[str, Any] = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_layer": model.n_layer,
        "n_head": model.n_head,
        "n_embd": model.n_embd,
        "n_positions": model.block_size,
        "n_ctx": model.block_size,
        "n_inner": None,
        "vocab_size": model.vocab_size,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "resid_pdrop": p,
        "embd_pdrop": p,
        "attn_pdrop": p,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    if eot_id is not None:
        cfg |= {"bos_token_id": eot_id, "eos_token_id": eot_id}
    return cfg


def hf_state(state: Mapping[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state_dict -> HF GPT-2 keys: Conv1D weights transposed, padding rows cut, the
    tied lm_head left out (transformers ties it again on load). Each tensor its own memory."""
    out: dict[str, torch.Tensor] = {}
    V = model.vocab_size
    for key, value in state.items():
        if key == "lm_head.weight":
            continue
        value = value.detach().to("cpu", torch.float32)
        short = key.removeprefix("transformer.")
        if short.endswith(_CONV1D):
            value = value.t()
        if short == "wte.weight":
            value = value[:V]
        out[f"transformer.{short}"] = value.contiguous().clone()
    return out


def _tokenizer_config(tokenizer_json: Path, block_size: int) -> tuple[dict[str, Any], int | None]:
    """tokenizer_config.json for a tokenizers BPE file, and its EOT id (None if it has none)."""
    from engine.prep.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_json)
    eot = tok.token_to_id(EOT)
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": block_size,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
    }
    if eot is not None:
        cfg |= {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    return cfg, eot


def check_export_target(out: Path) -> None:
    """DIR must be new or an empty directory, in a parent we can write to: checked first."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"--hf {out} exists and is not a directory; pass a new directory")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--hf {out} is not empty; pass a new or empty directory (nothing is ever overwritten)")
    parent = out.parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise UserError(f"--hf {out}: cannot write in {parent}; choose another directory")


def export(
    state: Mapping[str, torch.Tensor], model: ModelConfig, out: Path, tokenizer: Path | None = None
) -> Path:
    """Write a transformers GPT-2 directory at `out`: config.json, model.safetensors and,
    given the run's tokenizer.json, it and a tokenizer_config.json (so AutoTokenizer loads
    it). Atomic: built in a temp dir beside `out`, renamed into place; refused in one line,
    before anything is written, when `out` is not new/empty or the model has no equivalent."""
    st = _need("safetensors.torch")
    out = Path(out).expanduser()
    problem = export_problem(model)
    if problem:
        raise UserError(f"this model has no transformers GPT-2 equivalent: {problem}")
    check_export_target(out)
    tok_cfg, eot = _tokenizer_config(tokenizer, model.block_size) if tokenizer is not None else (None, None)
    tensors = hf_state(state, model)
    files.make_dir(out.parent)
    files.sweep_dead_builds(out)  # an export killed outright (kill -9) left its temp directory: gone now
    tmp = files.build_dir_name(out)
    try:
        files.make_new_dir(tmp)
        try:  # into our own new directory; safetensors raises its own error (a full disk: SafetensorError)
            st.save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        except Exception as err:  # noqa: BLE001 - not an OSError: one line, as every write failure here
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise UserError(f"--hf {out}: the weights could not be written ({why}); free space in {out.parent} "
                            "or pass another --hf") from None  # fmt: skip
        files.write_text(tmp / CONFIG, json.dumps(hf_config(model, eot), indent=2) + "\n")
        gen = {"do_sample": True} | ({"bos_token_id": eot, "eos_token_id": eot} if eot is not None else {})
        files.write_text(tmp / "generation_config.json", json.dumps(gen, indent=2) + "\n")
        if tokenizer is not None:
            files.copy_file(tokenizer, tmp / "tokenizer.json", files.TOKENIZER_CAP, follow_links=True)
            files.write_text(tmp / "tokenizer_config.json", json.dumps(tok_cfg, indent=2) + "\n")
            if eot is not None:
                special = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
                files.write_text(tmp / "special_tokens_map.json", json.dumps(special, indent=2) + "\n")
        try:
            files.rename(tmp, out)  # atomic; replaces `out` only when it is an empty directory
        except OSError as err:
            raise UserError(f"--hf {out} could not be created ({err.strerror}); it may have been filled meanwhile: pass another") from None
    finally:
        if tmp.exists():
            files.remove_tree(tmp)
    return out
