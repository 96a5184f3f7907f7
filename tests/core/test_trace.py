"""Trace folders: what a trace may be written over, what a re-trace leaves, what a manifest may
list; and documents past the model's context."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import seqmoe.cli
import seqmoe.trace
from seqmoe import SeqMoEError, load_model
from seqmoe.cli import main
from seqmoe.trace import Document, RoutingRecorder, read_documents, read_traces, trace_document, write_traces
from seqmoe.user_files import read_text

from .conftest import CHAT_TEXT


def never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model was loaded for a trace folder that is refused")


def trace(model: Path, text: Path, out: Path, *flags: str) -> int:
    return main(["trace", "--model", str(model), "--device", "cpu", "--text", str(text), "--out", str(out), *flags])


@pytest.fixture
def chat_text(tmp_path: Path) -> Path:
    text = tmp_path / "chat.txt"
    text.write_text(CHAT_TEXT)
    return text


def shards(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("shard-*"))


@pytest.mark.parametrize("content", [{"manifest.json": '{"name": "my project"}'}, {"notes.txt": "mine"}])
def test_a_folder_that_is_not_a_trace_is_refused_in_one_line_before_the_model_loads(
    traced: tuple[Path, Path], chat_text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, content: dict[str, str]
) -> None:
    monkeypatch.setattr(seqmoe.cli, "load_engine", never)
    out = tmp_path / "project"
    out.mkdir()
    for name, text in content.items():
        (out / name).write_text(text)
    status = trace(traced[0], chat_text, out)
    err = capsys.readouterr().err
    what = "a manifest.json that is not a seqmoe trace; give another folder" if "manifest.json" in content else (
        "files and no trace (notes.txt); give a new or empty folder")
    assert status == 2 and err == f"seqmoe: error: the trace folder {out} holds {what}\n"  # no progress bar before it
    assert {path.name: path.read_text() for path in out.iterdir()} == content


def test_a_folder_given_as_a_file_is_refused_before_the_model_loads(
    chat_text: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.cli, "load_engine", never)
    assert main(["trace", "--text", str(chat_text), "--out", str(chat_text)]) == 2
    assert capsys.readouterr().err == f"seqmoe: error: the trace folder {chat_text} is a file; give a folder\n"


def test_a_folder_checked_for_a_trace_that_then_fails_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(args: object) -> None:
        raise SeqMoEError("no model")

    monkeypatch.setattr(seqmoe.cli, "load_engine", no_model)
    assert main(["trace", "--text", "t.txt", "--out", str(tmp_path / "new" / "traces")]) == 2
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("leftover", "kept"), [(".DS_Store", True), ("shard-00003.safetensors", False),
                                              ("manifest.json.partial", False)])
def test_hidden_files_and_a_killed_traces_leftovers_do_not_refuse_a_folder(
    traced: tuple[Path, Path], chat_text: Path, tmp_path: Path, leftover: str, kept: bool
) -> None:
    out = tmp_path / "traces"
    out.mkdir()
    (out / leftover).write_text("")
    assert trace(traced[0], chat_text, out, "--max-tokens", "20") == 0
    assert read_traces(out).tokens > 0
    assert (out / leftover).exists() == kept  # a killed trace's leftovers go once this one is written


def test_a_smaller_re_trace_removes_the_earlier_traces_other_shards_and_nothing_else(
    traced: tuple[Path, Path], chat_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.trace, "SHARD_TOKENS", 1)  # a shard per document
    out = tmp_path / "traces"
    assert trace(traced[0], chat_text, out, "--continuation", "1") == 0
    assert len(shards(out)) == 12
    (out / "notes.txt").write_text("mine")
    (out / "shard-00099.safetensors").write_text("not listed: not the earlier trace's")
    short = tmp_path / "short.txt"
    short.write_text("hi\n\nthere")
    assert trace(traced[0], short, out, "--continuation", "1") == 0
    assert shards(out) == ["shard-00000.safetensors", "shard-00001.safetensors", "shard-00099.safetensors"]
    assert (out / "notes.txt").read_text() == "mine" and read_traces(out).manifest["documents"] == 2


def test_a_re_trace_stopped_midway_removes_the_earlier_traces_shards_too(
    traced: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"shard-{number:05d}.safetensors" for number in range(3)]  # an earlier trace of three shards
    folder = copy_with_shards(traced, tmp_path / "traces", names)
    for name in names[1:]:
        shutil.copy(folder / names[0], folder / name)
    (folder / "notes.txt").write_text("mine")
    model = json.loads((folder / "manifest.json").read_text())["model"]
    monkeypatch.setattr(seqmoe.trace, "SHARD_TOKENS", 1)

    def stopped() -> Iterator[dict[str, torch.Tensor]]:
        yield {"document": torch.zeros(3, dtype=torch.int32), "decode": torch.zeros(3, dtype=torch.uint8)}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_traces(folder, model, stopped())
    # Its manifest gone, the earlier trace's shards were nobody's: a later trace here would leave them as orphans.
    assert sorted(path.name for path in folder.iterdir()) == ["notes.txt"]


def test_a_re_trace_stopped_before_its_first_shard_leaves_the_earlier_trace_as_it_was(
    traced: tuple[Path, Path], tmp_path: Path
) -> None:
    folder = shutil.copytree(traced[1], tmp_path / "traces")
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    model = json.loads((folder / "manifest.json").read_text())["model"]

    def stopped() -> Iterator[dict[str, torch.Tensor]]:  # minutes of tracing short of a shard's 8192 tokens
        yield {"document": torch.zeros(3, dtype=torch.int32), "decode": torch.zeros(3, dtype=torch.uint8)}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_traces(folder, model, stopped())
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert read_traces(folder).tokens > 0


def copy_with_shards(traced: tuple[Path, Path], folder: Path, files: list[str]) -> Path:
    copy = shutil.copytree(traced[1], folder)
    manifest = json.loads((copy / "manifest.json").read_text())
    shard = manifest["shards"][0]
    manifest["shards"] = [{**shard, "file": file} for file in files]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_manifest_listing_a_shard_twice_is_refused(traced: tuple[Path, Path], tmp_path: Path) -> None:
    folder = copy_with_shards(traced, tmp_path / "traces", ["shard-00000.safetensors", "shard-00000.safetensors"])
    with pytest.raises(SeqMoEError, match="lists the shard shard-00000.safetensors twice; trace again"):
        read_traces(folder)


@pytest.mark.parametrize("file", ["../other/shard-00000.safetensors", "{absolute}", "sub/shard-00000.safetensors"])
def test_a_manifest_listing_a_shard_outside_its_folder_is_refused(traced: tuple[Path, Path], tmp_path: Path, file: str) -> None:
    other = shutil.copytree(traced[1], tmp_path / "other")  # each shard there the one the manifest lists
    folder = copy_with_shards(traced, tmp_path / "traces", [file.format(absolute=other / "shard-00000.safetensors")])
    shutil.copytree(traced[1], folder / "sub")
    with pytest.raises(SeqMoEError, match="not a file in .*: a trace's shards lie in its folder"):
        read_traces(folder)


def test_a_text_past_the_models_context_is_traced_in_windows_it_holds(
    traced: tuple[Path, Path], tmp_path: Path
) -> None:
    model, _ = traced
    long = tmp_path / "long.txt"
    long.write_text("a" * 600)  # one paragraph of 600 tokens; the tiny model's context is 256 positions
    out = tmp_path / "traces"
    assert trace(model, long, out, "--continuation", "4") == 0
    traces = read_traces(out)
    windows = [traces.document == number for number in traces.document.unique().tolist()]
    prefill = [int((window & (traces.decode == 0)).sum()) for window in windows]
    assert prefill == [252, 252, 96] and all(int(window.sum()) <= 256 for window in windows)  # room for 4 more each
    assert set(traces.paragraph.tolist()) == {0}  # one paragraph of the text: never split between training and validation


def test_an_explicit_context_shorter_than_the_models_sets_the_windows(mixtral_dir: Path) -> None:
    from seqmoe.trace import TextDocument, iter_traces

    loaded = load_model(str(mixtral_dir), device="cpu")
    records = list(iter_traces(loaded, [TextDocument(list(range(2, 102)), 0)], 4, context=40))
    assert [int(r["decode"].shape[0] - r["decode"].sum()) for r in records] == [36, 36, 28]
    assert all(r["decode"].shape[0] <= 40 for r in records) and [int(r["document"][0]) for r in records] == [0, 1, 2]


def test_the_commands_context_sets_the_windows(traced: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = traced
    text = tmp_path / "text.txt"
    text.write_text("a" * 100)
    out = tmp_path / "traces"
    assert trace(model, text, out, "--continuation", "4", "--context", "40") == 0  # --context was accepted and ignored
    traces = read_traces(out)
    assert sorted(set(traces.document.tolist())) == [0, 1, 2] and traces.tokens == 100 + 3 * 4


def test_a_continuation_that_leaves_no_room_for_text_is_refused(mixtral_dir: Path) -> None:
    from seqmoe.trace import TextDocument, iter_traces

    loaded = load_model(str(mixtral_dir), device="cpu")
    with pytest.raises(SeqMoEError, match="a continuation of 40 tokens leaves no room for the text in the 40-token context"):
        list(iter_traces(loaded, [TextDocument(list(range(2, 102)), 0)], 40, context=40))


def test_a_single_document_past_the_models_context_is_refused(mixtral_dir: Path) -> None:
    loaded = load_model(str(mixtral_dir), device="cpu")
    recorder = RoutingRecorder(loaded)
    try:
        with pytest.raises(SeqMoEError, match="the document is 250 tokens, continued for 10, and the context holds 256"):
            trace_document(loaded, recorder, Document([5] * 250, 10))
    finally:
        recorder.close()


def test_documents_split_at_newlines_only_and_lose_a_byte_order_mark(tmp_path: Path) -> None:
    file = tmp_path / "text.txt"
    file.write_bytes("\ufeffhi\u2028there\nfine\x85thanks\n\nnext".encode())
    documents = read_documents(read_text(file), lambda lines: lines)
    assert [d.ids for d in documents] == [["hi\u2028there", "fine\x85thanks"], ["next"]]
