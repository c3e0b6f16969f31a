"""ptlab.gpu_record: the recorded GPU runs validate, print labelled, refuse unknown lessons, and a new record is
written only where PTLAB_GPU_RECORD asks for one."""
import json

import pytest
import torch

from ptlab.gpu_record import (LESSONS, RECORD_ENV, RUNS_DIR, add_figures, gpu_environment, load_runs, record_figures,
                              recorded, recorded_figures, validate_run)

HEADER = {"format": 1, "gpu": "NVIDIA Test GPU", "torch": "2.14.1+cu130", "cuda": "13.0", "date": "2027-01-02",
          "machine": "a test", "sources": {}, "lessons": {}}


def test_the_shipped_records_validate_and_the_h200_run_is_there():
    runs = load_runs()
    assert runs, f"no record in {RUNS_DIR}"
    h200 = [r for r in runs if r["gpu"] == "NVIDIA H200" and r["date"] == "2026-12-04"]
    assert len(h200) == 1 and h200[0]["torch"] == "2.11.0+cu130"
    for path in RUNS_DIR.glob("*.json"):
        validate_run(json.loads(path.read_text(encoding="utf-8")), path.name)


def test_the_h200_figures_are_those_of_the_report():
    """A few figures, copied by hand from shared/reference/gpu/h200-first-run.md."""
    c96 = {f.what: f.value for f in recorded_figures("ch06-fp16-smallcnn")}
    assert c96["SmallCNN(width=64), batch 256, float32"] == 75794 and c96["float16 + GradScaler / float32"] == 0.876
    probe = {f.what: (f.value, f.source) for f in recorded_figures("ch06-speed-levers")}
    assert probe["resnet18, bfloat16 + channels_last / float32"][0] == 4.30
    assert probe["resnet18, float16 autocast + GradScaler / float32"][1].startswith("the first-run probe script")
    assert round(114148 / 71556, 2) == probe["SmallCNN, TF32 / float32"][0]


def test_recorded_labels_the_run_and_says_it_was_not_measured_here():
    text = recorded("ch06-fp16-smallcnn")
    assert text.splitlines()[0] == "recorded on NVIDIA H200, torch 2.11.0+cu130, 2026-12-04 (not measured here):"
    assert "75,794 images/s" in text and "0.876x" in text and "from course cell 06:c96" in text


def test_a_lesson_without_a_record_says_so(tmp_path):
    assert recorded("ch05-oom", folder=tmp_path).startswith("no GPU run recorded for ch05-oom yet")


def test_an_unknown_lesson_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown GPU lesson id 'ch6-amp'.*ch06-fp16-smallcnn"):
        recorded("ch6-amp")
    with pytest.raises(ValueError, match="unknown GPU lesson id"):
        record_figures("nope", {"x": (1.0, "x")}, "a test")


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("gpu"), "missing gpu"),
    (lambda r: r.update(date="4 Dec 2026"), "date must be YYYY-MM-DD"),
    (lambda r: r["lessons"].update({"ch99-new": r["lessons"]["ch06-fp16-smallcnn"]}), "unknown lesson id 'ch99-new'"),
    (lambda r: r["lessons"]["ch06-fp16-smallcnn"][0].pop("unit"), "exactly the keys"),
    (lambda r: r["lessons"]["ch06-fp16-smallcnn"][0].update(value="fast"), "value has the wrong type"),
    (lambda r: r["lessons"]["ch06-fp16-smallcnn"][0].update(source="elsewhere"), "is not one of the run's sources"),
])
def test_a_malformed_record_is_named(change, message):
    run = json.loads((RUNS_DIR / "h200-2026-12-04.json").read_text(encoding="utf-8"))
    change(run)
    with pytest.raises(ValueError, match=message):
        validate_run(run, "h200.json")


def test_without_the_variable_nothing_is_recorded(monkeypatch, tmp_path):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    assert record_figures("ch05-oom", {"largest batch": (960, "images")}, "course cell") is None
    assert list(tmp_path.iterdir()) == []


def test_figures_are_added_to_a_new_record_and_read_back(tmp_path):
    path = tmp_path / "run.json"
    add_figures(path, HEADER, "ch05-oom", {"largest batch that fit": (960, "images")}, "course cell, chapter 5")
    add_figures(path, HEADER, "ch06-launch-bound", {"fixed share": (0.61, "share")}, "course cell, chapter 6")
    add_figures(path, HEADER, "ch05-oom", {"largest batch that fit": (1024, "images")}, "course cell, chapter 5")
    run = json.loads(path.read_text(encoding="utf-8"))
    validate_run(run)
    assert [f["value"] for f in run["lessons"]["ch05-oom"]] == [1024]          # the same source replaces
    assert set(run["lessons"]) == {"ch05-oom", "ch06-launch-bound"}
    text = recorded("ch05-oom", folder=tmp_path)
    assert text.startswith("recorded on NVIDIA Test GPU, torch 2.14.1+cu130, 2027-01-02 (not measured here):")
    assert "1,024 images" in text


def test_a_record_of_another_gpu_is_not_appended_to(tmp_path):
    path = tmp_path / "run.json"
    add_figures(path, HEADER, "ch05-oom", {"largest batch that fit": (960, "images")}, "course cell")
    with pytest.raises(ValueError, match="write a new file"):
        add_figures(path, {**HEADER, "gpu": "NVIDIA Other"}, "ch05-oom", {"x": (1, "x")}, "course cell")


def test_bad_figures_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"figures\['speed'\] must be a \(number, unit\) pair"):
        add_figures(tmp_path / "r.json", HEADER, "ch05-oom", {"speed": 3.0}, "course cell")


def test_the_file_being_written_is_not_read_as_a_record(monkeypatch, tmp_path):
    path = tmp_path / "in-progress.json"
    add_figures(path, HEADER, "ch05-oom", {"largest batch that fit": (960, "images")}, "course cell")
    monkeypatch.setenv(RECORD_ENV, str(path))
    assert load_runs(tmp_path) == []


def test_every_lesson_has_a_description():
    assert all(isinstance(text, str) and text.startswith("chapter ") for text in LESSONS.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no CUDA")
def test_the_environment_header_needs_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        gpu_environment("cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_record_figures_on_a_gpu_writes_this_gpus_header(monkeypatch, tmp_path):
    path = tmp_path / "gpu.json"
    monkeypatch.setenv(RECORD_ENV, str(path))
    assert record_figures("ch05-oom", {"largest batch that fit": (960, "images")}, "a test") == path
    run = json.loads(path.read_text(encoding="utf-8"))
    assert run["gpu"] == torch.cuda.get_device_name() and run["torch"] == torch.__version__
