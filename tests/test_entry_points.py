"""The entry points a user runs: `python -m mapfjax.env SUBCOMMAND` and the launch scripts.

Each shows a help text for every flag it defines, and none prints JAX's INFO line about the
backends it probed and did not find (`Unable to initialize backend 'tpu'`) on a CPU machine.
The subprocesses run a few at a time: each imports JAX.
"""

import argparse
import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from mapfjax import configfile
from mapfjax.env import io, types
from mapfjax.env.cli import COMMANDS

ROOT = configfile.ROOT
ABSL_SCRIPTS = (
    "train",
    "evaluate",
    "sweep",
    "export_dataset",
    "train_tiny",
    "compare_evals",
    "compare_runs",
)
ARGPARSE_SCRIPTS = ("memory_plan", "memory_plan_grpo")
PROBE_LINE = "Unable to initialize backend"


def _user_env() -> dict[str, str]:
    """As a user's shell on this machine: JAX probes for accelerators (no JAX_PLATFORMS) and
    sees one CPU device."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    kept = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    return {**env, "XLA_FLAGS": " ".join(kept)}


def _run_all(commands: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    def run(argv):
        return subprocess.run([sys.executable, *argv], cwd=ROOT, env=_user_env(),
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(commands, pool.map(run, commands.values()), strict=True))


# --- what each entry point defines, read from its source or its parser ------------------------


def script_flags(name: str) -> set[str]:
    """The flags launch/NAME.py defines: the first argument of every flags.DEFINE_* (absl) or
    add_argument (argparse) call in its source."""
    tree = ast.parse((ROOT / "launch" / f"{name}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr = node.func.attr
        if (attr.startswith("DEFINE_") or attr == "add_argument") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                out.add(first.value.lstrip("-"))
    return out


def subcommand_flags(command: str) -> set[str]:
    """The flags `python -m mapfjax.env COMMAND` defines (its argparse actions, --help aside)."""
    parser = argparse.ArgumentParser()
    COMMANDS[command][0](parser)
    return {s[2:] for a in parser._actions for s in a.option_strings if s.startswith("--")} - {
        "help"
    }


# --- what each help text shows ----------------------------------------------------------------

# absl's own notes under a flag's help: its default, its type, how to repeat it.
_ABSL_NOTES = re.compile(
    r"\(default: .*\)$|\((an? [\w -]+|a comma separated list)\)$|"
    r"repeat this option to specify a list of values$"
)


def absl_help(text: str, script: str) -> dict[str, str]:
    """flag -> its help text in absl's `--help` of `script` (its own flags' section), absl's
    notes and an enum's `<a|b>:` removed; '' for a flag without one."""
    lines = text.splitlines()
    out: dict[str, list[str]] = {}
    name = None
    for line in lines[lines.index(f"{script}:") + 1 :]:
        m = re.match(r"  --(?:\[no\])?([\w.-]+):(.*)$", line)
        if m:
            name = m.group(1)
            out[name] = [re.sub(r"^\s*<[^>]*>:", "", m.group(2)).strip()]
        elif name and line.startswith("    "):
            out[name].append(line.strip())
        else:
            name = None
    helps = {}
    for flag, parts in out.items():
        kept = [p for p in parts if p and not _ABSL_NOTES.fullmatch(p)]
        text = " ".join(kept).strip(" ;")
        helps[flag] = "" if text == "(no help available)" else text
    return helps


def argparse_help(text: str) -> dict[str, str]:
    """flag -> its help text in an argparse `--help` ('' for a flag without one)."""
    out: dict[str, list[str]] = {}
    names: list[str] = []
    for line in text.splitlines():
        m = re.match(r"  (-\S.*?)(?: {2,}(\S.*))?$", line)
        if m:
            names = [n[2:] for n in re.findall(r"--[\w-]+", m.group(1))]
            for n in names:
                out[n] = [m.group(2) or ""]
        elif names and re.match(r" {3,}\S", line):
            for n in names:
                out[n].append(line.strip())
        else:
            names = []
    return {n: " ".join(parts).strip() for n, parts in out.items()}


def test_the_help_readers_find_a_flag_without_help():
    """The check below would fail on a flag without help: both readers report it as ''."""
    absl = (
        "launch/x.py:\n  --a: does a\n    (default: '1')\n    (an integer)\n  --b: \n"
        "    (default: 'x')\n  --[no]c: (no help available)\n    (default: 'false')\n"
        "  --d: <x|y>: picks one\n    (seeds joined by +)\n\nTry --helpfull\n"
    )
    assert absl_help(absl, "launch/x.py") == {
        "a": "does a", "b": "", "c": "", "d": "picks one (seeds joined by +)"
    }  # fmt: skip
    parsed = argparse_help(
        "usage: x [-h] [--a A]\n\noptions:\n  -h, --help  show this\n  --a A       does a\n"
        "  --long-one LONG_ONE\n                        on the next line\n  --bare BARE\n"
        "  --flag\n"
    )
    assert parsed == {"help": "show this", "a": "does a", "long-one": "on the next line",
                      "bare": "", "flag": ""}  # fmt: skip


