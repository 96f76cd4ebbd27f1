"""The memory-budget estimator: will this run fit, and what to change when it doesn't.

Every figure is counted from the model's shapes, tensor by tensor, the way the eager
engine (engine/train/model.py + engine/train/trainer.py) really allocates them:

- parameters, gradients and AdamW state: exact (fp32 weights; tied embedding once);
- activations: what autograd saves for backward, per layer, as measured with
  `torch.autograd.graph.saved_tensors_hooks` (tests/config/test_memory.py holds the formula to
  within 10% over a grid of shapes; `engine.memory_measure` does the measuring);
- the tensors that are not saved but are alive at the peak: the logits the trainer holds
  while it runs backward, autocast's fp32 copy and the gradients of the cross-entropy
  (B*T*Vp*4 bytes each, over the padded vocab: often the largest single tensors for GPT-2),
  a block's backward working set;
- `model.loss = "chunked"` (engine/train/losses.py): none of the B*T*Vp tensors; instead one
  chunk's logits and temporaries (a few chunk_rows x Vp), the hidden rows' and the
  weight's gradients (N x C, Vp x C fp32) computed in forward and saved for backward, and
  under autocast the lm_head weight's low-precision copy while the loss runs;
- the recipe switches (model.qk_norm, positions, value_embeds, value_residual, attn_window,
  logit_softcap, tie_head, unet_skips: `recipe_activations`): each one's tables and scalars in the
  parameter count, and what each makes autograd save (fresh q, k or v tensors that SDPA keeps,
  rms_norm's statistics, the window's mask as SDPA's bias, the softcap's tanh over B*T*Vp);
- the peak over forward, backward and the optimizer step, plus the CUDA context and a
  caching-allocator margin that `torch.cuda.max_memory_allocated` does not see.

What is modelled rather than counted (torch.compile's effect, the CUDA context, the
allocator margin, FSDP's gather buffers) is named in `notes` and in docs/memory.md, and
`python -m engine.memory_check` measures it on a GPU.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

from engine.config import RunConfig
from engine.errors import UserError
from engine.text import MiB, fix_flags, fmt_params, human, params_text

Sharding = Literal["ddp", "fsdp"]
Target = Literal["cuda", "mps", "cpu"]

# Not seen by torch.cuda.max_memory_allocated, but taken from the device all the same: the
# CUDA context (engine.device.CUDA_CONTEXT_BYTES, where the free-memory budget needs it too).
# NCCL's own device buffers per rank for a data-parallel communicator (DDP's all-reduce,
# FSDP's all-gather / reduce-scatter), outside PyTorch's allocator. Basis: NCCL keeps, per
# channel and per ring peer (2), a buffer per protocol: Simple NCCL_BUFFSIZE (4 MiB) + LL128
# (~4.6 MiB) + LL (~0.25 MiB), about 9 MiB x 2 peers = 18 MiB a channel; NVLink boxes run 16-32
# channels (PCIe fewer): 0.3-0.6 GiB, plus the proxy's and the collectives' scratch. Taken as
# 1 GiB, the upper end; memory_check on a multi-GPU box measures it (nvidia-smi minus reserved).
NCCL_COMM_BYTES = 1024 * MiB
# The caching allocator's reserved-but-unused share at the peak (fragmentation, rounding).
ALLOCATOR_MARGIN = 0.08
# torch.compile (inductor) recomputes cheap pointwise results (GELU, layer-norm outputs)
# in backward instead of saving them: the saved per-layer activations shrink to about
# this fraction of eager's. A model, not a measurement: memory_check measures it on a GPU.
COMPILE_ACTIVATION_FACTOR = 0.7


class MemoryEstimate(BaseModel):
    """Predicted device memory of one training rank, in bytes.

    `breakdown` is what is alive at the predicted peak (it sums to `peak_bytes`);
    `components` is the full size of each part; `phases` the allocated bytes at each
    candidate peak (what torch.cuda.max_memory_allocated would read there).
    """

    model_config = ConfigDict(frozen=True)

    target: Target
    precision: str
    n_params: int
    vocab_size: int  # the real vocab the logits span (the config's, else data.vocab_size)
    batch_size: int
    seq_len: int
    grad_accum: int
    world_size: int = 1
    sharding: Sharding = "ddp"
    compile: bool = False
    breakdown: dict[str, int]
    components: dict[str, int]
    phases: dict[str, int]
    peak_phase: str
    activation_bytes: int  # saved for backward by one micro-batch (excl. weight copies)
    layer_activation_bytes: int  # of that, one transformer block's share
    allocated_peak_bytes: int  # the predicted torch.cuda.max_memory_allocated
    peak_bytes: int  # allocated peak + CUDA context + allocator margin: what must fit
    notes: list[str] = []

    def fits(self, device_bytes: int) -> bool:
        return self.peak_bytes <= device_bytes


# ---------------------------------------------------------------- shapes and counts


class _Shape(BaseModel):
    """The numbers every formula needs, resolved from a RunConfig."""

    L: int
    H: int
    C: int
    V: int  # real vocab: the logits and the loss are this wide
    Vp: int  # padded vocab: the embedding and lm_head are this wide
    ctx: int  # positions in wpe
    B: int
    T: int
    bias: bool
    dropout: float
    attention: str
    ckpt: bool
    chunked: bool  # model.loss == "chunked"
    # the recipe switches that change what is saved or held (engine/train/model.py)
    qk_norm: bool = False
    rotary: bool = False
    value_embeds: bool = False
    value_residual: bool = False
    # where they act: ModelConfig's declarations (the layers, the skips, the vocab-wide tables)
    ve_layers: frozenset[int] = frozenset()
    mix_layers: frozenset[int] = frozenset()
    skips: int = 0
    tables: int = 1
    window: bool = False  # attn_window shorter than the sequence: a banded mask
    flex: bool = False  # ... run by FlexAttention (engine.train.window.runs_flex): no T x T bias
    softcap: bool = False
    tied: bool = True
    unet: bool = False


def _shape(config: RunConfig) -> _Shape:
    from engine import device  # torch loads here, not when the form imports this module
    from engine.train.window import banded, runs_flex

    m = config.model
    flex = runs_flex(config, device.kind(config.speed.device))
    V = m.vocab_size or config.data.vocab_size
    Vp = m.model_copy(update={"vocab_size": V}).padded_vocab_size
    return _Shape(
        L=m.n_layer, H=m.n_head, C=m.n_embd, V=V, Vp=Vp, ctx=m.block_size,
        B=config.train.batch_size, T=config.seq_len, bias=m.bias, dropout=m.dropout,
        attention=m.attention, ckpt=m.grad_checkpointing, chunked=m.loss == "chunked",
        qk_norm=m.qk_norm, rotary=m.positions == "rotary", value_embeds=m.value_embeds,
        value_residual=m.value_residual, softcap=m.logit_softcap is not None, tied=m.tie_head,
        window=banded(m.attn_window, config.seq_len), flex=flex, unet=m.unet_skips,
        ve_layers=m.value_embed_layers, mix_layers=m.value_residual_layers, skips=m.unet_skip_count,
        tables=m.vocab_tables,
    )  # fmt: skip


def param_count(config: RunConfig) -> int:
    """Unique parameters of engine.train.model.GPT (the tied embedding once): ModelConfig.n_params."""
    return config.model.n_params(config.data.vocab_size)


def size_text(config: RunConfig, short: bool = False) -> str:
    """The model's own size with the vocab it assumes (the model's, else GPT-2's 50257), and where
    the run's dataset has another vocab (run_vocab's rule), the size the run gets with it:
    '124.5M params (vocab 50257; 92.1M with this dataset's 8192-token vocab)'. The form's preset
    list (`short`: '124.5M params (92.1M at vocab 8192)', one line in a select), `estimate` and the
    ladder all show this."""
    sized = with_dataset_vocab(config)
    run = sized.model.vocab_size
    assert run is not None
    own = config.model.vocab_size or config.data.vocab_size  # the preset's own: GPT-2's 50257 unless it sets one
    if own == run:
        return params_text(param_count(sized), run)
    full = config.model.model_copy(update={"vocab_size": own}).n_params()
    if short:
        return f"{fmt_params(full)} params ({fmt_params(param_count(sized))} at vocab {run})"
    return f"{fmt_params(full)} params (vocab {own}; {fmt_params(param_count(sized))} with this dataset's {run}-token vocab)"


def _param_tensors(s: _Shape) -> int:
    """Parameter tensors (one AdamW `step` scalar each): wte, wpe, 6 weights (+6 biases) a block, ln_f;
    the recipe's: no wpe (rotary), an untied head, the value-embed table, and the learned scalars
    (U-net skip weights as one tensor, a value-embed gate a gated layer, a value-residual lambda a layer)."""
    b = int(s.bias)
    tables = s.tables + (not s.rotary)
    scalars = (s.skips > 0) + len(s.ve_layers) + len(s.mix_layers)
    return tables + s.L * (6 + 6 * b) + 1 + b + scalars


def _n_scalars(s: _Shape) -> int:
    """The recipe's learned scalars (1-D parameters): skip weights, value-embed gates, value-residual lambdas."""
    return s.skips + len(s.ve_layers) + len(s.mix_layers)


