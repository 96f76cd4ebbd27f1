"""The speedrun's data-side recipe switches (issue 40) on the real engine: data.align_docs (train rows
start at document starts) and train.batch_ramp (fewer micro-batches a step early on)."""

from pathlib import Path

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from engine.config import resolve
from engine.dataset import open_dataset
from engine.train.batches import BatchSampler, document_starts
from harness import CPU, MICRO, built_parts, cli_fails, losses, stopped_at, trained

EOT, V, T, B = 63, 64, 32, 4  # the micro preset's block and batch


def documents(n: int, seed: int, short: int = 10, long: int = 120) -> np.ndarray:
    """n tokens of documents of random length, each after an EOT (as `prepare` writes them)."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    while sum(map(len, out)) < n:
        out.append(np.concatenate([[EOT], rng.integers(0, EOT, rng.integers(short, long))]))
    return np.concatenate(out)[:n]


@pytest.fixture
def docs_dataset(make_dataset) -> Path:
    return make_dataset("gpt2-tui", train=documents(20_000, 1), val=documents(4_000, 2), eot_id=EOT, name="docs")


def starts_of(tokens: np.ndarray, rows: np.ndarray) -> list[int]:
    """Where each row (T + 1 tokens) sits in `tokens` (random windows: one place each)."""
    where: dict[bytes, list[int]] = {}
    for p, w in enumerate(sliding_window_view(tokens.astype(np.int64), rows.shape[1])):
        where.setdefault(w.tobytes(), []).append(p)
    return [p for row in rows for p in where[row.astype(np.int64).tobytes()]]


def assert_document_starts(tokens: np.ndarray, rows: np.ndarray) -> None:
    found = starts_of(tokens, rows)
    assert len(found) == len(rows)
    assert all(p == 0 or tokens[p - 1] == EOT for p in found), [p for p in found if p and tokens[p - 1] != EOT]


# ---------------------------------------------------------------- data.align_docs


@pytest.mark.parametrize("preload, vectorized", [(True, True), (False, True), (True, False), (False, False)])
def test_aligned_training_rows_start_after_an_end_of_text_token(tmp_path, docs_dataset, preload, vectorized):
    parts = built_parts(docs_dataset, tmp_path, {"data.align_docs": True, "data.preload": preload,
                                                  "data.vectorized": vectorized} | CPU)  # fmt: skip
    try:
        batches = [parts.loader.next() for _ in range(25)]
    finally:
        parts.loader.close()
    tokens = np.fromfile(docs_dataset / "train.bin", dtype="<u2")
    rows = np.concatenate([np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1) for x, y in batches])
    assert_document_starts(tokens, rows)
    assert len(set(starts_of(tokens, rows))) > 50  # drawn across the documents, not a few of them


def test_unaligned_rows_start_anywhere(tmp_path, docs_dataset):
    """The check above has teeth: today's sampler starts most rows inside a document."""
    parts = built_parts(docs_dataset, tmp_path, CPU)
    try:
        x, y = parts.loader.next()
    finally:
        parts.loader.close()
    tokens = np.fromfile(docs_dataset / "train.bin", dtype="<u2")
    with pytest.raises(AssertionError):
        assert_document_starts(tokens, np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1))


def test_aligned_rows_across_llmc_shards_start_at_documents(make_dataset):
    """Several shards laid end to end: each start maps back to its own shard, none spans two."""
    shards = [documents(3_000, 5), documents(2_000, 6)[1:], documents(4_000, 7)]  # the second opens mid-document
    ds = open_dataset(make_dataset("llmc", train=shards, val=documents(1_000, 8)))
    sampler = BatchSampler(ds.train, 8, T, seed=4)
    sampler.align(document_starts(ds.train, EOT, T))
    rows = [np.concatenate([x, y[:, -1:]], axis=1) for x, y in (sampler.next() for _ in range(40))]
    seen = set()
    for tokens in shards:
        where = {w.tobytes(): p for p, w in enumerate(sliding_window_view(tokens.astype(np.int64), T + 1))}
        for row in np.concatenate(rows):
            p = where.get(row.tobytes())
            if p is not None:
                assert tokens[0] != EOT if p == 0 else tokens[p - 1] == EOT
                seen.add((id(tokens), p))
    assert len(seen) > 100 and {s for s, _ in seen} == {id(t) for t in shards}


