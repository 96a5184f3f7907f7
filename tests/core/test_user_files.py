"""Outputs the user names: refused before the work when they cannot be written, and a write
that fails midway (a full disk) ends in one line."""

from __future__ import annotations

import errno
import shutil
import sys
import types
from pathlib import Path

import pytest

import seqmoe.bench
import seqmoe.predictor.commands
import seqmoe.predictor.model
import seqmoe.trace
from seqmoe import SeqMoEError
from seqmoe.cli import main
from seqmoe.predictor import load_predictor, save_predictor

from .conftest import CHAT_TEXT


def last_error(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]  # after any progress bar


def never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the work ran although its output could not be written")


def disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    """A plain file: no folder can be made inside it, even by root."""
    file = tmp_path / "plain.txt"
    file.write_text(CHAT_TEXT)
    return file


def test_a_trace_folder_that_is_a_file_is_refused(mixtral_dir: Path, a_file: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seqmoe.trace, "save_file", never)
    status = main(["trace", "--model", str(mixtral_dir), "--device", "cpu", "--text", str(a_file), "--out", str(a_file)])
    assert status == 2 and last_error(capsys) == f"seqmoe: error: the trace folder {a_file} is a file; give a folder"


def test_training_is_not_started_for_a_predictor_file_it_cannot_write(
    traced: tuple[Path, Path], a_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.predictor.commands, "train_predictor", never)
    out = a_file / "predictor.safetensors"
    status = main(["train-predictor", "--traces", str(traced[1]), "--out", str(out)])
    error = last_error(capsys)
    assert status == 2 and error == f"seqmoe: error: --out {out}: cannot write in {a_file}: {a_file} is a file, not a folder"


def test_a_predictor_file_that_is_its_own_config_is_refused_before_training(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.predictor.commands, "train_predictor", never)
    out = tmp_path / "pred" / "model.json"
    status = main(["train-predictor", "--traces", str(traced[1]), "--out", str(out)])
    assert status == 2 and last_error(capsys) == (
        f"seqmoe: error: --out {out} is where the predictor's config goes, beside its weights; "
        f"give the weights file, such as {out.with_suffix('.safetensors')}")
    assert not out.exists()


@pytest.mark.parametrize(("out", "files", "refusal"), [
    # A name that is no predictor's: refused for the name, whatever is there.
    ("p2.txt", {"p2.txt": b"my notes", "p2.json": b'{"mine": 1}'}, "a predictor is a .safetensors file"),
    ("keep.md", {"keep.md": b"# keep"}, "a predictor is a .safetensors file"),
    ("notes", {"notes": b"my notes"}, "a predictor is a .safetensors file"),
    # The right name, over files that are not a predictor's: the one in the way is named.
    ("settings.safetensors", {"settings.json": b'{"theme": "dark"}'}, "{dir}/settings.json exists and is not a predictor"),
    ("weights.safetensors", {"weights.safetensors": b"someone's weights"},
     "{dir}/weights.safetensors exists and is not a predictor"),
])
def test_training_never_replaces_a_file_that_is_not_a_predictor(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    out: str, files: dict[str, bytes], refusal: str,
) -> None:
    # It used to train, then write safetensors bytes over the file and a config over its .json.
    monkeypatch.setattr(seqmoe.predictor.commands, "read_traces", never)  # refused before the traces are read
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    status = main(["train-predictor", "--traces", str(traced[1]), "--out", str(tmp_path / out)])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"seqmoe: error: --out {tmp_path / out}: {refusal.format(dir=tmp_path)}"), err
    assert {file.name: file.read_bytes() for file in tmp_path.iterdir()} == files


@pytest.mark.parametrize("out", ["config.safetensors", "model.safetensors"])
def test_training_never_replaces_a_models_files(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, out: str
) -> None:
    # --out model/config.safetensors used to replace the model's config.json with a predictor's.
    monkeypatch.setattr(seqmoe.predictor.commands, "read_traces", never)
    model = shutil.copytree(traced[0], tmp_path / "model")
    before = {file.name: file.read_bytes() for file in model.iterdir()}
    in_the_way = model / out if out == "model.safetensors" else model / "config.json"
    status = main(["train-predictor", "--traces", str(traced[1]), "--out", str(model / out)])
    assert status == 2 and last_error(capsys) == (f"seqmoe: error: --out {model / out}: {in_the_way} exists and is not a "
                                                  "predictor; give another name, or move the file away")
    assert {file.name: file.read_bytes() for file in model.iterdir()} == before


