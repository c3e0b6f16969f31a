"""Chapter 5's lock reader: pins, hashes, markers, continuations and comments, on small files and the real lock."""
import pytest

from ptlab.lessons.ch05_checkpoints_debugging.lock_file import LOCK_FILE, read_lock

SAMPLE = """# a header comment
--index-url https://example.org/simple
anyio==4.16.0 \\
    --hash=sha256:59BB03 \\
    --hash=sha256:c66ae6
    # via
    #   httpx
numpy==2.2.6 ; python_full_version < '3.11' \\
    --hash=sha256:aa11
Typing_Extensions==4.0 --hash=sha512:bb22
loose>=1.0 --hash=sha256:cc33
nohash==1.0
-e ./local-package
wild==1.* --hash=sha256:dd44
"""


def test_read_lock_reads_pins_hashes_and_markers(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(SAMPLE, encoding="utf-8")
    found = {r.name: r for r in read_lock(lock)}
    assert list(found) == ["anyio", "numpy", "typing-extensions", "loose", "nohash", "-e ./local-package", "wild"]
    assert found["anyio"].version == "4.16.0" and found["anyio"].hashes == ("sha256:59bb03", "sha256:c66ae6")
    assert found["anyio"].line == 3 and found["anyio"].marker is None and found["anyio"].pinned
    assert found["numpy"].marker == "python_full_version < '3.11'" and found["numpy"].pinned
    assert found["typing-extensions"].version == "4.0" and not found["typing-extensions"].pinned  # no sha256
    assert found["loose"].version is None and not found["loose"].pinned                            # >= pins nothing
    assert found["nohash"].version == "1.0" and found["nohash"].hashes == () and not found["nohash"].pinned
    assert found["-e ./local-package"].version is None and not found["-e ./local-package"].pinned
    assert found["wild"].version is None                                                            # == 1.* is a range


def test_read_lock_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no lock file at .*nowhere.lock"):
        read_lock(tmp_path / "nowhere.lock")


def test_the_repository_lock_is_pinned_and_hashed():
    if not LOCK_FILE.is_file():
        pytest.skip("no requirements.lock beside this ptlab (an installed package, not a checkout)")
    locked = read_lock(LOCK_FILE)
    assert locked and [r.name for r in locked if not r.pinned] == []
    assert {"torch", "torchvision"} <= {r.name for r in locked}