def test_document_starts_are_the_tokens_after_each_end_of_text(make_dataset):
    train = np.array([EOT, 1, 2, EOT, 3, EOT, 4, 5, 6, 7, EOT, 8, 9, EOT], dtype=np.int64)
    ds = open_dataset(make_dataset("gpt2-tui", train=train, val=train, eot_id=EOT))
    assert document_starts(ds.train, EOT, 4).tolist() == [1, 4, 6]  # 11: fewer than 5 tokens after it
    assert document_starts(ds.train, EOT, 2).tolist() == [1, 4, 6, 11]
    assert document_starts(ds.train, 9, 2).tolist() == [0]  # no end-of-text before it: the shard's first token


@pytest.mark.slow
def test_align_docs_resumes_bit_exact(tmp_path, docs_dataset):
    common = {"train.max_steps": 10, "data.align_docs": True, "data.prefetch": True, "train.eval_interval": 5,
              "train.ckpt_interval": 100, "model.dropout": 0.1}  # fmt: skip
    straight = trained(tmp_path / "straight", docs_dataset, **common)
    stopped_at(tmp_path / "split", docs_dataset, 4, **common)
    both = trained(tmp_path / "split", resume=True)
    assert losses(both) == losses(straight)
    other = trained(tmp_path / "unaligned", docs_dataset, **(common | {"data.align_docs": False}))
    assert losses(other) != losses(straight)  # the switch changes the batches


def test_align_docs_on_a_dataset_without_an_end_of_text_id_is_refused(tmp_path, make_dataset, capsys):
    data = make_dataset("nanogpt")
    err = cli_fails(capsys, ["train", *MICRO, "--data", str(data), "--out", str(tmp_path / "r"), "--align-docs"],
                    "align_docs", "end-of-text", "--no-align-docs")  # fmt: skip
    assert not (tmp_path / "r").exists()
    assert "nanogpt" in err


def test_align_docs_on_too_few_documents_is_refused(tmp_path, make_dataset, capsys):
    one = make_dataset("gpt2-tui", train=documents(5_000, 3, short=3_000, long=4_000)[:5_000], eot_id=EOT)
    cli_fails(capsys, ["train", *MICRO, "--data", str(one), "--out", str(tmp_path / "r"), "--align-docs"],
              "align_docs", "has 2 that start a block", "--no-align-docs")  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_the_form_judges_align_docs_from_the_dataset_info(make_dataset):
    from engine.run.preflight import preflight

    info = open_dataset(make_dataset("llmc")).info
    config = resolve("micro", None, {"data.align_docs": True, "speed.device": "cpu"})
    assert "data.align_docs" in preflight(config, dataset=info, memory=False).errors


# ---------------------------------------------------------------- train.batch_ramp


def test_ramp_schedule():
    t = resolve("micro", None, {"train.grad_accum": 4, "train.batch_ramp": 6, "train.max_steps": 10}).train
    assert [t.accum_at(s) for s in range(8)] == [1, 2, 2, 3, 4, 4, 4, 4]  # ceil(4 * (s + 1) / 6)
    assert [resolve("micro", None, {"train.grad_accum": 4}).train.accum_at(s) for s in range(3)] == [4, 4, 4]


@pytest.mark.slow
def test_the_tokens_each_step_trains_on_follow_the_ramp(tmp_path, tiny_dataset):
    events = trained(tmp_path / "run", tiny_dataset, **{"train.grad_accum": 4, "train.batch_ramp": 6,
                                                          "train.max_steps": 9, "train.eval_interval": 9})  # fmt: skip
    steps = [e for e in events if e.event == "step"]
    taken = [b.tokens - a for a, b in zip([0] + [s.tokens for s in steps], steps)]
    assert taken == [n * B * T for n in (1, 2, 2, 3, 4, 4, 4, 4, 4)]
    for s, n in zip(steps, taken):
        assert s.tokens_per_s == pytest.approx(n / s.step_time_s)
    assert [e.tokens for e in events if e.event == "eval"] == [steps[-1].tokens]
    summary = events[-1].summary
    assert summary["tokens_per_s"] == pytest.approx(4 * B * T / summary["median_step_time_s"])


