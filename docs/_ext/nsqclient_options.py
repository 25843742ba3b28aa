"""Sphinx extension: ``.. nsqclient-options::`` renders nsqclient.config.OPTIONS as a table.

The configuration reference is generated at build time from the options themselves (default,
range, unit, meaning), so it cannot drift from config.py; the same words make the options part
of the Consumer's, Producer's and Config's docstrings (:func:`nsqclient.config.options_help`).
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from nsqclient.config import OPTIONS, value_text


def option_rows() -> list[tuple[str, str, str, str, str]]:
    """(name, default, range, unit, meaning) for every option, in config.py's order."""
    return [
        (
            name,
            value_text(option.default),
            option.accepted,
            option.unit or "",
            option.doc,
        )
        for name, option in OPTIONS.items()
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "\\-"


class OptionsTable(SphinxDirective):
    """``.. nsqclient-options::``: the table, one row per option."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 18 10 18 8 46",
            "",
            "   * - Option",
            "     - Default",
            "     - Accepted",
            "     - Unit",
            "     - Meaning",
        ]
        for name, default, accepted, unit, meaning in option_rows():
            lines += [
                f"   * - .. _option-{name}:",
                "",
                f"       ``{name}``",
                f"     - ``{default}``",
                f"     - {_cell(accepted)}",
                f"     - {_cell(unit)}",
                f"     - {_cell(meaning)}",
            ]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="nsqclient.config.OPTIONS"), 0, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nsqclient-options", OptionsTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
