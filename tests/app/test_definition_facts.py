"""What a definition's own lines say (agentctx.definition_facts), read from a real file."""

from __future__ import annotations

from agentctx.definition_facts import facts
from agentctx.references import Definition, Index

SOURCE = '''"""A module."""


class Store:
    """Keeps rows.

    Longer text that is not shown.
    """

    def get(self, key):
        """Return the row of `key`, or raise
        KeyError when there is none."""
        if key is None:
            raise ValueError("no key")
        raise KeyError(key)

    def put(self, key, row):
        return None


def broken(
'''


def index_of(tmp_path) -> Index:
    (tmp_path / "store.py").write_text(SOURCE)
    (tmp_path / "notes.md").write_text("# notes\n")
    return Index(str(tmp_path), ["store.py", "notes.md"])


def test_a_functions_docstring_and_raise_lines(tmp_path):
    index = index_of(tmp_path)
    get = Definition("Store.get", "store.py", 10, 15)
    assert facts(index, get, raises=False) == [
        '`Store.get` (store.py:10-15) says: "Return the row of `key`, or raise KeyError when '
        'there is none."'
    ]
    assert facts(index, get, raises=True)[1:] == [
        '`Store.get` raises at store.py:14: `raise ValueError("no key")`',
        "`Store.get` raises at store.py:15: `raise KeyError(key)`",
    ]


def test_a_class_says_its_first_paragraph_and_no_raise_lines_of_its_methods(tmp_path):
    store = Definition("Store", "store.py", 4, 18)
    assert facts(index_of(tmp_path), store, raises=True) == [
        '`Store` (store.py:4-18) says: "Keeps rows."'
    ]


def test_nothing_for_no_docstring_lines_that_do_not_parse_or_other_files(tmp_path):
    index = index_of(tmp_path)
    assert facts(index, Definition("Store.put", "store.py", 17, 18), raises=True) == []
    assert facts(index, Definition("broken", "store.py", 21, 22), raises=True) == []
    assert facts(index, Definition("notes", "notes.md", 1, None), raises=True) == []
    assert facts(index, Definition("gone", "gone.py", 1, 3), raises=True) == []
