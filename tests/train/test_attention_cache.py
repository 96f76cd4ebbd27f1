"""The SDPA pick is part of what the compile caches key on (issue 37).

torch's AOTAutograd and FX graph caches live on disk, shared by every run of a user, and key
on neither SDPA's priority nor which kernels are switched on; the kernel is fixed when the graph
is traced. So a run under another pick loaded the first run's graph and ran its kernel while
naming the new one (reproduced here before the fix: the MATH-only run hit the cache and ran
`_scaled_dot_product_flash_attention_for_cpu`). Two processes share one compile cache: the
first compiles under SDPA's default (flash on this CPU), the second under MATH alone; each
builds its segment through build.parts + build.finish, the engine's own road to a compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT

CHILD = r"""
import contextlib, json, re, sys
from pathlib import Path
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch._dynamo.utils import counters
from torch._inductor.codecache import PyCodeCache
import torch.compiler.config as compiler_config
from engine.config import resolve
from engine.run.preflight import open_data
from engine.train import attention, build, distributed

data, run_dir, only = sys.argv[1:4]
config = resolve("micro", None, {"data.path": data, "speed.device": "cpu", "speed.precision": "fp32",
                                 "speed.compile": True, "speed.compile_scope": "model", "model.attention": "flash",
                                 "model.n_layer": 1})
config, dataset = open_data(config)
with sdpa_kernel(SDPBackend.MATH) if only == "math" else contextlib.nullcontext():
    p = build.parts(config, dataset, distributed.Context(), None)
    build.finish(p, config, Path(run_dir))
    x, y = p.loader.next()
    with attention.prefer(p.sdpa), p.autocast():
        _, loss = p.forward(x, y)
    loss.backward()
src = "".join(Path(m.__file__).read_text() for m in [*PyCodeCache.modules, *PyCodeCache.modules_no_attr.values()])
ops = sorted(set(re.findall(r"aten\._scaled_dot_product_\w+|aten\._efficient_attention\w*", src)))
print("RESULT " + json.dumps({"tag": compiler_config.cache_key_tag, "ops": ops, "aot": dict(counters["aot_autograd"])}))
"""


def _compile_in_a_process(tmp_path: Path, data: Path, cache: Path, only: str) -> dict[str, object]:
    env = {**os.environ, "GPT2_TUI_CACHE": str(cache)}
    env.pop("TORCH_COMPILE_CACHE_KEY_TAG", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(data), str(tmp_path / f"run-{only}"), only], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow
def test_a_math_only_run_never_loads_the_flash_graph_from_the_shared_cache(tmp_path, tiny_dataset) -> None:
    cache = tmp_path / "cache"
    flash = _compile_in_a_process(tmp_path, tiny_dataset, cache, "default")
    math = _compile_in_a_process(tmp_path, tiny_dataset, cache, "math")
    assert any("flash_attention" in op for op in flash["ops"]), flash  # the first run's graph: CPU's flash
    assert flash["tag"] != math["tag"] and "sdpa" in str(math["tag"])  # the pick is in the key
    assert math["aot"].get("autograd_cache_hit", 0) == 0, math  # compiled anew, not loaded
    assert not any("flash_attention" in op for op in math["ops"]), math  # and it runs what it asked for
