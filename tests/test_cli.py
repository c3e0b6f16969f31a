"""`python -m ptlab ...` as a learner or instructor types it."""
import json
import subprocess
import sys

from ptlab.__main__ import main
from ptlab.catalogue import catalogue_markdown, readme_is_current

from notebook_rules import ROOT


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ptlab", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_pitfalls_json_lists_chapter_1():
    result = run_cli("pitfalls", "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert len([r for r in records if r["chapter"] == 1]) >= 4
    assert {"id", "chapter", "title", "symptom", "why", "catch"} <= set(records[0])


def test_pitfalls_run_prints_figures(capsys):
    assert main(["pitfalls", "run", "uint8-overflow"]) == 0
    out = capsys.readouterr().out
    assert "(bug on)" in out and "pixels that got darker: 0.3656" in out and "symptom shows: True" in out
    assert main(["pitfalls", "run", "uint8-overflow", "--fixed"]) == 0
    assert "symptom shows: False" in capsys.readouterr().out


def test_pitfalls_run_unknown_id(capsys):
    assert main(["pitfalls", "run", "no-such-thing"]) == 2
    assert "known ids" in capsys.readouterr().err


def test_doctor_passes_here():
    result = run_cli("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("torch", "torchvision", "device", "bf16 autocast", "C++ compiler", "embedded dataset",
                 "ipywidgets lab extension", "READY"):
        assert line in result.stdout


def test_doctor_names_what_is_missing(monkeypatch):
    from ptlab import doctor

    monkeypatch.setattr(doctor, "_version", lambda package: None if package == "jupyterlab" else "2.14.1")
    text, code = doctor.report(doctor.run_checks())
    assert code == 1 and "NOT READY" in text and "jupyterlab" in text.splitlines()[-1]


def test_readme_catalogue_is_current():
    assert readme_is_current(ROOT / "README.md"), "run `python -m ptlab catalogue --write`"
    assert all(f"pitfalls run {line}" for line in catalogue_markdown().splitlines()[2:])