@pytest.fixture(scope="module")
def helps():
    commands = {f"launch/{s}.py": [f"launch/{s}.py", "--help"] for s in ABSL_SCRIPTS}
    commands |= {f"launch/{s}.py": [f"launch/{s}.py", "--help"] for s in ARGPARSE_SCRIPTS}
    commands |= {c: ["-m", "mapfjax.env", c, "--help"] for c in COMMANDS}
    return _run_all(commands)


def _script(key: str) -> str:
    return key.removeprefix("launch/").removesuffix(".py")


def _defined_and_shown(key: str, help_text: str) -> tuple[set[str], dict[str, str]]:
    """(the flags entry point `key` defines, flag -> the help its --help shows)."""
    if key in COMMANDS:
        return subcommand_flags(key), argparse_help(help_text)
    name = _script(key)
    if name in ABSL_SCRIPTS:
        return script_flags(name), absl_help(help_text, key)
    return script_flags(name), argparse_help(help_text)


def test_every_flag_of_every_entry_point_has_help(helps):
    missing = []
    for key, res in helps.items():
        absl = key not in COMMANDS and _script(key) in ABSL_SCRIPTS  # absl's --help exits 1
        assert res.returncode == (1 if absl else 0), (key, res.stderr[-2000:])
        assert PROBE_LINE not in res.stdout + res.stderr, key
        defined, shown = _defined_and_shown(key, res.stdout)
        assert defined, key  # the flags were found in the source or the parser
        missing += [f"{key} --{f}" for f in sorted(defined) if not shown.get(f)]
    assert not missing, f"flags without a help text: {missing}"


# --- no backend-probe line: a tiny run of each script, where JAX picks its backend ------------


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """A short run of each launch script that gets as far as JAX choosing its backend where one
    is that cheap, else one that stops at a bad value (or --help)."""
    tmp = tmp_path_factory.mktemp("entry")
    inst = tmp / "i.jsonl"
    io.save_instances(inst, [types.Problem("a", ("FFF",), ((0, 0),), ((0, 2),))])
    (tmp / "empty_run").mkdir()
    commands = {
        # jax.device_count(), then the missing checkpoint directory is refused
        "evaluate": ["launch/evaluate.py", f"--checkpoint={tmp / 'nope'}", f"--instances={inst}",
                     f"--out_dir={tmp / 'eval'}"],
        "export_dataset": ["launch/export_dataset.py", "--config=configs/tiny_cpu.py",
                           "--size=2", f"--out={tmp / 'rows.jsonl'}"],
        "compare_evals": ["launch/compare_evals.py", f"--instances={inst}",
                          f"--evals={tmp / 'nope'}"],
        "sweep": ["launch/sweep.py", "--config=configs/sweep_ablation.py",
                  f"--workdir={tmp / 'sweep'}", "--dry_run"],
        "train": ["launch/train.py", "--config=configs/tiny_cpu.py",
                  f"--workdir={tmp / 'train'}", "--config.mesh.data=3"],
        "compare_runs": ["launch/compare_runs.py", f"--runs={tmp / 'empty_run'}"],
        "train_tiny": ["launch/train_tiny.py", "--config=configs/tiny_model.py:quick",
                       f"--config.workdir={tmp / 'tiny'}", "--config.sft.stages=0"],
        "memory_plan": ["launch/memory_plan.py", "--model=tiny", "--devices=1", "--meshes=fsdp1",
                        "--sizes=1x16", "--computations=forward"],
        "memory_plan_grpo": ["launch/memory_plan_grpo.py", "--help"],
    }  # fmt: skip
    return _run_all(commands)


# (exit status, words on stdout or stderr): each run got where it was meant to
EXPECTED = {
    "evaluate": (2, "no such directory"),
    "export_dataset": (0, "wrote 2 rows"),
    "compare_evals": (2, "nope"),
    "sweep": (0, "launch/train.py"),
    "train": (2, "not divisible by 3"),
    "compare_runs": (2, "no start/validation.json"),
    "train_tiny": (2, "sft.stages = (0,)"),
    "memory_plan": (0, "forward B=1"),
    "memory_plan_grpo": (0, "--response-len"),
}


def test_no_entry_point_prints_the_backend_probe_on_cpu(tiny_runs):
    assert set(tiny_runs) == set(ABSL_SCRIPTS) | set(ARGPARSE_SCRIPTS)
    for name, res in tiny_runs.items():
        code, words = EXPECTED[name]
        both = res.stdout + res.stderr
        assert res.returncode == code and words in both, (name, both[-2000:])
        assert "Traceback" not in both, (name, both[-2000:])
        assert PROBE_LINE not in both, (name, res.stderr[-2000:])
