"""The docs against the code, so they cannot drift: every signature of the core API contract
(docs/design/core-api.md), the README's "Python API in one screen" block (executed), every tvjax name
that README.md or a docs/ page mentions, the estimator configs and overrides they show, the API
reference's coverage of the flat API (`tvjax._EXPORTS`), the subpackages, and the README's shape
(short, and opening with its two commands).

docs/design/core-api.md's grammar (it says so at its top): under a `## tvjax.<module>` heading, a bullet
that starts with a code span documents names of that module. Its leading code spans (separated
by commas) are entries, each one of

    name(params)        a function or class, with its exact parameters (names, order, kinds, defaults)
    name                a name that exists (not a function or a class: those need their signature)
    NAME = literal      a constant and its value
    .name(params)       a method of every class named in the enclosing bullet
    .name               an attribute (field, property, class attribute) of those classes
    a.b.c(params)       a dotted path, from the section's module or absolute (tvjax....)
"""

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import NamedTuple

import pytest

import tvjax

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CORE_API = DOCS / "design" / "core-api.md"
CONTRACT = "core-api.md"  # how failures name the page
README = ROOT / "README.md"
REFERENCE = DOCS / "reference"
ESTIMATOR_CONFIGS = ROOT / "configs" / "estimator"
README_MAX_LINES = 260
# README's first lines, byte for byte: the title and the two commands (scripts/readme_first_command.sh runs the first)
README_OPENING = (
    "# tvjax\n\n```bash\n"
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m tvjax   "
    "# main job: default estimate on the paper's instance\n"
    "bash scripts/test.sh                                                                 "
    "# the test suite (sets up its own environments)\n```\n"
)

CORE_MODULES = tuple(f"tvjax.core.{m}" for m in ("instances", "oracles", "currency", "cost", "schedules", "streaming",
                                                 "programs", "estimators", "studies", "api"))
ONE_LINE_MODULES = ("tvjax.pools.store", "tvjax.pools.synthetic", "tvjax.core.jsonable")