def _largest_param(s: _Shape) -> int:
    return max(s.Vp * s.C, 0 if s.rotary else s.ctx * s.C, 4 * s.C * s.C)


# ---------------------------------------------------------------- activations


def layer_activations(s: _Shape, low: bool, target: Target) -> int:
    """Bytes one transformer block saves for backward (no checkpointing), weight copies excluded.

    Per block, with a = 2 bytes under bf16/fp16 autocast, else 4: the residual input of each
    layer norm (fp32, 4 B*T*C each) and their mean/rstd (4 B*T each); the inputs of the
    four matmuls in autocast dtype (ln_1 out a, attention out a, ln_2 out a, GELU out 4a);
    the GELU input (4a). Flash (SDPA): q, k, v as one qkv buffer (3a) and the logsumexp
    (4 B*H*T). Manual: copies of q, k^T, v for the batched matmuls (3a), the causal mask
    (T*T bools) and the softmax probabilities (B*H*T*T: in fp32 plus an autocast copy on
    CUDA, where autocast runs softmax in fp32; in the autocast dtype on CPU).
    """
    B, T, C, H = s.B, s.T, s.C, s.H
    a = 2 if low else 4
    total = (8 + 14 * a) * B * T * C + 2 * 8 * B * T
    if s.attention == "flash":
        t_lse = -(-T // 32) * 32 if (target == "cuda" and not low) else T  # mem-efficient kernel pads
        total += 4 * B * H * t_lse
    else:
        probs = (4 + 2) if (low and target == "cuda") else a
        total += T * T + probs * B * H * T * T
    if s.dropout > 0:  # a bool mask per dropout (after attention and MLP); manual: on the probabilities
        total += 2 * B * T * C + (B * H * T * T * (1 + a) if s.attention == "manual" else 0)
    return total


def recipe_activations(s: _Shape, low: bool) -> int:
    """What the recipe switches add to the blocks' saved bytes (no checkpointing; engine/train/model.py),
    found tensor by tensor with saved_tensors_hooks on CPU (tests/config/test_recipe_memory.py):
    - a fresh q and k (qk_norm, rotary) or v (value embeds, value residual) instead of views of the
      qkv buffer: flash SDPA saves it (a B*T*C each). The qkv buffer (3a) stays saved while anything
      saves a view of it: SDPA, rms_norm's input in fp32, the residual's mix * v and (1 - mix) * v1;
    - qk_norm: rms_norm's rstd for q and k (4 B*H*T each), under autocast its fp32 copy of q and k;
    - rotary: cos and sin (4 T*D bytes once; cast per layer under autocast);
    - value embeds: the table's fp32 output once, under autocast its cast in each gated layer;
    - a window shorter than the sequence: flash SDPA turns the boolean mask into a T x T bias in
      q's dtype (the manual path's mask is the causal one's size); FlexAttention, where it runs
      the window, saves what SDPA's kernels save but no bias;
    - U-net skips (`unet_skip`): the skips' mul saves each skip, all of them saved by the next
      block's ln_1 anyway but the last one, when the first layer that pops it is the next one."""
    if not (s.qk_norm or s.rotary or s.value_embeds or s.value_residual or s.window):
        return unet_skip(s)
    B, T, C, H, L = s.B, s.T, s.C, s.H, s.L
    a, flash, btc, fresh_qk = (2 if low else 4), s.attention == "flash", s.B * s.T * s.C, s.qk_norm or s.rotary
    total = (4 * btc if s.value_embeds and not low else 0) + (4 * T * (C // H) if s.rotary and not low else 0)
    for i in range(L):
        ve, mix = i in s.ve_layers, i in s.mix_layers
        first_v = bool(s.mix_layers) and i == 0  # saved by every later layer's mix
        qkv = (flash and not (fresh_qk and (ve or mix))) or (s.qk_norm and not low) or ((mix or first_v) and not ve)
        total += (int(qkv) - int(flash)) * 3 * a * btc
        if flash:
            bias = a * T * T if s.window and not s.flex else 0  # flex takes a block mask, not SDPA's bias
            total += (2 * a * btc if fresh_qk else 0) + (a * btc if ve or mix else 0) + bias
        if ve and (mix or (first_v and not flash)):  # the v after the embedding, saved by the mix
            total += a * btc
        total += (8 * B * H * T + (8 * btc if low else 0)) if s.qk_norm else 0
        total += (a * btc if ve and low else 0) + (4 * T * (C // H) if s.rotary and low else 0)
    return total + unet_skip(s)


def unet_skip(s: _Shape) -> int:
    """With an even n_layer the first half's last output is added to itself by the next layer (the first
    of the second half): saved by the skip's mul for its weight's gradient, and by no ln_1 (4 B*T*C)."""
    return 4 * s.B * s.T * s.C if s.skips and s.L % 2 == 0 else 0


def recipe_checkpointed(s: _Shape, low: bool) -> int:
    """Checkpointed blocks save nothing inside, but hold their inputs: the value-embed table's fp32
    output, the value residual's v1 (the first layer's v: its qkv buffer, or the embedded v), and
    the U-net's skip (unet_skip)."""
    a, btc = (2 if low else 4), s.B * s.T * s.C
    v1 = (a if s.value_embeds else 3 * a) * btc if s.mix_layers else 0
    return (4 * btc if s.value_embeds else 0) + v1 + unet_skip(s)


def head_activations(s: _Shape, low: bool) -> int:
    """Saved outside the blocks: token and position ids, ln_f input and stats, and the loss's:
    plain: lm_head input, the fp32 log-softmax over the padded vocab (B*T*Vp*4), targets;
    chunked: the gradients computed in forward, grad_hidden (B*T*C fp32, ln_f's dtype) and
    grad_weight (Vp*C fp32). The softcap (plain loss) saves its tanh over the padded vocab (fp32)."""
    B, T, C = s.B, s.T, s.C
    a = 2 if low else 4
    ids = 8 * B * T + (0 if s.rotary else 8 * T)  # idx, positions (rotary: no position table)
    emb = B * T * C if s.dropout > 0 else 0
    ln_f = 4 * B * T * C + 8 * B * T
    if s.chunked:
        return ids + emb + ln_f + chunked_saved(s)
    cap = 4 * B * T * s.Vp if s.softcap else 0
    return ids + emb + ln_f + 8 * B * T + 4 + a * B * T * C + 4 * B * T * s.Vp + cap  # + targets, total weight


def chunked_saved(s: _Shape) -> int:
    """What the chunked loss saves for backward: grad_hidden (N x C fp32) + grad_weight (Vp x C fp32)."""
    return 4 * s.B * s.T * s.C + 4 * s.Vp * s.C


def chunked_transient(s: _Shape, low: bool) -> int:
    """The chunked loss's working set in forward, beyond what it saves: one chunk's logits in
    fp32 plus logsumexp's temporary of the same size (under autocast, the low-precision
    matmul output and its fp32 copy, then the low-precision gradient chunk: about as much),
    and autocast's low-precision copy of the lm_head weight (Vp x C)."""
    rows = chunk_rows_for_shape(s) * s.Vp  # the softcap's tanh: one more chunk in fp32
    return (12 if s.softcap else 8) * rows + (2 * s.Vp * s.C if low else 0)


def saved_activations(s: _Shape, low: bool, target: Target, compiled: bool = False) -> tuple[int, int]:
    """(all bytes saved for backward by one micro-batch, one block's share)."""
    layer = layer_activations(s, low, target)
    if s.ckpt:  # non-reentrant checkpoint keeps only each block's input (fp32 residual)
        per_layer, recipe = 4 * s.B * s.T * s.C, recipe_checkpointed(s, low)
    else:
        factor = COMPILE_ACTIVATION_FACTOR if compiled else 1
        per_layer, recipe = int(layer * factor), int(recipe_activations(s, low) * factor)
    return s.L * per_layer + recipe + head_activations(s, low), per_layer + recipe // s.L


def weight_copies(s: _Shape, low: bool) -> int:
    """Autocast's bf16/fp16 copies of the matmul weights, saved for backward (0 in fp32).

    With checkpointing the blocks' copies are not kept (recomputed one block at a time);
    lm_head's (the tied embedding or its own, Vp*C) always is. The recipe's gates and lambdas are
    cast to v's dtype too (engine.train.model: type_as), 2 bytes each.
    """
    if not low:
        return 0
    blocks = 0 if s.ckpt else s.L * 12 * s.C * s.C + _n_scalars(s) - s.skips  # gates, lambdas
    head = 0 if s.chunked else s.Vp * s.C  # the chunked loss casts the weight inside, saves no copy
    return 2 * (blocks + head)


# ---------------------------------------------------------------- the estimate


def estimate(config: RunConfig, world_size: int = 1, sharding: Sharding = "ddp") -> MemoryEstimate:
    """Predict one rank's device memory for training `config`.

    The device kind and precision are resolved the way `train` resolves them on this
    machine (`speed.device = auto` on a CPU-only box estimates the CPU); set
    `speed.device = "cuda"` to plan for a GPU from anywhere.
    """
    s = _shape(config)
    from engine import device  # torch loads here, not when the form imports this module

    target: Target = device.kind(config.speed.device)  # type: ignore[assignment]
    precision = device.precision(config.speed.precision, target)
    low = precision in ("bf16", "fp16")
    compiled = config.speed.compile
    accum = config.train.grad_accum
    B, T = s.B, s.T
    N = param_count(config)
    notes: list[str] = []

    params, grads = 4 * N, 4 * N
    optim = optimizer_state(config, s, N)
    optim_name = "AdamW state" if config.optim.optimizer == "adamw" else "AdamW + Muon state"
    shard_extra = 0
    grads_persist = False
    if world_size > 1 and sharding == "fsdp":
        # FSDP2 as engine/train/distributed.py wraps it: one unit per block plus the root
        # (embeddings, tied head, ln_f), params gathered in fp32. The root stays gathered
        # through forward and backward; a block is gathered while it runs, the next prefetched,
        # and its unsharded gradient exists until reduce-scattered.
        # Mixed precision (engine.train.distributed.mixed_precision_policy, per block): blocks gathered
        # in bf16/fp16, the root in fp32, the unsharded gradient reduce-scattered in fp32.
        params, grads, optim = -(-params // world_size), -(-grads // world_size), -(-optim // world_size)
        root = 4 * config.model.model_copy(update={"n_layer": 0}).n_params(s.V)
        block = (4 * N - root) // s.L
        gathered = 2 if low else 4  # bytes a gathered parameter takes
        shard_extra = root + 2 * block * gathered // 4 + block
        notes.append("FSDP2: the root unit gathered throughout, two gathered blocks and one block's fp32 "
                     f"gradient (modelled; gathered in {precision if low else 'fp32'})")  # fmt: skip
    elif world_size > 1:
        # DDP(gradient_as_bucket_view=True): gradients are views into buckets allocated once,
        # so they are never freed between steps
        grads_persist = True
        notes.append("DDP: gradients live in buckets allocated for the whole run")

    acts, layer_acts = saved_activations(s, low, target, compiled)
    fsdp_low = shard_extra > 0 and low  # FSDP2 gathers the weights already in bf16/fp16: autocast copies none
    copies = 0 if fsdp_low else weight_copies(s, low)
    a = 2 if low else 4
    if s.chunked:  # engine.train.losses.chunked_linear_cross_entropy: no B*T*Vp tensor at all
        logits_fwd, ce_fwd, ce_bwd = 0, chunked_transient(s, low), 0
        notes.append(f"chunked loss: {chunk_rows_for_shape(s)} rows a chunk, no B x T x V logits")
    else:
        logits_fwd = a * B * T * s.Vp  # lm_head's output, alive only through the loss's forward (GPT returns none in training)
        ce_fwd = 4 * B * T * s.Vp if low else 0  # autocast's fp32 copy fed to log_softmax
        if s.softcap:  # the capped fp32 logits fed to log_softmax instead (model.GPT.logits), either precision
            ce_fwd = 4 * B * T * s.Vp
        ce_bwd = 8 * B * T * s.Vp  # nll_loss's grad + log_softmax's grad, both fp32 B*T*Vp
    if compiled:
        if not s.chunked:  # inductor fuses the cross-entropy: no fp32 copy, one fp32 gradient
            ce_fwd, ce_bwd = 0, 4 * B * T * s.Vp
        notes.append(
            f"torch.compile modelled: per-layer activations x{COMPILE_ACTIVATION_FACTOR}"
            + ("" if s.chunked else ", fused cross-entropy")
        )
    block_full = layer_activations(s, low, target) + (2 * 12 * s.C * s.C if low else 0)
    block_bwd = (8 * a + 8) * B * T * s.C  # gradients of the widest activations while a block runs backward
    prefetched = config.data.prefetch and "data.prefetch" not in device.idle_data_switches(target)
    batch = 2 * 8 * B * T * (2 if prefetched else 1)  # x and y int64; the prefetch thread holds the next pair
    opt_tmp = _optimizer_transient(config, s, target, N)
    grads_fwd = grads if accum > 1 or grads_persist else 0  # zero_grad(set_to_none) frees them each step

    shard_name = "FSDP gathered units"
    head = head_activations(s, low)
    layers = acts - head
    act_name = f"activations ({s.L} blocks)"

    def parts(grads_alive: int, fwd: bool, transient: int, head_alive: int | None = None) -> dict[str, int]:
        return {
            "parameters": params, "gradients": grads_alive, optim_name: optim,
            "autocast weight copies": copies if fwd else 0, act_name: layers if fwd else 0,
            "logits & loss": (head if fwd else 0) if head_alive is None else head_alive,
            "transient": transient, shard_name: shard_extra, "batches": batch,
        }  # fmt: skip

    by_phase = {
        "forward": parts(grads_fwd, True, logits_fwd + ce_fwd),
        "backward (loss)": parts(grads_fwd, True, ce_bwd),
        "backward (blocks)": parts(
            grads_fwd, True, (4 * s.Vp * s.C if not grads_fwd else 0) + (block_full if s.ckpt else 0) + block_bwd,
            head_alive=head - (chunked_saved(s) if s.chunked else 4 * B * T * s.Vp),
        ),
        "optimizer step": parts(grads, False, opt_tmp),
    }
    phases = {k: sum(v.values()) for k, v in by_phase.items()}
    peak_phase = max(phases, key=lambda k: phases[k])
    allocated = phases[peak_phase]
    context = device.CUDA_CONTEXT_BYTES if target == "cuda" else 0
    margin = int(allocated * ALLOCATOR_MARGIN) if target == "cuda" else 0
    outside = {"CUDA context": context, "allocator margin": margin}  # taken from the device, not allocated
    if target == "cuda" and world_size > 1:
        outside["NCCL buffers"] = NCCL_COMM_BYTES
        notes.append(f"NCCL: {human(NCCL_COMM_BYTES)} per rank for the communicator's buffers (modelled; docs/memory.md)")
    breakdown = by_phase[peak_phase] | outside
    components = parts(grads, True, breakdown["transient"]) | outside
    if config.model.init_from:  # engine.run.owner loads them into the model before training: host memory, once
        notes.append(f"weights from {config.model.init_from} (pretrained): its shape; loading them takes "
                     f"{human(4 * N)} of host memory at set-up, freed before step 1")
    if target != "cuda":
        notes.append(f"{target}: no CUDA context or allocator margin; the process's own baseline is not counted")
    return MemoryEstimate(
        target=target, precision=precision, n_params=N, vocab_size=s.V, batch_size=B, seq_len=T, grad_accum=accum,
        world_size=world_size, sharding=sharding, compile=compiled,
        breakdown=breakdown, components=components, phases=phases, peak_phase=peak_phase,
        activation_bytes=acts, layer_activation_bytes=layer_acts, allocated_peak_bytes=allocated,
        peak_bytes=allocated + sum(outside.values()), notes=notes,
    )  # fmt: skip


CHUNK_BUDGET_BYTES = 128 * 2**20  # one chunk's fp32 logits; a few such live at once

def chunk_rows_for(n_rows: int, vocab: int, budget_bytes: int = CHUNK_BUDGET_BYTES) -> int:
    """Rows per chunk: one chunk's fp32 logits within `budget_bytes`, and at least 8 chunks.

    At gpt2 shapes (V=50304) the budget decides (~640 rows of 16384 at B16 T1024); on small
    inputs the 8-chunk floor keeps the loss actually chunked. Multiples of 64 when large,
    so the chunk matmuls keep aligned shapes.
    """
    rows = min(budget_bytes // (4 * vocab), -(-n_rows // 8))
    if rows >= 64:
        rows -= rows % 64
    return max(1, rows)


def chunk_rows_for_shape(s: _Shape) -> int:
    return chunk_rows_for(s.B * s.T, s.Vp)


def muon_params(s: _Shape) -> int:
    """Weights Muon trains (optimizer muon; engine.train.build.muon_params): the blocks' four
    matrices, 3C^2 + C^2 + 4C^2 + 4C^2 a block, in 4 tensors."""
    return 12 * s.C * s.C * s.L


def optimizer_state(config: RunConfig, s: _Shape, n: int) -> int:
    """Optimizer state bytes: AdamW keeps exp_avg + exp_avg_sq (fp32) and a `step` scalar per
    tensor; with optimizer muon the blocks' matrices keep one fp32 momentum buffer instead."""
    if config.optim.optimizer == "adamw":
        return 8 * n + 4 * _param_tensors(s)
    m = muon_params(s)
    return 8 * (n - m) + 4 * (_param_tensors(s) - 4 * s.L) + 4 * m


def _optimizer_transient(config: RunConfig, s: _Shape, target: Target, n: int) -> int:
    """Scratch memory of AdamW.step: fused 0; foreach (CUDA default when not fused) one
    fp32 copy of the decayed params (sqrt of exp_avg_sq); single-tensor (CPU) two of the largest.
    Muon (engine/train/muon.py) steps a stack of same-shape matrices at once; the largest is the
    MLP's, 2L matrices of 4C x C (E elements): the fp32 stack of the gradients (the step's one
    copy; momentum and Nesterov work in place on it), then its cast and two Newton-Schulz iterates
    in the iteration's dtype: 6 bytes an element with bf16 (the fp32 stack is freed after its
    cast), 12 where the device only emulates bf16 and the iteration runs in fp32 on the stack
    itself (engine.device.newton_schulz_dtype). Under DDP the MLP's stack goes first, so the result
    held while its all-gather is in flight (2 bytes an element with bf16) meets only the smaller
    stacks' transients (3/8 of it at most): below this peak."""
    muon, extra = config.optim.optimizer == "muon", 0
    if muon:
        from engine import device  # torch: here, not at the top (the form's estimate loads this module first)

        size = device.newton_schulz_dtype(target).itemsize
        extra = max(4 + size, 3 * size) * (2 * s.L * 4 * s.C * s.C)
    fused = config.optim.fused if config.optim.fused is not None else target == "cuda"
    if fused:
        return extra
    if target == "cuda":  # AdamW's decayed (2-D) params: with Muon only the embeddings
        tables = s.tables * s.Vp * s.C + (0 if s.rotary else s.ctx * s.C)
        one_d = s.L * (4 * s.C + int(s.bias) * 9 * s.C) + s.C * (1 + int(s.bias)) + _n_scalars(s)
        decayed = tables if muon else n - one_d
        return extra + 4 * decayed
    return extra + 2 * 4 * _largest_param(s)


# ---------------------------------------------------------------- fitting


def suggest_fit(
    config: RunConfig, device_bytes: int, world_size: int = 1, sharding: Sharding | None = None
) -> RunConfig | None:
    """The largest micro-batch that fits, keeping sequences per optimizer step
    (batch_size * grad_accum) by raising grad_accum; None if even batch 1 does not fit.

    Only divisors of the step's sequence count are tried, so the step stays exactly the same size.
    """
    if sharding is None:
        parallel = getattr(config.speed, "parallel", "ddp")
        sharding = "fsdp" if parallel == "fsdp" else "ddp"
    seqs = config.train.batch_size * config.train.grad_accum
    for b in sorted((d for d in _divisors(seqs)), reverse=True):
        candidate = with_batch(config, b, seqs // b)
        if estimate(candidate, world_size, sharding).fits(device_bytes):
            return candidate
    return None


def with_batch(config: RunConfig, batch_size: int, grad_accum: int) -> RunConfig:
    train = config.train.model_copy(update={"batch_size": batch_size, "grad_accum": grad_accum})
    return config.model_copy(update={"train": train})


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


# ---------------------------------------------------------------- the pre-launch check


def check_fits(config: RunConfig, force: bool = False, held: int | None = None) -> None:
    """Refuse, before anything is allocated, a config predicted not to fit this machine's device.

    `config` comes from open_data (vocab and block size bound). Under torchrun the estimate
    is per rank (WORLD_SIZE from the environment). The budget is engine.device.budget's;
    `held`: a live toggle's, the memory the running segment holds and hands over.
    """
    import os

    from engine import device

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if not force:
        check_eval_set(config, world)
    parallel = config.speed.parallel
    # `auto` takes DDP when it fits and FSDP otherwise (engine.train.distributed): either may do
    shardings: list[Sharding] = ["ddp", "fsdp"] if parallel == "auto" and world > 1 else ["fsdp" if parallel == "fsdp" else "ddp"]
    est = estimate(config, world, shardings[0])
    available, label = device.budget(est.target, held)
    if force or available is None:
        return
    for sharding in shardings:
        est = estimate(config, world, sharding)
        if est.fits(available):
            return
    biggest = sorted(est.breakdown.items(), key=lambda kv: -kv[1])[:2]
    parts = ", ".join(f"{k} {human(v)}" for k, v in biggest)
    fitted = suggest_fit(config, available, world, sharding)
    fix = (
        f"pass {fix_flags(fitted)} (same sequences per step)"
        if fitted is not None
        else "even micro-batch 1 does not fit: use --grad-checkpointing, a shorter --block-size or a smaller model"
    )
    raise UserError(
        f"predicted peak memory {human(est.peak_bytes)} exceeds the {human(available)} of "
        f"{label} (largest: {parts}); {fix}, or --force to start anyway"
    )


def eval_set_bytes(config: RunConfig, world_size: int = 1) -> int:
    """Host RAM the fixed val set holds: eval_batches (rounded up to the ranks) x B x T input
    and target ids as int64, all built before each rank keeps its share (distributed.val_share)."""
    n = -(-config.train.eval_batches // world_size) * world_size
    return n * config.train.batch_size * config.seq_len * 2 * 8


def host_budget() -> int | None:
    """RAM this process may still take: MemAvailable, capped by its address-space limit."""
    import resource

    from engine import device

    avail = device.available_host_memory()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        avail = soft if avail is None else min(avail, soft)
    return avail


def check_eval_set(config: RunConfig, world_size: int = 1) -> None:
    """Refuse an eval set that would take over half the host's RAM (the model, data and torch
    need the rest), before anything is allocated or written."""
    held, budget = eval_set_bytes(config, world_size), host_budget()
    if budget is None or held <= budget // 2:
        return
    per_batch = config.train.batch_size * config.seq_len * 2 * 8
    fit = max(1, (budget // 2) // per_batch // world_size * world_size)
    raise UserError(
        f"--eval-batches {config.train.eval_batches} holds {human(held)} of val batches in RAM, over half the "
        f"{human(budget)} this process can have",
        {"train.eval_batches": f"{fit} or fewer"},
    )


def run_vocab(config: RunConfig) -> int:
    """The vocab a run of `config` gets, known without reading token files: the model's own;
    else our dataset's sidecar (dataset.json); with no dataset, the embedded corpus's BPE;
    else data.vocab_size (nanoGPT/llm.c files carry none). engine.run.preflight.open_data binds the
    same vocab when the run opens its data, so every parameter count shown agrees with it."""
    from pathlib import Path

    if config.model.vocab_size is not None:
        return config.model.vocab_size
    if config.data.path is None:
        from engine.config import DEFAULT_VOCAB

        return DEFAULT_VOCAB
    try:
        from engine import files

        sidecar = Path(config.data.path).expanduser() / "dataset.json"
        return int(files.read_json(sidecar, files.MiB, follow_links=True)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return config.data.vocab_size


def with_dataset_vocab(config: RunConfig) -> RunConfig:
    """`config` with the vocab its run would get (run_vocab) bound into model.vocab_size."""
    if config.model.vocab_size is not None:
        return config
    return config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": run_vocab(config)})})
