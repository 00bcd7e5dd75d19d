"""The trace forms the go / no-go gate tried, as `mapfjax.env.forms.TraceForm`s a recipe names
by "projects.go_no_go.traces:NAME" (`trace_form`, configs/tiny_model.py): the oracle's plan in
step blocks (`steps`, the map in the grid style; `holes` and `rows`, the pilot's and the
probe's styles), a look-ahead block before the moves (`search`, `priority`: `lookahead`), and
the relay layouts (`relay`, its `where` fields `relay_where` and `relay_next`, `relay_retry`,
which drops the puzzles where every order fails). The shipped form is `relay_retry` that ends
on `no order left` there (`mapfjax.env.forms.GRID_RELAY`). Each reads back and checks every
layout (`layouts.parse_trace`, `layouts.check_any`), as the gate's diagnostics did.

    python launch/train_tiny.py --config projects/go_no_go/configs/tiny_model.py:trace_ahead
"""

from __future__ import annotations

from mapfjax.env import forms
from mapfjax.env.forms import TraceForm
from projects.go_no_go import layouts, lookahead, styles

MODULE = "projects.go_no_go.traces"


def _steps(style: str):
    """Write: the given plan (the oracle's when None) in step blocks, the map in `style`."""

    def write(problem, plans):
        answer = forms.oracle_plans(problem) if plans is None else plans
        return layouts.render_trace(problem, answer, style), answer

    return write


def _ahead(name: str, style: str):
    """Write: the look-ahead form `name` (`lookahead.LOOKAHEADS`) and its plan, the map in
    `style`; where every order fails and the form ends its trace, the given plan (the oracle's
    when None); None where the form finds no plan."""
    find = lookahead.LOOKAHEADS[name]

    def write(problem, plans):
        f = find(problem)
        if f.plans is None and not f.ended:
            return None
        answer = f.plans
        if answer is None:
            answer = forms.oracle_plans(problem) if plans is None else plans
        body = layouts.render_trace(problem, answer, style, f.lines, f.order, f.where, f.tries,
                                    f.ended)  # fmt: skip
        return body, answer

    return write


def form(ahead: str = "", style: str = "grid", name: str | None = None) -> TraceForm:
    """The form of a look-ahead `ahead` (`lookahead.LOOKAHEADS`; "": the given plan in step
    blocks) with the map in `style` (`styles.STYLES`), as the recipes' former settings
    `trace_lookahead` and `trace_style` chose it; its cache key is the words those settings
    put in the recipe's data cache names ("holes", the first style, put none)."""
    styles.check_style(style)
    if ahead and ahead not in lookahead.LOOKAHEADS:
        raise ValueError(f"lookahead {ahead!r}: allowed {sorted(lookahead.LOOKAHEADS)}")
    key = ((style,) if style != "holes" else ()) + ((f"lookahead-{ahead}",) if ahead else ())
    write = _ahead(ahead, style) if ahead else _steps(style)
    name = name or f"{ahead or 'steps'} ({style} map)"
    return TraceForm(name, write, layouts.parse_trace, layouts.check_any, key)


steps = form("", "grid", f"{MODULE}:steps")
holes = form("", "holes", f"{MODULE}:holes")
rows = form("", "rows", f"{MODULE}:rows")
search = form("search", "grid", f"{MODULE}:search")
priority = form("priority", "grid", f"{MODULE}:priority")
relay = form("relay", "grid", f"{MODULE}:relay")
relay_where = form("relay_where", "grid", f"{MODULE}:relay_where")
relay_next = form("relay_next", "grid", f"{MODULE}:relay_next")
relay_retry = form("relay_retry", "grid", f"{MODULE}:relay_retry")

# The look-ahead forms by their names in `lookahead.LOOKAHEADS` (scripts' --form/--lookahead).
FORMS = {
    "search": search,
    "priority": priority,
    "relay": relay,
    "relay_where": relay_where,
    "relay_next": relay_next,
    "relay_retry": relay_retry,
    "relay_retry_end": forms.GRID_RELAY,
}