CALL = re.compile(r"(\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\((.*)\)", re.S)
NAME = re.compile(r"\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
CONSTANT = re.compile(r"([A-Z_][A-Z0-9_]*) = (.+)", re.S)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
SPAN = re.compile(r"`([^`]+)`")
EMPTY = inspect.Parameter.empty


# --------------------------------------------------------------------------- parsing the docs


class Bullet(NamedTuple):
    line: int
    indent: int
    text: str  # the bullet's text with its continuation lines
    parent: int | None  # index of the enclosing bullet


class Entry(NamedTuple):
    module: str  # the section's module
    span: str  # the code span, exactly
    line: int
    parent_spans: tuple  # the enclosing bullet's entries, or all its code spans if it is prose
    parent_is_entry: bool


def strip_fences(text):
    """The text with fenced code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


def leading_spans(text):
    """The code spans a bullet starts with, separated by commas."""
    spans, rest = [], text
    while (m := re.match(r"`([^`]+)`", rest)):
        spans.append(m.group(1))
        rest = rest[m.end():]
        separator = re.match(r"\s*,\s*(?=`)", rest)
        if not separator:
            break
        rest = rest[separator.end():]
    return spans


def parse_core_api(text):
    """(entries, sections): every entry of the core API contract with its section's module, and the
    modules that have a section. A bullet starting with a code span outside a module section
    is an error."""
    sections, entries, bullets = [], [], []
    module = None
    current = None  # index into bullets of the bullet being continued

    def flush():
        if current is None:
            return
        b = bullets[current]
        spans = leading_spans(b.text)
        if not spans:
            return
        assert module is not None, f"{CONTRACT} line {b.line}: entry {spans[0]!r} outside a `## tvjax.<module>` section"
        parent = bullets[b.parent].text if b.parent is not None else ""
        parent_entries = tuple(leading_spans(parent))
        parent_spans = parent_entries or tuple(SPAN.findall(parent))
        entries.extend(Entry(module, s, b.line, parent_spans, bool(parent_entries)) for s in spans)

    for number, line in enumerate(strip_fences(text), 1):
        heading = re.match(r"(#+)\s+(.*)", line)
        bullet = re.match(r"( *)[*-] (.*)", line)
        if heading:
            flush()
            current = None
            bullets = []
            title = heading.group(2).strip()
            # "## tvjax.X", optionally followed by " — what it is" or " (...)"
            named = re.fullmatch(r"(tvjax(?:\.\w+)*)(?:\s+(?:—|-|:|\().*)?", title)
            module = named.group(1) if heading.group(1) == "##" and named else None
            if module:
                assert module not in sections, f"{CONTRACT} line {number}: a second section for {module}"
                sections.append(module)
        elif bullet:
            flush()
            indent = len(bullet.group(1))
            # the enclosing bullet: the nearest earlier bullet of this section with a smaller indent
            parent = next((i for i in range(len(bullets) - 1, -1, -1) if bullets[i].indent < indent), None)
            bullets.append(Bullet(number, indent, bullet.group(2), parent))
            current = len(bullets) - 1
        elif line.strip() and current is not None and line.startswith(" "):
            b = bullets[current]
            bullets[current] = b._replace(text=b.text + " " + line.strip())
        else:
            flush()
            current = None
    flush()
    return entries, sections


# --------------------------------------------------------------------------- resolving names


def _find_spec(name):
    """importlib.util.find_spec, or None where the name or a parent package does not import here."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def longest_module(path):
    """(i, spec): the longest prefix parts[:i] of a dotted path that is a module, found without importing it."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        spec = _find_spec(".".join(parts[:i]))
        if spec is not None:
            return i, spec
    raise LookupError(f"no module in {path!r}")


def resolve_dotted(path):
    """The object at an absolute dotted path `tvjax.a.b`; a module is found without importing
    it (engine modules import torch)."""
    parts = path.split(".")
    i, spec = longest_module(path)
    if i == len(parts):
        return spec
    obj = importlib.import_module(".".join(parts[:i]))
    for part in parts[i:]:
        if not hasattr(obj, part):
            raise LookupError(f"{'.'.join(parts[:parts.index(part)])} has no attribute {part!r} ({path})")
        obj = getattr(obj, part)
    return obj


def resolve(module, name):
    """(owner, attribute name, object) for a documented name in `module`'s section."""
    if name.startswith("tvjax."):
        owner_path, _, attr = name.rpartition(".")
        owner = resolve_dotted(owner_path)
    else:
        owner = importlib.import_module(module)
        *path, attr = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                raise LookupError(f"{module} has no {'.'.join(path)!r}")
            owner = getattr(owner, part)
    if inspect.isclass(owner):
        return owner, attr, None
    if isinstance(owner, importlib.machinery.ModuleSpec):
        owner = importlib.import_module(owner.name)
    if not hasattr(owner, attr):
        raise LookupError(f"{getattr(owner, '__name__', owner)} has no attribute {attr!r}")
    return owner, attr, getattr(owner, attr)


def class_has_attribute(cls, name):
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return name in fields or name in getattr(cls, "_fields", ()) or hasattr(cls, name)


def method_signature(cls, name):
    """A method's signature as called on an instance (or the class, for class methods)."""
    raw = inspect.getattr_static(cls, name)  # AttributeError when missing
    if isinstance(raw, staticmethod):
        return inspect.signature(raw.__func__)
    if isinstance(raw, classmethod):
        return inspect.signature(getattr(cls, name))
    if inspect.isfunction(raw):
        sig = inspect.signature(raw)
        return sig.replace(parameters=list(sig.parameters.values())[1:])
    raise AssertionError(f"{cls.__name__}.{name} is not a method (documented with parentheses)")


def is_namedtuple(obj):
    return inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")


def code_parameters(obj):
    """[(name, kind, default)] of a callable; NamedTuples by their fields and field defaults."""
    if is_namedtuple(obj):
        return [(f, inspect.Parameter.POSITIONAL_OR_KEYWORD, obj._field_defaults.get(f, EMPTY)) for f in obj._fields]
    if isinstance(obj, inspect.Signature):
        sig = obj
    else:
        sig = inspect.signature(obj)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def doc_parameters(params, namespace, where):
    """[(name, kind, default)] of a documented parameter list, defaults evaluated in `namespace`
    (literals, or names of that module such as LOG_FLOOR)."""
    try:
        tree = ast.parse(f"def _documented({params}): pass")
    except SyntaxError as e:
        raise AssertionError(f"{where}: cannot parse the parameters ({params}): {e}") from e
    a = tree.body[0].args
    if any(arg.annotation for arg in a.posonlyargs + a.args + a.kwonlyargs):
        raise AssertionError(f"{where}: leave annotations out of documented signatures")
    value = lambda node: eval(compile(ast.Expression(node), where, "eval"), {"__builtins__": {}}, dict(namespace))
    P = inspect.Parameter
    positional = [(arg.arg, P.POSITIONAL_ONLY) for arg in a.posonlyargs] + [(arg.arg, P.POSITIONAL_OR_KEYWORD) for arg in a.args]
    defaults = [EMPTY] * (len(positional) - len(a.defaults)) + [value(d) for d in a.defaults]
    out = [(name, kind, default) for (name, kind), default in zip(positional, defaults)]
    if a.vararg:
        out.append((a.vararg.arg, P.VAR_POSITIONAL, EMPTY))
    out += [(arg.arg, P.KEYWORD_ONLY, EMPTY if d is None else value(d)) for arg, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, P.VAR_KEYWORD, EMPTY))
    return out