def test_training_over_a_predictor_replaces_it(traced: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "p.safetensors"
    train = ["train-predictor", "--traces", str(traced[1]), "--out", str(out), "--epochs", "1", "--horizon", "2"]
    assert main([*train, "--width", "16"]) == 0
    assert main([*train, "--width", "24"]) == 0
    assert load_predictor(out).config.width == 24
    assert sorted(file.name for file in tmp_path.iterdir()) == ["p.json", "p.safetensors"]


def test_a_file_above_the_output_is_named(traced: tuple[Path, Path], a_file: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seqmoe.predictor.commands, "train_predictor", never)
    out = a_file / "deeper" / "predictor.safetensors"
    status = main(["train-predictor", "--traces", str(traced[1]), "--out", str(out)])
    assert status == 2 and last_error(capsys) == (
        f"seqmoe: error: --out {out}: cannot write in {out.parent}: {a_file} is a file, not a folder")


def test_a_bench_is_not_run_for_a_plot_it_cannot_write(mixtral_dir: Path, a_file: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))  # present, whether installed or not
    monkeypatch.setattr(seqmoe.bench, "run_bench", never)
    plot = a_file / "bench.png"
    status = main(["bench", "--model", str(mixtral_dir), "--device", "cpu", "--plot", str(plot)])
    assert status == 2 and last_error(capsys).startswith(f"seqmoe: error: --plot {plot}: cannot write in")


def test_a_command_that_fails_after_checking_its_output_leaves_no_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "deeper" / "predictor.safetensors"
    status = main(["train-predictor", "--traces", str(tmp_path / "absent"), "--out", str(out)])
    assert status == 2 and "holds no traces" in last_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_given_for_a_predictor_file_is_refused(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqmoe.predictor.commands, "train_predictor", never)
    monkeypatch.chdir(tmp_path)
    assert main(["train-predictor", "--traces", str(traced[1]), "--out", "."]) == 2
    assert last_error(capsys) == "seqmoe: error: --out . is a folder; give a file name"
    assert main(["simulate", "--traces", str(traced[1]), "--policies", "seqmoe", "--predictor", "/"]) == 2
    assert last_error(capsys) == ("seqmoe: error: / is a folder; a predictor is a .safetensors file with its .json "
                                  "config beside it")


def test_a_predictors_config_given_for_the_predictor_names_its_weights(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to end in safetensors' "Error while deserializing header: header too large".
    main(["train-predictor", "--traces", str(traced[1]), "--out", str(tmp_path / "x.safetensors"), "--epochs", "1",
          "--width", "16", "--horizon", "2"])
    capsys.readouterr()
    status = main(["simulate", "--traces", str(traced[1]), "--policies", "seqmoe", "--predictor", str(tmp_path / "x.json")])
    assert status == 2 and last_error(capsys) == (f"seqmoe: error: {tmp_path / 'x.json'} is where a predictor's config "
                                                  f"goes; give its weights, {tmp_path / 'x.safetensors'}")


def test_a_full_disk_while_tracing_ends_in_one_line(mixtral_dir: Path, a_file: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seqmoe.trace, "save_file", disk_full)
    out = tmp_path / "traces"
    status = main(["trace", "--model", str(mixtral_dir), "--device", "cpu", "--text", str(a_file), "--out", str(out),
                   "--continuation", "2"])
    assert status == 2 and last_error(capsys) == f"seqmoe: error: cannot write {out / 'shard-00000.safetensors'}: No space left on device"
    assert not out.exists()  # made for the trace, and removed with it


def trace_empty_text(model: Path, out: Path, tmp_path: Path) -> int:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    return main(["trace", "--model", str(model), "--device", "cpu", "--text", str(empty), "--out", str(out)])


def test_a_users_own_manifest_is_never_removed(mixtral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "project"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my project"}')
    status = trace_empty_text(mixtral_dir, out, tmp_path)
    assert status == 2 and last_error(capsys) == (f"seqmoe: error: the trace folder {out} holds a manifest.json that is "
                                                  "not a seqmoe trace; give another folder")
    assert (out / "manifest.json").read_text() == '{"name": "my project"}'


def test_a_trace_of_nothing_leaves_the_earlier_trace_and_makes_no_folder(
    traced: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, earlier = traced
    manifest = (earlier / "manifest.json").read_text()
    assert trace_empty_text(model, earlier, tmp_path) == 2
    assert last_error(capsys) == "seqmoe: error: the text produced no tokens to trace"
    assert (earlier / "manifest.json").read_text() == manifest
    new = tmp_path / "new" / "traces"
    assert trace_empty_text(model, new, tmp_path) == 2
    assert not (tmp_path / "new").exists()


def test_a_full_disk_while_saving_a_predictor_is_one_line(traced: tuple[Path, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from seqmoe.predictor.training import TrainingOptions, train_predictor
    from seqmoe.trace import read_traces

    predictor = train_predictor(read_traces(traced[1]), TrainingOptions(epochs=1, width=16), progress=False)
    monkeypatch.setattr(seqmoe.predictor.model, "save_file", disk_full)
    with pytest.raises(SeqMoEError, match="No space left on device"):
        save_predictor(predictor, tmp_path / "p.safetensors")


def test_calibration_is_not_started_when_its_predictor_cannot_be_stored(
    mixtral_dir: Path, a_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqmoe.predictor.calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))  # the user cache lies under a plain file
    monkeypatch.setattr(seqmoe.predictor.calibration, "collect_traces", never)
    status = main(["calibrate", "--model", str(mixtral_dir), "--device", "cpu", "--text", str(a_file)])
    error = last_error(capsys)
    assert status == 2 and error.startswith("seqmoe: error: the predictor file ") and "cannot write in" in error, error

