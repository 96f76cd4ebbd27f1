"""One preflight for every front door (issue 36): a rule planted in engine.run.preflight.RULES
is seen by the CLI's new run and resume, the form, the Switches dialog and `toggle`, and the
measuring tools; the `--init-from` shape is read once on the CLI path; inputs that have no
effect warn (issue 39), only when the user gave them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import rundir
from engine.cli import main
from engine.config import resolve
from engine.errors import UserError
from engine.run import preflight as P
from engine.run import toggle

PLANTED = "planted rule: every config is refused"
MICRO = ["--preset", "micro", "--device", "cpu", "--max-steps", "1", "--eval-interval", "1", "--sample-tokens", "0"]


def planted(c: P.Check) -> None:
    c.refuse(UserError(PLANTED, {"train.seed": 1}))


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "RULES", [*P.RULES, planted])


def test_the_cli_new_run_reaches_preflight(plant, tiny_dataset: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run)]) == 2
    assert PLANTED in capsys.readouterr().err and not run.exists()  # refused before a byte is written


@pytest.mark.slow
def test_the_cli_resume_reaches_preflight(tiny_dataset: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run)]) == 0
    before = (run / rundir.EVENTS).read_bytes()
    monkeypatch.setattr(P, "RULES", [*P.RULES, planted])
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--max-steps", "2"]) == 2
    assert PLANTED in capsys.readouterr().err and (run / rundir.EVENTS).read_bytes() == before


def test_the_form_reaches_preflight(plant) -> None:
    from engine.device import capabilities
    from tui.models import form as F

    model = F.FormModel(resolve("micro", overrides={"speed.device": "cpu"}))
    model.caps = capabilities()
    values = {d: F.to_text(F.get_value(model.base, d)) for d in F.ALL_FIELDS} | {"data.path": None}
    model.check(values)
    assert model.errors["train.seed"].startswith(PLANTED) and "set seed to 1" in model.errors["train.seed"]
    assert model.config is None and "seed" in (model.refusal() or "")


def test_toggle_check_reaches_preflight(tiny_dataset: Path, monkeypatch) -> None:
    config, _ = P.open_data(resolve("micro", overrides={"data.path": str(tiny_dataset), "speed.device": "cpu"}))
    assert toggle.check(config, {"data.preload": False}, held=0).data.preload is False
    monkeypatch.setattr(P, "RULES", [*P.RULES, planted])
    with pytest.raises(UserError, match=PLANTED):
        toggle.check(config, {"data.preload": False}, held=0)


def test_the_switches_dialog_reaches_preflight(tiny_dataset: Path, tmp_path: Path, monkeypatch) -> None:
    from textual.app import App
    from textual.widgets import Switch

    from tui.screens.toggle import ToggleScreen, wid

    config, _ = P.open_data(resolve("micro", overrides={"data.path": str(tiny_dataset), "speed.device": "cpu"}))
    monkeypatch.setattr(P, "RULES", [*P.RULES, planted])
    screen = ToggleScreen(tmp_path, config, held=0, send=lambda request: None)

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(screen)

    async def drive() -> str | None:
        async with Host().run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            screen.query_one("#" + wid("data.preload"), Switch).value = False
            await pilot.pause()
            return screen.problem

    assert PLANTED in (asyncio.run(drive()) or "")


def test_the_measuring_tools_reach_preflight(plant, tiny_dataset: Path, tmp_path: Path) -> None:
    from bench import plain
    from bench.common import BenchOptions

    out = tmp_path / "plain"
    with pytest.raises(UserError, match=PLANTED):
        plain.run(BenchOptions(preset="micro", data=str(tiny_dataset), device="cpu", out=out, steps=1, rounds=1,
                               vocab_size=None), "test")  # fmt: skip
    assert not out.exists()


@pytest.mark.slow
def test_the_cli_reads_the_pretrained_shape_once(tiny_dataset: Path, tmp_path: Path, monkeypatch) -> None:
    """new_config and Run.open each re-applied the `--init-from` shape; preflight decides it once
    and Run.open takes the judged config as it is."""
    pytest.importorskip("transformers")
    from tests.make_tiny_gpt2 import make

    tiny = make(tmp_path / "tiny")
    calls: list[str] = []
    real = P.with_pretrained_shape

    def counted(config, *args, **kwargs):
        calls.append(str(config.model.init_from))
        return real(config, *args, **kwargs)

    monkeypatch.setattr(P, "with_pretrained_shape", counted)
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--init-from", str(tiny), "--data", str(tiny_dataset), "--out", str(run),
                 "--block-size", "32"]) == 0  # fmt: skip
    assert calls == [str(tiny)]
    assert rundir.load_config(run).model.n_embd == 32  # the weights' shape, not micro's


@pytest.mark.slow
def test_inputs_of_no_effect_warn_once_each_when_the_user_gave_them(tiny_dataset: Path, tmp_path: Path,
                                                                    capsys) -> None:  # fmt: skip
    """Issue 39: --decay-fraction with cosine, --muon-lr / --muon-momentum with AdamW, a wsd
    decay shorter than a step: one `warning:` line each on the CLI, notes in the form; a
    preset's own values (not the user's) never warn."""
    given = {"optim.decay_fraction": 0.3, "optim.muon_lr": 0.05, "optim.muon_momentum": 0.9}
    v = P.preflight(resolve("micro", overrides=given), explicit=given, dataset=False, memory=False)
    said = [w.problem.split(" ")[:2] for w in v.warnings]
    assert said == [["decay", "fraction"], ["muon", "lr"], ["muon", "momentum"]]
    assert P.preflight(resolve("micro", overrides=given), dataset=False, memory=False).warnings == []  # not the user's
    wsd = {"optim.schedule": "wsd", "optim.decay_fraction": 0.01, "train.max_steps": 20}
    v = P.preflight(resolve("micro", overrides=wsd), explicit=wsd, dataset=False, memory=False)
    assert len(v.warnings) == 1 and "shorter than one step" in v.warnings[0].problem
    run = tmp_path / "run"
    assert main(["train", *MICRO, "--data", str(tiny_dataset), "--out", str(run), "--muon-lr", "0.05"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "muon lr" in ln]
    assert lines == ["warning: muon lr 0.05 has no effect with the AdamW optimizer (it is Muon's); "
                     "pass --optimizer muon"]

    from engine.device import capabilities
    from tui.models import form as F

    model = F.FormModel(resolve("micro", overrides={"speed.device": "cpu"}))
    model.caps = capabilities()
    values = {d: F.to_text(F.get_value(model.base, d)) for d in F.ALL_FIELDS} | {"data.path": None}
    model.check(values)
    assert model.notes == [] and model.errors == {}
    if "optim.decay_fraction" in F.ALL_FIELDS:
        model.check(values | {"optim.decay_fraction": "0.3"})
        assert any(n.startswith("decay fraction 0.3 has no effect") and "set schedule to wsd" in n for n in model.notes)


@pytest.mark.parametrize("native", ["none", "bf16"])
@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16", "fp16"])
def test_a_precision_this_cpu_only_emulates_is_said_at_preflight_with_the_fix(monkeypatch, native, precision):
    """Issue 47 item 1: bf16 or fp16 on a CPU that only emulates it warns in the one preflight (so the
    CLI's start, the form, the Switches dialog and toggle all say it), naming the fix; `auto`
    resolves to what the CPU runs natively and never warns. Each side of the CPU forced."""
    from harness import force_cpu_native

    force_cpu_native(monkeypatch, native)
    config = resolve("micro", None, {"speed.device": "cpu", "speed.precision": precision})
    verdict = P.preflight(config, dataset=False)
    said = [str(w) for w in verdict.warnings if "native" in str(w)]
    emulated = precision in ("bf16", "fp16") and precision not in native.split(",")
    assert len(said) == (1 if emulated else 0), verdict.warnings
    if emulated:
        assert f"no native {precision}" in said[0] and "fp32" in said[0] and "ms" in said[0]  # measured, the fix
        assert verdict.config is not None and said[0] in verdict.config.notes  # said as the run starts
        form = P.preflight(config, dataset=False, local_only=True)  # the form's: nothing timed on each change
        assert [str(w) for w in form.warnings if "native" in str(w)] and "ms" not in str(form.warnings[0])


def test_a_resume_refuses_every_recipe_switch_that_changes_the_model(tmp_path, capsys):
    """Issue 46, class F: a recipe switch given at `--resume` with another value than the run's
    changes what the trained weights compute; refused in one line naming the flag and the fix,
    for every switch the config declares (the table is read from it), nothing written. The same
    value as the run's is no change and passes."""
    from engine import rundir as rd
    from engine.cli import as_flags
    from harness import model_switches, tree_snapshot

    run = tmp_path / "run"
    run.mkdir()
    rd.write_config(run, resolve("micro", None, {"speed.device": "cpu"}))
    before = tree_snapshot(tmp_path)
    for dotted, value in model_switches().items():
        with pytest.raises(UserError) as refused:
            P.resumed_config(run, {dotted: value})
        said = str(refused.value)
        assert "\n" not in said and "changes what the model computes" in said and "new run" in said, said
        assert as_flags({dotted: value})[0] in said, said
        same = resolve("micro", None, {"speed.device": "cpu", dotted: value})
        rd.write_config(run, same)
        assert getattr(P.resumed_config(run, {dotted: value}).model, dotted.split(".")[1]) == value  # no change
        rd.write_config(run, resolve("micro", None, {"speed.device": "cpu"}))
    assert tree_snapshot(tmp_path).keys() == before.keys()


def test_more_inputs_of_no_effect_are_said_and_the_advice_is_a_value_the_config_takes():
    """Issue 47's minor items: --optimizer adamw over a preset whose Muon settings are its own (the
    speedrun's momentum warm-up) warns that they are inert; an attention window the block cannot
    exceed warns; the wsd advice never names a decay fraction past its bound of 1."""
    chose = {"optim.optimizer": "adamw"}
    v = P.preflight(resolve("speedrun", overrides=chose), explicit=chose, dataset=False, memory=False)
    assert any(w.problem.startswith("muon momentum warmup") and "no effect" in w.problem for w in v.warnings), v.warnings
    assert not [w for w in P.preflight(resolve("speedrun", overrides=chose), dataset=False, memory=False).warnings
                if "muon" in w.problem]  # fmt: skip
    wide = {"model.attn_window": 500}  # micro's block: 32 tokens
    v = P.preflight(resolve("micro", overrides=wide), explicit=wide, dataset=False, memory=False)
    said = [w for w in v.warnings if "attention window" in w.problem]
    assert len(said) == 1 and "no effect" in said[0].problem, v.warnings
    window = int(said[0].fixes[0]["model.attn_window"].split()[0])
    narrow = {"model.attn_window": window}
    assert not [w for w in P.preflight(resolve("micro", overrides=narrow), explicit=narrow, dataset=False,
                                       memory=False).warnings if "attention window" in w.problem]  # fmt: skip
    short = {"optim.schedule": "wsd", "optim.decay_fraction": 0.5, "train.max_steps": 1}
    v = P.preflight(resolve("micro", overrides=short), explicit=short, dataset=False, memory=False)
    (fix,) = [f["optim.decay_fraction"] for w in v.warnings for f in w.fixes if "optim.decay_fraction" in f]
    assert fix == "1"  # not "1 or more": more is refused


def test_loss_auto_is_chosen_for_the_device_the_run_is_on_and_says_why():
    """Issue 45 item 4: the speedrun preset states intent (loss auto); the device decides. On a CPU the
    chunked loss (measured faster there); on a GPU the plain one where its logits fit, else chunked.
    The run's config holds the choice (config.toml, run_started) and a note says why."""
    assert P.choose_loss("cpu", True)[0] == "chunked"
    assert P.choose_loss("cuda", True)[0] == "plain" and P.choose_loss("cuda", False)[0] == "chunked"
    assert resolve("speedrun").model.loss == "auto"
    v = P.preflight(resolve("speedrun", None, {"speed.device": "cpu"}), dataset=False, memory=False)
    assert v.config is not None and v.config.model.loss == "chunked"
    assert any(n.startswith("loss auto: chunked (on a CPU") for n in v.config.notes), v.config.notes
    plain = P.preflight(resolve("speedrun", None, {"speed.device": "cpu", "model.loss": "plain"}), dataset=False,
                        memory=False)  # fmt: skip
    assert plain.config is not None and plain.config.model.loss == "plain"  # a loss given is kept


@pytest.mark.slow  # starts burner processes
def test_the_emulated_precision_word_gives_a_factor_and_says_when_it_was_timed_on_a_busy_machine(monkeypatch):
    """Issue 47 minor: the ladder's AMP-skip note printed a matmul timed beside a hog (2598 ms bf16
    vs 676 ms fp32) as a property of the CPU. The word now gives the factor, and a timing taken
    while the machine was busy (the contention rule, over the timing's own tries) says so."""
    from engine import device
    from engine.train import contention
    from harness import busy_machine, force_cpu_native

    force_cpu_native(monkeypatch, "none")
    device._matmul_ms.cache_clear()
    monkeypatch.setattr(contention, "_HALF_BUSY", {})  # timed afresh here, beside the burners
    with busy_machine():
        said = contention.half_reason("bf16")
    device._matmul_ms.cache_clear()
    assert said is not None and "x fp32's time here" in said and "timed on a busy machine" in said, said
    factor = float(said.split("matmul took ")[1].split("x")[0])
    assert factor > 0, said  # (forced "none" on a CPU with AMX, bf16 may well be the faster)


def test_the_emulated_precision_word_has_one_road() -> None:
    """Every front door words an emulated precision through contention.half_reason (the timing and
    whether the machine was busy over it): a scan, so a new door cannot print the bare timing."""
    from harness import ROOT

    users = [p.relative_to(ROOT).as_posix() for d in ("engine", "bench", "tui") for p in (ROOT / d).rglob("*.py")
             if "cpu_half_reason(" in p.read_text()]  # fmt: skip
    assert sorted(users) == ["engine/device.py", "engine/train/contention.py"], users


@pytest.mark.parametrize("given,warned", [
    ({"speed.compile": False}, "FlexAttention is fast only compiled"),
    ({"speed.compile": True, "model.dropout": 0.1}, "FlexAttention has no dropout"),
    ({"speed.compile": True, "model.block_size": 256, "train.block_size": 200}, "multiple of 128"),  # off flex's block
    ({"speed.compile": True, "train.block_size": 96}, "multiple of 128"),  # and no whole block to offer: no fix
    ({"speed.compile": True}, None),  # flex runs it
    ({"speed.compile": False, "speed.device": "cpu"}, None),  # no flex backward on a CPU: the dense band is its own
    ({"speed.compile": False, "model.attention": "manual"}, None),  # the unoptimized path, by choice
], ids=["cuda-eager", "cuda-dropout", "cuda-block-200", "cuda-block-96", "cuda-compiled", "cpu", "manual"])  # fmt: skip
def test_a_window_a_gpu_would_run_through_the_dense_kernel_warns_with_the_fix(given: dict, warned: str | None) -> None:
    """Issue 45 item 3: on CUDA the window costs a step more than it saves unless FlexAttention runs
    it; where it will not, the run's start and the form say why and how to have it."""
    over = {"speed.device": "cuda", "model.attn_window": 8, "model.block_size": 128, "train.block_size": 128} | given
    v = P.preflight(resolve("micro", overrides=over), explicit=over, dataset=False, memory=False)
    said = [w for w in v.warnings if "dense masked kernel" in w.problem]
    assert [warned in w.problem for w in said] == ([True] if warned else [])
    if warned:
        fix = {"compiled": {"speed.compile": True}, "dropout": {"model.dropout": 0}, "128": {"train.block_size": 128}}
        want = tuple(f for word, f in fix.items() if word in warned and given.get("train.block_size") != 96)
        assert said[0].fixes == want
