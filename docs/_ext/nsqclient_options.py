"""Sphinx extension: ``.. nsqclient-options::`` renders nsqclient.config.OPTIONS as a table.

The configuration reference is generated at build time from the options themselves (default,
range, unit, meaning), so it cannot drift from config.py.
"""

from __future__ import annotations

import math
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from nsqclient.config import OPTIONS, Option


def _value(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def option_range(option: Option) -> str:
    """The values accepted, in words: bounds, choices, special values, None."""
    kind = option.kind if isinstance(option.kind, tuple) else (option.kind,)
    if option.choices is not None:
        text = "one of " + ", ".join(f"``{_value(c)}``" for c in option.choices)
    elif bool in kind:
        text = "True or False"
    elif option.min is not None and option.max is not None:
        text = f"{_value(option.min)} to {_value(option.max)}"
    elif option.min is not None:
        text = f">= {_value(option.min)}"
    elif option.max is not None:
        text = f"<= {_value(option.max)}"
    else:
        text = " or ".join(k.__name__ for k in kind)
    if option.special:
        text += "; also " + ", ".join(_value(v) for v in option.special)
    if option.infinite:
        text += "; inf"
    if option.nullable:
        text += "; None"
    return text


def option_rows() -> list[tuple[str, str, str, str, str]]:
    """(name, default, range, unit, meaning) for every option, in config.py's order."""
    return [
        (
            name,
            _value(option.default),
            option_range(option),
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