def same_default(a, b):
    return (a is EMPTY) == (b is EMPTY) and (a is EMPTY or (type(a) is type(b) and repr(a) == repr(b)))


def describe(params):
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword-only", inspect.Parameter.POSITIONAL_ONLY: "positional-only",
             inspect.Parameter.VAR_POSITIONAL: "*args", inspect.Parameter.VAR_KEYWORD: "**kwargs",
             inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional"}
    return [(name, kinds[kind]) + (() if default is EMPTY else (repr(default),)) for name, kind, default in params]


def parent_classes(entry):
    """The classes a `.member` entry is checked against: the classes the enclosing bullet
    documents, or (a prose bullet) names; every name a prose bullet spans must then exist."""
    module = importlib.import_module(entry.module)
    classes = []
    for span in entry.parent_spans:
        m = CALL.fullmatch(span)
        name = m.group(1) if m else span
        if not IDENTIFIER.fullmatch(name) or (entry.parent_is_entry and not hasattr(module, name)):
            continue
        assert hasattr(module, name), f"{CONTRACT} line {entry.line}: {entry.module} has no {name!r} (enclosing bullet)"
        if inspect.isclass(getattr(module, name)):
            classes.append(getattr(module, name))
    assert classes, f"{CONTRACT} line {entry.line}: {entry.span!r} needs an enclosing bullet naming its classes"
    return classes


def check_entry(entry):
    """Raise AssertionError when a documented entry does not match the code."""
    where = f"{CONTRACT} line {entry.line} ({entry.module}): `{entry.span}`"
    module = importlib.import_module(entry.module)
    constant = CONSTANT.fullmatch(entry.span)
    call = CALL.fullmatch(entry.span)
    if constant:
        name, text = constant.groups()
        assert hasattr(module, name), f"{where}: {entry.module} has no {name}"
        expected, actual = ast.literal_eval(text), getattr(module, name)
        assert type(actual) is type(expected) and actual == expected, f"{where}: {name} is {actual!r} in the code"
        return
    if not call and not NAME.fullmatch(entry.span):
        raise AssertionError(f"{where}: an entry is `name(params)`, `name`, `NAME = value`, `.member(params)` or `.member`")
    name = call.group(1) if call else entry.span
    if name.startswith("."):
        targets = [(cls, name[1:]) for cls in parent_classes(entry)]
    else:
        try:
            owner, attr, obj = resolve(entry.module, name)
        except LookupError as e:
            raise AssertionError(f"{where}: {e}") from e
        targets = [(owner, attr)] if obj is None else [(None, obj)]
    for owner, target in targets:
        label = f"{owner.__name__}.{target}" if owner is not None else getattr(target, "__name__", name)
        if not call:
            if owner is not None:
                assert class_has_attribute(owner, target), f"{where}: {owner.__name__} has no attribute {target!r}"
            else:
                is_class = inspect.isclass(target) and not issubclass(target, BaseException)
                assert not (inspect.isroutine(target) or is_class), f"{where}: {label} is callable: document its signature"
            continue
        if owner is not None:
            try:
                actual = code_parameters(method_signature(owner, target))
            except AttributeError:
                raise AssertionError(f"{where}: {owner.__name__} has no method {target!r}") from None
        else:
            assert callable(target), f"{where}: {label} is not callable"
            actual = code_parameters(target)
        namespace = {**vars(module), **vars(inspect.getmodule(owner or target) or module)}
        documented = doc_parameters(call.group(2), namespace, where)
        same = len(actual) == len(documented) and all(
            a[0] == d[0] and a[1] == d[1] and same_default(a[2], d[2]) for a, d in zip(actual, documented))
        if not same:
            code, docs = describe(actual), describe(documented)
            first = next((i for i, (c, d) in enumerate(zip(code, docs)) if c != d), min(len(code), len(docs)))
            at_code, at_docs = (params[first] if first < len(params) else "nothing" for params in (code, docs))
            raise AssertionError(f"{where}: {label} takes {code} in the code; parameter {first + 1}: "
                                 f"code {at_code}, docs {at_docs}")


