"""ptlab.experiments: the run log survives a crash, compares runs side by side, plots their curves."""
import json

import pytest
import torch

from ptlab.experiments import Run, compare_runs, load_runs, log_run, plot_runs


def test_runs_are_appended_and_read_back(tmp_path):
    first = log_run({"lr": 1e-3, "epochs": 2}, {"val_acc": 0.81, "val_loss": torch.tensor(0.52)},
                    history={"val_loss": [0.9, 0.52], "seconds": [1.0, 1.1]}, checkpoint=tmp_path / "a.pt",
                    runs_dir=tmp_path)
    log_run({"lr": 1e-2, "epochs": 2}, {"val_acc": 0.86, "val_loss": 0.41}, runs_dir=tmp_path)
    runs = load_runs(tmp_path)
    assert [r.name for r in runs] == ["run-001", "run-002"] and first.name == "run-001"
    assert runs[0].metrics == {"val_acc": 0.81, "val_loss": pytest.approx(0.52)}
    assert runs[0].curves == {"val_loss": [0.9, 0.52]}, "wall time is not logged: it is the machine's, not the run's"
    assert runs[0].checkpoint.endswith("a.pt")


def test_a_line_cut_by_a_crash_loses_only_that_run(tmp_path):
    log_run({"lr": 1}, {"acc": 0.5}, runs_dir=tmp_path)
    with open(tmp_path / "runs.jsonl", "a") as handle:
        handle.write('{"name": "run-002", "config": {"lr"')
    with pytest.warns(UserWarning, match="runs.jsonl:2 is not a complete run record"):
        assert [r.name for r in load_runs(tmp_path)] == ["run-001"]


def test_table_shows_differing_config_and_sorts_by_a_metric(tmp_path):
    log_run({"lr": 0.1, "seed": 0}, {"val_acc": 0.70}, runs_dir=tmp_path)
    log_run({"lr": 0.01, "seed": 0}, {"val_acc": 0.90}, runs_dir=tmp_path)
    table = compare_runs(tmp_path, sort_by="val_acc")
    assert table.config_keys == ["lr"], "a key equal in every run says nothing"
    assert [row[0] for row in table.rows()[1:]] == ["run-002", "run-001"]
    assert repr(table).splitlines()[0].split() == ["run", "lr", "val_acc"]
    assert "≈0.9" in repr(table) and "<table>" in table._repr_html_()
    with pytest.raises(KeyError, match="cannot sort by 'accuracy'"):
        compare_runs(tmp_path, sort_by="accuracy")


def test_bad_input_is_named(tmp_path):
    with pytest.raises(TypeError, match="config and metrics as dicts"):
        log_run([1], {"a": 1}, runs_dir=tmp_path)
    with pytest.raises(TypeError, match="config.model: Linear cannot go into the run log"):
        log_run({"model": torch.nn.Linear(1, 1)}, {}, runs_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="log_run"):
        load_runs(tmp_path / "nowhere")
    log_run({"lr": 1}, {"acc": float("nan")}, runs_dir=tmp_path)
    assert json.loads((tmp_path / "runs.jsonl").read_text())["metrics"]["acc"] == "nan"


def test_curves_overlay(tmp_path):
    log_run({"lr": 1}, {}, history={"val_loss": [1.0, 0.5]}, runs_dir=tmp_path)
    log_run({"lr": 2}, {}, history={"val_loss": [1.0, 0.7, 0.6]}, runs_dir=tmp_path)
    fig = plot_runs(tmp_path)
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["run-001", "run-002"]
    with pytest.raises(KeyError, match="curves logged: \\['val_loss'\\]"):
        plot_runs(tmp_path, curve="train_acc")


def test_a_run_logged_after_a_cut_line_starts_on_its_own_line(tmp_path):
    log_run({"lr": 1}, {"acc": 0.5}, runs_dir=tmp_path)
    with open(tmp_path / "runs.jsonl", "a") as handle:
        handle.write('{"name": "run-002", "config": {"lr"')  # the crash: no newline at the end
    with pytest.warns(UserWarning, match="runs.jsonl:2 is not a complete run record"):
        log_run({"lr": 2}, {"acc": 0.6}, runs_dir=tmp_path)
        log_run({"lr": 3}, {"acc": 0.7}, runs_dir=tmp_path)
    with pytest.warns(UserWarning) as caught:
        runs = load_runs(tmp_path)
    assert [r.config["lr"] for r in runs] == [1, 2, 3], "the cut line swallowed the run logged after it"
    message = str(caught[0].message)
    assert len(caught) == 1 and "runs.jsonl:2 is not a complete run record" in message, "one warning per load"
    assert message.endswith("skipped 1 unreadable line, read 3 runs")


def test_a_line_cut_inside_a_utf8_character_loses_only_that_line(tmp_path):
    log_run({"model": "résnet"}, {"acc": 0.5}, runs_dir=tmp_path)
    cut = '{"name": "run-002", "config": {"model": "résnet'.encode("utf-8")[:-5]  # inside é's two bytes
    with open(tmp_path / "runs.jsonl", "ab") as handle:
        handle.write(cut)
    with pytest.warns(UserWarning, match="runs.jsonl:2 is not a complete run record.*utf-8"):
        log_run({"model": "vït"}, {"acc": 0.6}, runs_dir=tmp_path)
        log_run({"model": "a\x85b"}, {"acc": 0.7}, runs_dir=tmp_path)  # NEL: a line break to str.splitlines
    with pytest.warns(UserWarning, match="runs.jsonl:2 is not a complete run record"):
        assert [r.config["model"] for r in load_runs(tmp_path)] == ["résnet", "vït", "a\x85b"]


def test_a_diverged_run_sorts_last_instead_of_breaking_the_table(tmp_path):
    log_run({"lr": 0.1}, {"val_acc": 0.70}, runs_dir=tmp_path)
    log_run({"lr": 10.0}, {"val_acc": float("nan")}, runs_dir=tmp_path)  # stored as the string "nan"
    log_run({"lr": 0.01}, {"val_acc": 0.90}, runs_dir=tmp_path)
    log_run({"lr": 1.0}, {"val_loss": 2.3}, runs_dir=tmp_path)  # no val_acc at all
    for descending, order in ((True, ["run-003", "run-001", "run-002", "run-004"]),
                              (False, ["run-001", "run-003", "run-002", "run-004"])):
        table = compare_runs(tmp_path, sort_by="val_acc", descending=descending)
        assert [row[0] for row in table.rows()[1:]] == order, "finite numbers sorted, then nan, then missing"
    runs = load_runs(tmp_path) + [Run("hand-made", {"lr": 5.0}, {"val_acc": float("inf")})]  # a float inf
    names = [r.name for r in compare_runs(runs, sort_by="val_acc").runs]
    assert names[:2] == ["run-003", "run-001"] and names[-1] == "run-004", "inf is not a best accuracy"


def test_the_best_run_comes_first_for_a_loss_and_for_an_accuracy(tmp_path):
    log_run({"lr": 0.1}, {"val_acc": 0.70, "val_loss": 0.9}, runs_dir=tmp_path)
    log_run({"lr": 0.01}, {"val_acc": 0.90, "val_loss": 0.3}, runs_dir=tmp_path)
    assert [r.name for r in compare_runs(tmp_path, sort_by="val_loss").runs] == ["run-002", "run-001"]
    assert [r.name for r in compare_runs(tmp_path, sort_by="val_acc").runs] == ["run-002", "run-001"]
    assert [r.name for r in compare_runs(tmp_path, sort_by="val_loss", descending=True).runs] == ["run-001", "run-002"]
