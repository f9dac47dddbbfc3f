"""The code digest a benchmark records (attune.bench.code): the same sources, the same digest; an
edited source, another one (a benchmark during which it changed says so)."""

import sys

from attune.bench.code import code_digest, watched


def _package(tmp_path, name, text):
    root = tmp_path / name
    (root / "__pycache__").mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text("")
    (root / "rules.py").write_text(text)
    (root / "__pycache__" / "rules.cpython-311.pyc").write_bytes(b"ignored")
    return root


def test_the_digest_follows_the_sources_and_nothing_else(tmp_path, monkeypatch):
    root = _package(tmp_path, "digest_pkg", "ALONE = False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("digest_pkg", None)
    first = code_digest(("digest_pkg",))
    assert code_digest(("digest_pkg",)) == first
    (root / "__pycache__" / "rules.cpython-311.pyc").write_bytes(b"other bytes")   # not a source
    assert code_digest(("digest_pkg",)) == first
    (root / "rules.py").write_text("ALONE = True\n")   # an experiment edited in while a benchmark runs
    assert code_digest(("digest_pkg",)) != first
    (root / "rules.py").write_text("ALONE = False\n")   # and reverted
    assert code_digest(("digest_pkg",)) == first


def test_the_default_digest_covers_the_packages_installed_beside_attune():
    assert len(code_digest()) == 16


def test_a_benchmark_watched_while_its_code_is_edited_says_so(tmp_path, monkeypatch, capsys):
    root = _package(tmp_path, "watched_pkg", "ALONE = False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("watched_pkg", None)
    with watched(("watched_pkg",)) as quiet:
        pass
    assert quiet["changed_during_run"] is False and quiet["after"] == quiet["digest"]
    with watched(("watched_pkg",)) as edited:
        (root / "rules.py").write_text("ALONE = True\n")
    assert edited["changed_during_run"] is True and edited["after"] != edited["digest"]
    assert "the code changed while the benchmark ran" in capsys.readouterr().err