def defined_in(obj, module):
    """Whether obj is defined in module (or, for a package, in one of its submodules)."""
    where = getattr(obj, "__module__", None) or ""
    return where == module.__name__ or where.startswith(module.__name__ + ".")


def entry_names(entries, module):
    """Top-level names documented in `module`'s section."""
    names = set()
    for e in entries:
        if e.module != module:
            continue
        m = CONSTANT.fullmatch(e.span) or CALL.fullmatch(e.span)
        name = m.group(1) if m else e.span
        if not name.startswith(".") and "." not in name:
            names.add(name)
    return names


@pytest.fixture(scope="module")
def core_api():
    return parse_core_api(CORE_API.read_text())


# --------------------------------------------------------------------------- docs/design/core-api.md


def test_core_api_has_a_section_per_core_module(core_api):
    entries, sections = core_api
    expected = CORE_MODULES + ONE_LINE_MODULES
    assert not set(expected) - set(sections), f"{CONTRACT} lacks sections for {sorted(set(expected) - set(sections))}"
    for section in sections:
        importlib.import_module(section)
    assert len(entries) > 100, f"only {len(entries)} entries parsed: the parser or the page is broken"


def test_every_documented_signature_matches_the_code(core_api):
    entries, _ = core_api
    failures = []
    for entry in entries:
        try:
            check_entry(entry)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "docs/design/core-api.md does not match the code:\n" + "\n".join(failures)


def test_every_public_function_and_class_of_a_core_module_is_documented(core_api):
    entries, _ = core_api
    missing = []
    for name in CORE_MODULES:
        module = importlib.import_module(name)
        public = {name for name, obj in vars(module).items()
                  if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                  and defined_in(obj, module)}
        public |= set(getattr(module, "__all__", ()))
        missing += [f"{module.__name__}.{name}" for name in sorted(public - entry_names(entries, module.__name__))]
    assert not missing, f"public names without an entry in docs/design/core-api.md: {missing}"


def test_every_flat_export_is_documented_in_its_module_section(core_api):
    entries, _ = core_api
    missing = [f"{name} ({module})" for name, module in sorted(tvjax._EXPORTS.items())
               if name not in entry_names(entries, module)]
    assert not missing, f"tvjax.__all__ names without an entry in their module's section of {CONTRACT}: {missing}"