@pytest.mark.slow
def test_a_logged_interval_in_the_ramp_reports_its_own_tokens_per_second(tmp_path, tiny_dataset):
    flags = {"train.grad_accum": 4, "train.batch_ramp": 8, "train.max_steps": 12, "train.log_interval": 4,
             "train.eval_interval": 12, "train.ckpt_interval": 12}  # fmt: skip
    events = trained(tmp_path / "run", tiny_dataset, **flags)
    steps = [e for e in events if e.event == "step"]
    assert [s.tokens for s in steps] == [n * B * T for n in (1 + 1 + 2 + 2, 6 + 3 + 3 + 4 + 4, 20 + 4 * 4)]
    per_step = [6 / 4, 14 / 4, 16 / 4]  # micro-batches a step in each interval
    for s, n in zip(steps, per_step):
        assert s.tokens_per_s * s.step_time_s == pytest.approx(n * B * T)


@pytest.mark.slow
def test_the_loss_is_the_mean_over_the_micro_batches_taken(tmp_path, tiny_dataset):
    """Step 1 of a ramp takes one micro-batch: the same loss as a run of one micro-batch a step."""
    ramp = trained(tmp_path / "ramp", tiny_dataset, **{"train.grad_accum": 4, "train.batch_ramp": 4,
                                                       "train.max_steps": 5})  # fmt: skip
    one = trained(tmp_path / "one", tiny_dataset, **{"train.max_steps": 1})
    assert losses(ramp)[0] == losses(one)[0]


@pytest.mark.slow
def test_resume_in_the_middle_of_the_ramp_is_bit_exact(tmp_path, tiny_dataset):
    common = {"train.grad_accum": 3, "train.batch_ramp": 8, "train.max_steps": 10, "train.eval_interval": 5,
              "train.ckpt_interval": 100, "data.prefetch": True, "model.dropout": 0.1}  # fmt: skip
    straight = trained(tmp_path / "straight", tiny_dataset, **common)
    stopped_at(tmp_path / "split", tiny_dataset, 3, **common)
    both = trained(tmp_path / "split", resume=True)
    assert losses(both) == losses(straight)
    tokens = lambda evs: [(e.step, e.tokens) for e in evs  # noqa: E731
                          if e.event == "step" or e.event == "eval" and e.step == 10]  # fmt: skip
    assert tokens(both) == tokens(straight)  # the steps after the resume count the ramp's tokens on


@pytest.mark.parametrize("flags, words", [
    (["--grad-accum", "1", "--batch-ramp", "5"], ["batch ramp 5", "grad accumulation", "--grad-accum 2 or more"]),
    (["--grad-accum", "2", "--batch-ramp", "20", "--max-steps", "20"], ["batch ramp 20", "--batch-ramp 19 or less"]),
])  # fmt: skip
def test_a_ramp_with_nothing_to_ramp_is_refused(tmp_path, tiny_dataset, capsys, flags, words):
    cli_fails(capsys, ["train", *MICRO, "--data", str(tiny_dataset), "--out", str(tmp_path / "r"), *flags], *words)
    assert not (tmp_path / "r").exists()


def test_align_docs_warns_when_long_documents_leave_most_tokens_unseen(make_dataset):
    from engine.run.preflight import preflight

    config = resolve("micro", None, {"data.align_docs": True} | CPU)
    short = make_dataset("gpt2-tui", train=documents(20_000, 1, short=5, long=20), eot_id=EOT)
    long = make_dataset("gpt2-tui", train=documents(20_000, 1, short=300, long=400), eot_id=EOT)
    quiet = preflight(config.model_copy(update={"data": config.data.model_copy(update={"path": str(short)})}))
    assert quiet.found == [] and quiet.warnings == []
    loud = preflight(config.model_copy(update={"data": config.data.model_copy(update={"path": str(long)})}))
    assert loud.found == [] and [str(w) for w in loud.warnings] == [
        "data.align_docs: rows from document starts reach only 9% of the train split's tokens "
        "(its documents are longer than a block of 32)"]  # fmt: skip
