"""The LLM-as-environment-engineer: context modules, prompt, proposal parsing, engineers."""

from mapfjax.engineer.context import (
    MODULES,
    RoundRecord,
    build_context,
    enabled_modules,
    failure_breakdown,
)
from mapfjax.engineer.engineers import (
    ENGINEERS,
    ApiEngineer,
    Candidate,
    FixedEngineer,
    PolicyEngineer,
    RandomEngineer,
    RuleEngineer,
    candidate_edits,
    choose_by_likelihood,
    make_engineer,
)
from mapfjax.engineer.prompt import build_prompt
from mapfjax.engineer.proposal import (
    Decision,
    Proposal,
    apply_proposal,
    format_diff,
    keep_current,
    parse_proposal,
)

__all__ = [
    "ENGINEERS",
    "MODULES",
    "ApiEngineer",
    "Candidate",
    "Decision",
    "FixedEngineer",
    "PolicyEngineer",
    "Proposal",
    "RandomEngineer",
    "RoundRecord",
    "RuleEngineer",
    "apply_proposal",
    "build_context",
    "build_prompt",
    "candidate_edits",
    "choose_by_likelihood",
    "enabled_modules",
    "failure_breakdown",
    "format_diff",
    "keep_current",
    "make_engineer",
    "parse_proposal",
]