@pytest.mark.parametrize("broken, message", [
    ("* `likelihood_ratio(key, pi, mu, oracle, size, *, copies=None, chunk=None)`", "takes"),  # renamed parameter
    ("* `likelihood_ratio(key, pi, mu, oracle, sizes, copies=None, chunk=None)`", "takes"),  # kind
    ("* `likelihood_ratio(key, pi, mu, oracle, sizes, *, chunk=None, copies=None)`", "takes"),  # order
    ("* `likelihood_ratio(key, pi, mu, oracle, sizes, *, copies=1, chunk=None)`", "takes"),  # default
    ("* `mixture(key, pi, mu, oracle, sizes, *, copies=None, chunk=None)`", "has no attribute"),  # removed
    ("* `Samples(num, repeats=2)`", "takes"),  # NamedTuple default
    ("* `WINDOW = 16`", "WINDOW is 32"),
])
def test_the_checker_catches_a_broken_line(broken, message):
    module = ("tvjax.core.streaming" if "WINDOW" in broken else
              "tvjax.core.schedules" if "Samples" in broken else "tvjax.core.estimators")
    entries, _ = parse_core_api(f"## {module}\n\n{broken}\n")
    assert len(entries) == 1
    with pytest.raises(AssertionError, match=message):
        check_entry(entries[0])


def test_the_checker_catches_a_broken_method_line():
    text = "## tvjax.core.oracles\n\n* Every oracle (`Exact`, `Noisy`):\n  * `.noise_level(pi, nu)`\n"
    entries, _ = parse_core_api(text)
    assert [e.span for e in entries] == [".noise_level(pi, nu)"]
    with pytest.raises(AssertionError, match="Exact.noise_level takes"):
        check_entry(entries[0])


# --------------------------------------------------------------------------- README.md and the docs pages


