"""Chapters 1 and 2: the ✔ lines that replaced checks that could not fail fail on the buggy variant they are about.

The round-3 review (ch1-ch2.md, "Checks that cannot fail") found chapter 1 deciding "this copied" with
`result.data_ptr() != original.data_ptr()`, a test its own 01:c24 says proves nothing: a view that starts further in
passes it. The cells now compare storages. Each test reads the predicate from the stored notebook, so a cell that
goes back to the old test fails here.
"""
from __future__ import annotations

import json

import torch

from notebook_rules import ROOT


def _code(notebook: str) -> str:
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _copies(result: torch.Tensor, original: torch.Tensor) -> bool:
    """The chapter's test that `result` copied: it has a storage of its own (cells 01:c20, c29, c46)."""
    return result.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()


def test_chapter_1_decides_every_copy_by_the_storage_test():
    code = _code("01_tensors.ipynb")
    for predicate in ("as_float.untyped_storage().data_ptr() != shared.untyped_storage().data_ptr()",
                      "reshaped_copy.untyped_storage().data_ptr() != x_storage",
                      "contiguous_copy.untyped_storage().data_ptr() != x_storage",
                      "copied.untyped_storage().data_ptr() != row.untyped_storage().data_ptr()"):
        assert predicate in code, predicate
    assert ".data_ptr() != x.data_ptr()" not in code.replace("tail.data_ptr() != x.data_ptr()", "")
    assert "copied.data_ptr() != row.data_ptr()" not in code and "as_float.data_ptr() != shared.data_ptr()" not in code


def test_the_storage_test_of_a_copy_fails_on_a_view():
    """The buggy variant of each "copies" claim is a view: the storage test says no copy, the old test said copy."""
    x = torch.arange(12).reshape(3, 4)
    row = torch.arange(3).reshape(1, 3)
    assert _copies(x.t().reshape(12), x) and _copies(x.t().contiguous(), x) and _copies(row.repeat(4, 1), row)
    assert _copies(torch.zeros(2, 3, dtype=torch.float64).float(), torch.zeros(2, 3, dtype=torch.float64))
    for view, base in [(x.reshape(2, 6), x), (x.t(), x), (x[1:], x), (row.expand(4, 3), row)]:
        assert not _copies(view, base)
    offset_view = x[1:].reshape(-1)                       # a view that starts one row in
    assert offset_view.data_ptr() != x.data_ptr()         # the old test calls it a copy: it could not tell
    assert not _copies(offset_view, x)                    # the storage test does
