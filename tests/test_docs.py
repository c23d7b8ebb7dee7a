"""The docs against the code, so they cannot drift: every signature of docs/CORE_API.md, the
README's "Python API in one screen" block (executed) and the names the README mentions, and the
flat API of `tvjax.__all__`.

docs/CORE_API.md's grammar (it says so at its top): under a `## tvjax.<module>` heading, a bullet
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
CORE_API = ROOT / "docs" / "CORE_API.md"
README = ROOT / "README.md"
ESTIMATOR_CONFIGS = ROOT / "configs" / "estimator"

CORE_MODULES = ("instances", "oracles", "currency", "cost", "schedules", "streaming", "programs", "estimators",
                "studies", "api")
ONE_LINE_MODULES = ("pools", "synthetic_pool", "jsonable")

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
    """(entries, sections): every entry of docs/CORE_API.md with its section's module, and the
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
        assert module is not None, f"CORE_API.md line {b.line}: entry {spans[0]!r} outside a `## tvjax.<module>` section"
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
                assert module not in sections, f"CORE_API.md line {number}: a second section for {module}"
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


def resolve_dotted(path):
    """The object at an absolute dotted path `tvjax.a.b`; a module is found without importing
    it (engine modules import torch)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(name)
        except (ModuleNotFoundError, ValueError):
            spec = None
        if spec is not None:
            break
    else:
        raise LookupError(f"no module in {path!r}")
    if i == len(parts):
        return spec
    obj = importlib.import_module(name)
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
        assert hasattr(module, name), f"CORE_API.md line {entry.line}: {entry.module} has no {name!r} (enclosing bullet)"
        if inspect.isclass(getattr(module, name)):
            classes.append(getattr(module, name))
    assert classes, f"CORE_API.md line {entry.line}: {entry.span!r} needs an enclosing bullet naming its classes"
    return classes


def check_entry(entry):
    """Raise AssertionError when a documented entry does not match the code."""
    where = f"CORE_API.md line {entry.line} ({entry.module}): `{entry.span}`"
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


# --------------------------------------------------------------------------- docs/CORE_API.md


def test_core_api_has_a_section_per_core_module(core_api):
    entries, sections = core_api
    expected = [f"tvjax.{m}" for m in CORE_MODULES + ONE_LINE_MODULES]
    assert not set(expected) - set(sections), f"CORE_API.md lacks sections for {sorted(set(expected) - set(sections))}"
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
    assert not failures, "docs/CORE_API.md does not match the code:\n" + "\n".join(failures)


def test_every_public_function_and_class_of_a_core_module_is_documented(core_api):
    entries, _ = core_api
    missing = []
    for short in CORE_MODULES:
        module = importlib.import_module(f"tvjax.{short}")
        public = {name for name, obj in vars(module).items()
                  if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                  and defined_in(obj, module)}
        public |= set(getattr(module, "__all__", ()))
        missing += [f"{module.__name__}.{name}" for name in sorted(public - entry_names(entries, module.__name__))]
    assert not missing, f"public names without an entry in docs/CORE_API.md: {missing}"


def test_every_flat_export_is_documented_in_its_module_section(core_api):
    entries, _ = core_api
    missing = [f"{name} ({module})" for name, module in sorted(tvjax._EXPORTS.items())
               if name not in entry_names(entries, module)]
    assert not missing, f"tvjax.__all__ names without an entry in their module's section of docs/CORE_API.md: {missing}"


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
    module = "tvjax.core.streaming" if "WINDOW" in broken else "tvjax.core.schedules" if "Samples" in broken else "tvjax.core.estimators"
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


# --------------------------------------------------------------------------- README.md


def readme_api_block(text):
    section = text.split("## Python API in one screen", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'Python API in one screen' has no python block"
    return match.group(1)


def module_aliases(code):
    """{alias: module} from the imports of a code block (`from tvjax import estimators as E`)."""
    aliases = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tvjax"):
            for a in node.names:
                if inspect.ismodule(getattr(importlib.import_module(node.module), a.name, None)):
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tvjax"):
                    aliases[a.asname or a.name] = a.name
    return aliases


def test_readme_api_block_runs():
    code = readme_api_block(README.read_text())
    namespace = {"__name__": "readme_api_block"}
    exec(compile(code, "README.md (Python API in one screen)", "exec"), namespace)
    truth = namespace["tvjax"].exact_tv(namespace["pi"], namespace["mu"])
    r = namespace["r"]
    assert 0.0 <= float(r.ci_low) <= float(r.ci_high) <= 1.0 and abs(float(r.value) - truth) < 0.05


def test_every_tvjax_name_the_readme_mentions_exists():
    text = README.read_text()
    prose = "\n".join(strip_fences(text))
    fenced = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    spans = SPAN.findall(prose)
    python = [body for lang, body in fenced if lang == "python"]
    names = set()
    # tvjax.X anywhere: prose, spans and every code block (python, bash: `python -m tvjax.pools.report`)
    names |= set(re.findall(r"(?<![\w/.-])tvjax(?:\.[A-Za-z_]\w*)+", text))
    # from tvjax.X import a, b in code blocks
    for body in python:
        for module, imported in re.findall(r"^\s*from (tvjax[\w.]*) import ([\w, ]+)$", body, re.M):
            names |= {f"{module}.{n.split(' as ')[0].strip()}" for n in imported.split(",") if n.strip()}
    # E.X, O.X (the API block's module aliases) in spans and python blocks
    aliases = {k: v for k, v in module_aliases(readme_api_block(text)).items() if k != "tvjax"}
    assert {"E", "O"} <= set(aliases), f"the API block no longer imports E and O: {aliases}"
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, aliases)) + r")\.([A-Za-z_]\w*)")
    for chunk in spans + python:
        names |= {f"{aliases[a]}.{n}" for a, n in pattern.findall(chunk)}
    missing = []
    for name in sorted(names):
        try:
            resolve_dotted(name)
        except LookupError as e:
            missing.append(f"{name}: {e}")
    assert len(names) > 20, f"only {len(names)} names found: the scan is broken"
    assert not missing, "README.md names that do not exist:\n" + "\n".join(missing)


def test_readme_estimator_configs_and_overrides_exist():
    from tvjax.core.estimators import REGISTRY

    text = README.read_text()
    configs = {p.stem for p in ESTIMATOR_CONFIGS.glob("*.yaml")}
    assert configs == set(REGISTRY), f"configs/estimator {sorted(configs)} vs REGISTRY {sorted(REGISTRY)}"
    row = next(line for line in text.splitlines() if line.startswith("| `estimator/` |"))
    listed = {s for s in SPAN.findall(row) if IDENTIFIER.fullmatch(s)} - {"estimator/"}
    assert listed == configs, f"README's estimator/ row lists {sorted(listed)}, configs/estimator has {sorted(configs)}"
    fields = {name: set(spec.sizes._fields) for name, spec in REGISTRY.items()}
    options = {p.name for spec in REGISTRY.values() for p in inspect.signature(spec.fn).parameters.values()
               if p.kind is p.KEYWORD_ONLY}
    # a command is one line of a code block or one inline code span: its overrides belong together
    commands = [line for _, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) for line in body.splitlines()]
    commands += SPAN.findall("\n".join(strip_fences(text)))
    problems = []
    for command in commands:
        chosen = re.findall(r"\bestimator=(\w+)", command)
        problems += [f"{command!r}: estimator={c} has no config" for c in chosen if c not in configs]
        allowed = set().union(*(fields[c] for c in chosen if c in fields)) if chosen else set().union(*fields.values())
        problems += [f"{command!r}: no estimator has sizes field {f!r}"
                     for f in re.findall(r"\bestimator\.sizes\.(\w+)=", command) if f not in allowed]
        problems += [f"{command!r}: no estimator has option {o!r}"
                     for o in re.findall(r"\bestimator\.(?!sizes\.)(\w+)=", command) if o not in options]
    assert not problems, "README estimator overrides that do not exist: " + "; ".join(problems)


# --------------------------------------------------------------------------- the flat API


@pytest.mark.parametrize("name", tvjax.__all__)
def test_every_flat_export_resolves(name):
    value = getattr(tvjax, name)
    assert value is getattr(importlib.import_module(tvjax._EXPORTS[name]), name)


def test_flat_modules_exist():
    assert sorted(dir(tvjax)) == sorted(tvjax.__all__)
    missing = [m for m in sorted(tvjax.MODULES) if importlib.util.find_spec(f"tvjax.{m}") is None]
    assert not missing, f"tvjax.MODULES names missing modules: {missing}"