def docs_pages():
    """README.md and every page under docs/, as (name relative to the repository, text)."""
    paths = [README, *sorted(DOCS.rglob("*.md"))]
    return [(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")) for path in paths]


PAGES = docs_pages()


def readme_api_block(text):
    section = text.split("## Python API in one screen", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'Python API in one screen' has no python block"
    return match.group(1)


def fenced_blocks(text):
    """[(language, body)] of a page's fenced code blocks."""
    return re.findall(r"```(\w*)\n(.*?)```", text, re.S)


def module_aliases(code):
    """{alias: module} from the imports of a code block (`from tvjax.core import estimators as E`).
    A block that does not parse, or imports a module whose extra is missing here, gives what it can."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {}
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tvjax"):
            for a in node.names:
                if _is_submodule(node.module, a.name):
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tvjax"):
                    aliases[a.asname or a.name] = a.name
    return aliases



def _is_submodule(module, name):
    """Whether `from module import name` imports a submodule (found without importing it)."""
    package = _find_spec(module)
    return bool(package and package.submodule_search_locations is not None and _find_spec(f"{module}.{name}"))


def top_level_names(spec):
    """The names a module's source defines at its top level, read without importing it (for a module
    whose extra, torch say, is not installed here)."""
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def resolve_mentioned(path):
    """Like resolve_dotted, for a name a page mentions: a module whose optional package is missing here
    (the torch-side bridges) is read statically instead of imported."""
    parts = path.split(".")
    i, spec = longest_module(path)
    if i == len(parts):
        return spec
    try:
        return resolve_dotted(path)
    except ImportError:
        if i != len(parts) - 1:
            raise LookupError(f"{path}: {'.'.join(parts[:i])} does not import here, and only its top-level names "
                              "can be checked") from None
        if parts[-1] not in top_level_names(spec):
            raise LookupError(f"{'.'.join(parts[:i])} defines no {parts[-1]!r} ({path})") from None
        return None


def mentioned_names(text, aliases):
    """Every tvjax name a page mentions: `tvjax.X...` anywhere (prose, spans, code blocks of any
    language, `::: tvjax.X` directives), names imported by `from tvjax.X import a, b` in python blocks,
    and alias.name (E.plugin, O.Noisy) in spans and python blocks."""
    prose = "\n".join(strip_fences(text))
    spans = SPAN.findall(prose)
    python = [body for lang, body in fenced_blocks(text) if lang == "python"]
    names = set(re.findall(r"(?<![\w/.-])tvjax(?:\.[A-Za-z_]\w*)+", text))
    for body in python:
        for module, imported in re.findall(r"^\s*from (tvjax[\w.]*) import ([\w, ]+)$", body, re.M):
            names |= {f"{module}.{n.split(' as ')[0].strip()}" for n in imported.split(",") if n.strip()}
        aliases = {**aliases, **{k: v for k, v in module_aliases(body).items() if k != "tvjax"}}
    if aliases:
        pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, aliases)) + r")\.([A-Za-z_]\w*)")
        for chunk in spans + python:
            names |= {f"{aliases[a]}.{n}" for a, n in pattern.findall(chunk)}
    return names


@pytest.fixture(scope="module")
def readme_aliases():
    aliases = {k: v for k, v in module_aliases(readme_api_block(README.read_text())).items() if k != "tvjax"}
    assert {"E", "O"} <= set(aliases), f"the API block no longer imports E and O: {aliases}"
    return aliases


def test_readme_api_block_runs():
    code = readme_api_block(README.read_text())
    namespace = {"__name__": "readme_api_block"}
    exec(compile(code, "README.md (Python API in one screen)", "exec"), namespace)
    truth = namespace["tvjax"].exact_tv(namespace["pi"], namespace["mu"])
    r = namespace["r"]
    assert 0.0 <= float(r.ci_low) <= float(r.ci_high) <= 1.0 and abs(float(r.value) - truth) < 0.05


def test_the_pages_are_read():
    names = [name for name, _ in PAGES]
    for page in ("README.md", "docs/index.md", "docs/getting-started.md", "docs/design/core-api.md"):
        assert page in names, f"{page} is missing: {names}"


@pytest.mark.parametrize("page", [name for name, _ in PAGES])
def test_every_tvjax_name_a_page_mentions_exists(page, readme_aliases):
    names = mentioned_names(dict(PAGES)[page], readme_aliases)
    missing = []
    for name in sorted(names):
        try:
            resolve_mentioned(name)
        except LookupError as e:
            missing.append(f"{name}: {e}")
    assert not missing, f"{page} names what does not exist:\n" + "\n".join(missing)


def test_the_name_scan_finds_names(readme_aliases):
    readme = mentioned_names(README.read_text(), readme_aliases)
    everywhere = set().union(*(mentioned_names(text, readme_aliases) for _, text in PAGES))
    assert len(readme) > 15 and len(everywhere) > 100, f"only {len(readme)} / {len(everywhere)} names: the scan is broken"
    assert {"tvjax.core.estimators.plugin", "tvjax.core.oracles.Noisy"} <= readme  # E.plugin, O.Noisy


def test_the_name_scan_catches_a_missing_name(readme_aliases):
    text = "`tvjax.core.oracles.Noisier` and `E.plugins`\n\n```python\nfrom tvjax.core.api import estimate_everything\n```\n"
    names = mentioned_names(text, readme_aliases)
    for name in ("tvjax.core.oracles.Noisier", "tvjax.core.estimators.plugins", "tvjax.core.api.estimate_everything"):
        assert name in names
        with pytest.raises(LookupError):
            resolve_mentioned(name)
    assert resolve_mentioned("tvjax.engines.replay") is not None  # a module is found without importing it
    # a torch-side module's names: imported where torch is installed, read from its source elsewhere
    resolve_mentioned("tvjax.engines.replay.replay_step")
    with pytest.raises(LookupError):
        resolve_mentioned("tvjax.engines.replay.replay_steps")


def test_estimator_configs_and_the_overrides_the_docs_show_exist():
    from tvjax.core.estimators import REGISTRY

    configs = {p.stem for p in ESTIMATOR_CONFIGS.glob("*.yaml")}
    assert configs == set(REGISTRY), f"configs/estimator {sorted(configs)} vs REGISTRY {sorted(REGISTRY)}"
    rows = [(page, line) for page, text in PAGES for line in text.splitlines() if line.startswith("| `estimator/` |")]
    assert rows, "no page has the `estimator/` row of the config groups table"
    for page, row in rows:
        listed = {s for s in SPAN.findall(row) if IDENTIFIER.fullmatch(s)} - {"estimator/"}
        assert listed == configs, f"{page}'s estimator/ row lists {sorted(listed)}, configs/estimator has {sorted(configs)}"
    fields = {name: set(spec.sizes._fields) for name, spec in REGISTRY.items()}
    options = {p.name for spec in REGISTRY.values() for p in inspect.signature(spec.fn).parameters.values()
               if p.kind is p.KEYWORD_ONLY}
    problems = []
    for page, text in PAGES:
        # a command is one line of a code block or one inline code span: its overrides belong together
        commands = [line for _, body in fenced_blocks(text) for line in body.splitlines()]
        commands += SPAN.findall("\n".join(strip_fences(text)))
        for command in commands:
            chosen = re.findall(r"\bestimator=(\w+)", command)
            problems += [f"{page}: {command!r}: estimator={c} has no config" for c in chosen if c not in configs]
            allowed = set().union(*(fields[c] for c in chosen if c in fields)) if chosen else set().union(*fields.values())
            problems += [f"{page}: {command!r}: no estimator has sizes field {f!r}"
                         for f in re.findall(r"\bestimator\.sizes\.(\w+)=", command) if f not in allowed]
            problems += [f"{page}: {command!r}: no estimator has option {o!r}"
                         for o in re.findall(r"\bestimator\.(?!sizes\.)(\w+)=", command) if o not in options]
    assert not problems, "estimator overrides that do not exist: " + "; ".join(problems)


def test_readme_is_short_and_opens_with_its_two_commands():
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    assert text.startswith(README_OPENING), (
        "README.md must open with its title and the two commands, byte for byte:\n" + README_OPENING
        + "\nit opens with:\n" + text[:len(README_OPENING)])


def test_the_docs_home_shows_the_same_two_commands():
    commands = README_OPENING.split("```bash\n", 1)[1].split("```", 1)[0]
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    assert f"```bash\n{commands}```" in home, "docs/index.md's two commands differ from README.md's"


def test_readme_links_into_the_docs_exist():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10, f"README links only {len(links)} docs pages"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README.md links pages that do not exist: {missing}"


# --------------------------------------------------------------------------- the flat API and the reference


@pytest.mark.parametrize("name", tvjax.__all__)
def test_every_flat_export_resolves(name):
    value = getattr(tvjax, name)
    assert value is getattr(importlib.import_module(tvjax._EXPORTS[name]), name)


def test_flat_namespace_is_the_exports_and_the_subpackages():
    assert sorted(dir(tvjax)) == sorted(tvjax.__all__ + list(tvjax.SUBPACKAGES))


@pytest.mark.parametrize("name", tvjax.SUBPACKAGES)
def test_every_subpackage_imports(name):
    module = importlib.import_module(f"tvjax.{name}")
    assert getattr(tvjax, name) is module


def reference_coverage(pages):
    """(directives, spans) of the API reference pages: the objects of their `::: tvjax...` lines and
    their inline code spans."""
    directives, spans = set(), set()
    for text in pages:
        directives |= set(re.findall(r"^:::\s+(tvjax[\w.]*)", text, re.M))
        spans |= set(SPAN.findall("\n".join(strip_fences(text))))
    return directives, spans


def uncovered_exports(pages):
    """The names of tvjax._EXPORTS that no reference page covers: neither a `::: module` (or
    `::: module.name`) directive nor a code span naming it (`name`, `name(...)`, `module.name`)."""
    directives, spans = reference_coverage(pages)
    named = {re.split(r"[(\[]", span, maxsplit=1)[0] for span in spans}
    return [f"{module}.{name}" for name, module in sorted(tvjax._EXPORTS.items())
            if module not in directives and f"{module}.{name}" not in directives
            and name not in named and f"{module}.{name}" not in named]


def test_every_flat_export_is_on_a_reference_page():
    pages = [path.read_text(encoding="utf-8") for path in sorted(REFERENCE.glob("*.md"))]
    assert pages, "docs/reference/ has no pages"
    missing = uncovered_exports(pages)
    assert not missing, f"names of tvjax._EXPORTS that no page of docs/reference/ covers: {missing}"


def test_the_reference_check_catches_an_uncovered_name():
    everything = ["\n".join(f"::: {module}" for module in set(tvjax._EXPORTS.values()))]
    assert uncovered_exports(everything) == []
    by_name = ["`estimate_tv(key, pi, mu)` and `tvjax.core.oracles.Exact`"]
    missing = uncovered_exports(by_name)
    assert "tvjax.core.api.estimate_tv" not in missing and "tvjax.core.oracles.Exact" not in missing
    assert "tvjax.core.oracles.Noisy" in missing
