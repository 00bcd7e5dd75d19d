"""The README, docs/ and the experiments' READMEs stay navigable: every relative link points at
a file or folder that exists, and every command they show names configs, scripts and modules
(and config variants) that exist."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target)
_REF = re.compile(r"^\s*\[[^\]]+\]:\s+(\S+)", re.M)  # [name]: target
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)[^\n]*\n(.*?)^\1\2\s*$", re.M | re.S)
_SHELL = {"bash", "sh", "shell", "console", "zsh"}
_INLINE = re.compile(r"`(python [^`]+)`")  # `python launch/x.py ...` in prose
# A script or config named by a command, with an optional ':variant' (configs/x.py:arg).
_PATH = re.compile(
    r"(?<![\w/.-])((?:configs|launch|benchmarks|projects)/[\w./-]*?\.(?:py|sh|sbatch))"
    r"(?::(\w+))?"
)
# A module run with `python -m` (mapfjax.env, projects.go_no_go.go_no_go).
_MODULE = re.compile(r"python3? -m ((?:mapfjax|projects)(?:\.\w+)+)")


def pages() -> list[pathlib.Path]:
    """The README, the manual and each experiment's README (its results' own pages are logs
    that record commands as they ran)."""
    return (
        [ROOT / "README.md"]
        + sorted((ROOT / "docs").glob("*.md"))
        + [ROOT / "projects" / "README.md"]
        + sorted((ROOT / "projects").glob("*/README.md"))
    )


def module_file(name: str, root: pathlib.Path = ROOT) -> pathlib.Path | None:
    """The file `python -m name` runs from the repository root, or None."""
    base = root.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__main__.py"):
        if f.is_file():
            return f
    return None


def _without_code(text: str) -> str:
    """The text outside fenced blocks (a link inside a code block is not a link)."""
    return _FENCE.sub("", text)


def broken_links(page: pathlib.Path, text: str) -> list[str]:
    """Relative link targets of `text` (read as `page`) that name no existing file or folder."""
    out = []
    prose = _without_code(text)
    for target in _LINK.findall(prose) + _REF.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # https:, mailto: ... and anchors within the page
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            out.append(target)
    return out


def commands(text: str) -> list[str]:
    """Command lines the page shows: shell fences, lines starting with `python` inside any
    other fence or indented in prose, and inline `python ...` spans; continuations joined."""
    lines = []
    for _, _, lang, body in _FENCE.findall(text):
        body = re.sub(r"\\\n", " ", body)
        for line in body.splitlines():
            if lang.lower() in _SHELL or line.strip().startswith("python "):
                lines.append(line.strip())
    for line in re.sub(r"\\\n", " ", _without_code(text)).splitlines():
        if re.match(r"^(?: {4}|\t)\s*python ", line):
            lines.append(line.strip())
    lines += [" ".join(span.split()) for span in _INLINE.findall(_without_code(text))]
    return lines


def missing_paths(commands_: list[str], root: pathlib.Path = ROOT) -> list[str]:
    """'path' or 'path:variant' named by the commands where the file does not exist, or where
    a config variant is not a string the config file contains."""
    out = []
    for line in commands_:
        for path, variant in _PATH.findall(line):
            file = root / path
            if not file.is_file():
                out.append(f"{path} (in: {line})")
            elif variant and not re.search(rf"""["']{variant}["']""", file.read_text("utf-8")):
                out.append(f"{path}:{variant} (no variant {variant!r}; in: {line})")
        for name in _MODULE.findall(line):
            if module_file(name, root) is None:
                out.append(f"-m {name} (in: {line})")
    return out


def test_pages_exist():
    names = {p.name for p in pages()}
    assert "README.md" in names
    for part in ("environment", "models", "training", "engineer", "evaluation"):
        assert f"{part}.md" in names, part
    for part in ("benchmarks", "launching", "development", "paper", "other_trainers"):
        assert f"{part}.md" in names, part


def test_relative_links_resolve():
    broken, checked = [], 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        checked += len(_LINK.findall(_without_code(text)))
        broken += [f"{page.relative_to(ROOT)}: {t}" for t in broken_links(page, text)]
    assert checked > 40, checked  # the pages do link; a broken scan would find none
    assert not broken, "links that point nowhere:\n" + "\n".join(broken)


def test_commands_name_existing_configs_and_scripts():
    missing, named = [], 0
    for page in pages():
        lines = commands(page.read_text(encoding="utf-8"))
        named += sum(len(_PATH.findall(line)) for line in lines)
        missing += [f"{page.relative_to(ROOT)}: {m}" for m in missing_paths(lines)]
    assert named > 15, named
    assert not missing, "commands that name what does not exist:\n" + "\n".join(missing)


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {t.split("#")[0] for t in _LINK.findall(readme)}
    docs = sorted((ROOT / "docs").glob("*.md"))
    unlinked = [p.name for p in docs if f"docs/{p.name}" not in linked]
    assert "projects/README.md" in linked
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


_INTERVAL = re.compile(r"\[-?\d+(?:\.\d+)?, -?\d+(?:\.\d+)?\]")  # [51, 61], [0.6, 5.8]


def test_readme_is_a_front_door():
    """Short, what mapfjax is in its first lines, then the two commands (`.ci/run` runs the
    second); no results log: at most a dozen intervals and no overlong lines."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 150, len(lines)
    assert max(len(line) for line in lines) <= 400
    assert len(_INTERVAL.findall(readme)) <= 12, _INTERVAL.findall(readme)
    assert lines[0] == "# mapfjax" and lines[2].startswith("mapfjax is ")
    fences = _FENCE.findall(readme)
    first, second = fences[0][3].strip(), fences[1][3].strip()
    assert readme.index(first) < readme.index("\n## ") and readme.index(second) < 1500
    assert first.startswith("pip install -e . && python launch/train.py"), first
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci == second, (ci, second)
    assert "https://arxiv.org/abs/" in readme and (ROOT / "LICENSE").is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")


def test_checks_catch_a_broken_link_and_a_missing_config(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("x")
    page = tmp_path / "docs" / "page.md"
    text = (
        "[ok](there.md#part) [up](../docs/) [web](https://example.org) [here](#a)\n"
        "[gone](../results/nothing/README.md) ![img](img/missing.png)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page, text) == ["../results/nothing/README.md", "img/missing.png"]

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "real.py").write_text('if arg == "quick":\n    pass\n')
    text = (
        "```bash\npython launch/train.py --config configs/real.py:quick \\\n"
        "    --config configs/gone.py\n```\n"
        "    python benchmarks/nothing.py\n"
        "and `python launch/train.py --config configs/real.py:slow` in prose\n"
    )
    found = missing_paths(commands(text), root=tmp_path)
    assert [f.split(" ")[0] for f in found] == [
        "launch/train.py",
        "configs/gone.py",
        "benchmarks/nothing.py",
        "launch/train.py",
        "configs/real.py:slow",
    ], found


def swallowed_continuations(source: str) -> bool:
    """Whether a module docstring shows a shell line continuation (`\\` at a line's end) in a
    plain string literal, where Python joins the lines and `--help` prints one mangled line."""
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        return False
    literal = ast.get_source_segment(source, first.value) or ""
    return "\\\n" in literal and not literal[:1].lower() == "r"


def test_script_docstrings_keep_their_line_continuations():
    scripts = [
        p for d in ("launch", "benchmarks", "configs") for p in sorted((ROOT / d).glob("*.py"))
    ]
    bad = [str(p.relative_to(ROOT)) for p in scripts if swallowed_continuations(p.read_text())]
    assert not bad, f"module docstrings with a `\\` line end outside a raw string: {bad}"
    assert swallowed_continuations('"""run\n    python x.py \\\n        --flag\n"""\n')
    assert not swallowed_continuations('r"""run\n    python x.py \\\n        --flag\n"""\n')
