"""What a policy is trained to write before its answer, as one named object: a `TraceForm`
writes a puzzle's think block and answer, reads a trace's plan back and checks a trace line by
line. The package registers the one form its policy ships with (`GRID_RELAY`); an experiment
defines its own forms in its own modules and names one by "module:attribute" wherever a form
is asked for (a recipe's `trace_form`), resolved by `get`:

    from mapfjax.env import forms
    form = forms.get("grid_relay")                       # or "projects.NAME.MODULE:ATTRIBUTE"
    turn = form.response(problem)                        # think block + answer; None: no plan
    lines, error = form.check(problem, turn)             # (len(lines), None): right throughout
    assert form.plan_outcome(problem, turn)[0] == "copied"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from mapfjax import configfile
from mapfjax.env import oracle, relay, text, trace
from mapfjax.env.types import Problem

Plans = list[list[int]]
# (problem, the plan to write where the form finds none of its own: None asks the oracle) ->
# (the trace, the plan the answer writes), or None when the form has no trace for the puzzle.
Write = Callable[[Problem, Sequence[Sequence[int]] | None], tuple[str, Plans] | None]


@dataclasses.dataclass(frozen=True)
class TraceForm:
    """A trace a policy can be trained to write: `name`; `write` (see Write); `parse`, a
    trace's text (the think block's) -> (plans, None) or (None, reason), never raising; `check`,
    (problem, response) -> (lines right before the first wrong one, its kind, None when right:
    `trace.ERROR_KINDS`); `key`: the words the recipe's cache names use for this form's data
    (None: its name; the shipped form keeps the words of the settings it replaced, so that a
    workdir built before still resumes)."""

    name: str
    write: Write
    parse: trace.Parse
    check: Callable[[Problem, str], tuple[int, str | None]]
    key: tuple[str, ...] | None = None

    @property
    def cache_key(self) -> tuple[str, ...]:
        """`key`, or the form's name without one."""
        return (self.name,) if self.key is None else self.key

    def response(
        self, problem: Problem, plans: Sequence[Sequence[int]] | None = None
    ) -> str | None:
        """The text a policy is trained to write for `problem`: the think block, then the
        answer block of the plan the trace writes (`plans`, or the oracle's, where the form
        finds none of its own). None when the form has no trace for the puzzle."""
        written = self.write(problem, plans)
        if written is None:
            return None
        body, answer = written
        return trace.think_block(body) + text.render_answer(answer)

    def plan_outcome(self, problem: Problem, response: str) -> tuple[str, bool | None]:
        """`trace.trace_plan_outcome` with this form's reading of the trace."""
        return trace.trace_plan_outcome(problem, response, self.parse)


def oracle_plans(problem: Problem) -> Plans:
    """The oracle's optimal per-agent action codes; a ValueError names a puzzle it does not
    solve within its default budget."""
    s = oracle.solve(problem)
    if not s.optimal:
        raise ValueError(f"problem {problem.id!r}: oracle status {s.status!r}, no optimal answer")
    return oracle.answer_actions(s)


def _write_grid_relay(problem: Problem, plans=None):
    """The relay that retries (`relay.retry`) after the grid header: the failed attempts, then
    the first valid order's runs and that plan; where every order fails on a line, the
    attempts, `no order left`, and `plans` (the oracle's when None), which no line decides.
    None where an order fails in a way no line shows."""
    found = relay.retry(problem)
    order, mine, tries, _ = found
    if mine is not None:
        return trace.render_relay(problem, mine, order, tries), mine
    if (failed := relay.every_order_fails(problem, found)) is None:
        return None
    answer = oracle_plans(problem) if plans is None else [list(map(int, a)) for a in plans]
    return trace.render_relay(problem, answer, None, failed, ended=True), answer


# The shipped policy's trace (mapfjax/assets/tiny_think; configs/tiny_model.py:think).
GRID_RELAY = TraceForm(
    "grid_relay",
    _write_grid_relay,
    trace.parse_trace,
    relay.check_trace,
    key=("grid", "lookahead-relay_retry_end"),
)
FORMS = {GRID_RELAY.name: GRID_RELAY}


def get(spec, key: str = "trace_form") -> TraceForm:
    """The form `spec` names: a TraceForm itself, a registered name (FORMS), or
    "module:attribute" naming a TraceForm (an experiment's). A ValueError names `key`, `spec`
    and what is allowed."""
    if isinstance(spec, TraceForm):
        return spec
    allowed = f"one of {sorted(FORMS)}, or 'module:attribute' naming a TraceForm"
    if isinstance(spec, str) and spec in FORMS:
        return FORMS[spec]
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{key} = {spec!r}; allowed: {allowed}")
    form = configfile.load_object(spec, key)
    if not isinstance(form, TraceForm):
        raise ValueError(f"{key} = {spec!r}: a {type(form).__name__}, not a TraceForm")
    return form
