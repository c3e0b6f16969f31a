"""`python -m ptlab ...` as a learner or instructor types it."""
import json
import subprocess
import sys

from notebook_rules import ROOT

from ptlab.__main__ import main
from ptlab.course.catalogue import catalogue_markdown, readme_is_current
from ptlab.course.pitfalls import all_pitfalls


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ptlab", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_pitfalls_json_lists_chapter_1():
    result = run_cli("pitfalls", "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert len([r for r in records if r["chapter"] == 1]) >= 4
    assert {"id", "chapter", "title", "symptom", "why", "catch"} <= set(records[0])


def test_pitfalls_run_prints_figures_and_each_check(capsys):
    from ptlab.course.pitfalls import get_pitfall

    record = get_pitfall("uint8-overflow")
    for args, buggy in ((["pitfalls", "run", record.id], True), (["pitfalls", "run", record.id, "--fixed"], False)):
        assert main(args) == 0
        out = capsys.readouterr().out
        label = "bug on" if buggy else "fixed"
        assert out.startswith(f"{record.title}  [{record.id}, chapter {record.chapter}]\n")
        run = out[out.index(f"Run ({label}"):]
        outcome = record.run(buggy=buggy)
        for name, value in outcome.formatted_figures().items():
            assert f"  {name}" in run and f" {value}\n" in run
        for check in outcome.checks:
            assert f"✔ {label}: {check.line()}\n" in run


def _words(text: str) -> str:
    return " ".join(text.split())


def test_pitfalls_run_teaches_what_the_widget_teaches(capsys):
    """The marked code, the why, the catch and the watch's verdict, before the run, as the widget shows them."""
    from ptlab.course.pitfalls import get_pitfall
    from ptlab.watch import DETECTS

    watched = get_pitfall("missing-zero-grad")
    unwatched = next(p for p in all_pitfalls() if p.id not in DETECTS and p.skipped_text() is None)
    for record in (watched, unwatched):
        assert main(["pitfalls", "run", record.id]) == 0
        out = capsys.readouterr().out
        lesson, run = out.split("\nRun (bug on", 1)
        for line, marker in record.marked_lines():
            assert f"{marker or '':>3} | {line}".rstrip() in lesson.splitlines()
        assert _words(f"Symptom: {record.symptom}") in _words(lesson)
        assert _words(f"Why: {record.why}") in _words(lesson)
        assert _words(f"Catch it in your code: {record.catch}") in _words(lesson)
        assert "✔ bug on:" in run
    assert main(["pitfalls", "run", watched.id]) == 0
    assert _words(f"it looks for {DETECTS[watched.id]}.") in _words(capsys.readouterr().out)
    assert main(["pitfalls", "run", unwatched.id]) == 0
    assert "Watch: `python -m ptlab watch` does not detect this one" in capsys.readouterr().out


def test_pitfalls_run_unknown_id(capsys):
    assert main(["pitfalls", "run", "no-such-thing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("no pitfall with id 'no-such-thing'; `python -m ptlab pitfalls list` shows all ")
    assert "usage: python -m ptlab pitfalls run ID" in err


def test_pitfalls_run_a_typo_gets_the_nearest_ids_not_all_of_them(capsys):
    assert main(["pitfalls", "run", "eval-without-evalmode"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("no pitfall with id 'eval-without-evalmode'; did you mean: eval-without-eval-mode")
    assert sum(p.id in err.splitlines()[0] for p in all_pitfalls()) <= 3, err


def test_pitfalls_run_without_an_id_prints_the_list_and_the_usage(capsys):
    assert main(["pitfalls", "run"]) == 2
    captured = capsys.readouterr()
    assert all(p.id in captured.out for p in all_pitfalls())
    assert "name the pitfall to run" in captured.err and "usage: python -m ptlab pitfalls run ID" in captured.err


def test_pitfalls_list_has_the_watch_column(capsys):
    from ptlab.watch import DETECTS, HINT_ONLY

    assert main(["pitfalls", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    assert header.split() == ["ch", "id", "watch", "title"]
    column = header.index("watch")
    rows = {line.split()[1]: line for line in lines[1:] if line[:1].isdigit()}
    assert set(rows) == {p.id for p in all_pitfalls()} and DETECTS
    for record in all_pitfalls():
        row = rows[record.id]
        mark = "hint" if record.id in HINT_ONLY else "✔" if record.id in DETECTS else " "
        assert row[column:column + len(mark)] == mark, row
        assert row[header.index("title"):] == record.title, "each title starts in its column, after the longest id too"
    assert main(["pitfalls", "list", "missing-zero-grad"]) == 2


def test_doctor_passes_here_printing_each_check_as_it_completes():
    import time

    from ptlab.course.doctor import BUILDING_HEADER, BUILDING_LADDER

    start, arrived = time.perf_counter(), []     # each line and when it reached the pipe
    with subprocess.Popen([sys.executable, "-m", "ptlab", "doctor"], stdout=subprocess.PIPE, text=True,
                          cwd=ROOT) as doctor:
        for line in doctor.stdout:
            arrived.append((line.rstrip("\n"), time.perf_counter() - start))
    assert doctor.returncode == 0, arrived
    lines = [line for line, _ in arrived]
    stdout = "\n".join(lines)
    assert "[ok  ] torch.compile build" in stdout and "cache for this CPU is now warm" in stdout
    for line in ("torch", "torchvision", "device", "bf16 autocast", "C++ compiler", "embedded dataset",
                 "ipywidgets lab extension", "READY"):
        assert line in stdout
    where = {name: next(i for i, line in enumerate(lines) if name in line)
             for name in ("] python", BUILDING_HEADER, BUILDING_LADDER, "] torch.compile build", "READY")}
    assert where["] python"] < where[BUILDING_HEADER] < where[BUILDING_LADDER] < where["] torch.compile build"], \
        "it says what it builds before it builds it"
    assert arrived[where["] python"]][1] < arrived[where["READY"]][1] - 2, \
        "each check is printed when it completes, not the whole report at the end (the compile takes seconds)"


def test_doctor_names_what_is_missing(monkeypatch):
    from ptlab.course import doctor

    monkeypatch.setattr(doctor, "_version", lambda package: None if package == "jupyterlab" else "2.14.1")
    text, code = doctor.report(doctor.run_checks())
    assert code == 1 and "NOT READY" in text and "jupyterlab" in text.splitlines()[-1]


def test_doctor_reports_a_bad_device_setting_as_a_fail_line():
    import os

    result = subprocess.run([sys.executable, "-m", "ptlab", "doctor"], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env={**os.environ, "PTLAB_DEVICE": "tpu"})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "[FAIL] device" in result.stdout and "PTLAB_DEVICE='tpu'" in result.stdout
    assert "-> unset PTLAB_DEVICE" in result.stdout and "NOT READY" in result.stdout


def test_doctor_warns_with_the_fix_when_no_cpp_compiler_is_found(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["PATH"] = str(tmp_path)                      # an empty directory: no g++, clang++ or c++ on it
    result = subprocess.run([sys.executable, "-m", "ptlab", "doctor"], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    assert "[warn] C++ compiler (torch.compile on CPU)  not found" in result.stdout
    assert "-> install a C++ compiler for chapter 8 (Debian/Ubuntu: sudo apt install g++" in result.stdout
    assert "[warn] torch.compile build" in result.stdout and "not tried: no C++ compiler" in result.stdout
    assert result.returncode == 0 and "READY" in result.stdout, "chapter 8 needs it; the rest of the course does not"


def test_doctor_reports_a_compiler_that_does_not_run(monkeypatch, tmp_path):
    from ptlab.course import doctor

    broken = tmp_path / "g++"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    check = doctor.inductor_compiler_check()
    assert not check.ok and not check.required
    assert check.finding == "g++ found but does not run (CalledProcessError)" and "apt install g++" in check.fix


def test_readme_catalogue_is_current():

    assert readme_is_current(ROOT / "README.md"), "run `python -m ptlab catalogue --write`"
    rows = catalogue_markdown().splitlines()[2:]
    commands = [row.rsplit("|", 2)[-2].strip() for row in rows]
    assert commands == [f"`python -m ptlab pitfalls run {p.id}`" for p in all_pitfalls()], \
        "each row's command must run the pitfall of that row"


def test_doctor_reads_the_pins_from_the_lock_and_compares(monkeypatch, tmp_path):
    from ptlab.course import doctor

    assert doctor.pinned_versions()["torch"] == "2.14.1"
    lock = tmp_path / "requirements.lock"
    lock.write_text("torch==9.9.9 \\\n    --hash=sha256:00\n")
    assert doctor.pinned_versions(lock) == {"torch": "9.9.9"}
    assert doctor.pinned_versions(tmp_path / "none.lock") == {}, "a wheel install has no lock: nothing to compare"
    monkeypatch.setattr(doctor, "pinned_versions", lambda: {"torch": "9.9.9"})
    text, code = doctor.report(doctor.run_checks())
    assert code == 1 and "made with 9.9.9" in text
