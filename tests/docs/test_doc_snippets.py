"""Every ```python block of README.md and docs/**/*.md runs, so the docs cannot rot.

Each page runs in a child process of its own (a fresh ``__main__`` namespace, a
temporary working directory, no process group or logging setup leaking between
pages; forked from one process that imported torch, so a page does not pay for
that import again), its blocks in order, so a block may use what an earlier block of the same
page defined. A block that imports an optional package that is not installed is
skipped with its name, and so is every later block of that page (they build on it);
CI installs every extra, so nothing skips there. Blocks that are not meant to run
carry another language tag (```text, ```console, ```bash).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md"]
    + [p for p in (REPO / "docs").rglob("*.md") if "_build" not in p.relative_to(REPO).parts]
)

OPTIONAL = {
    # import name -> the package a block needs (what the skip reason names)
    "torch": "torch",
    "safetensors": "safetensors",
    "numpy": "numpy",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "pytorch_lightning": "pytorch-lightning",
    "deepspeed": "deepspeed",
    "fsspec": "fsspec",
    "s3fs": "s3fs",
    "matplotlib": "matplotlib",
}
"""Third-party packages a page may import; a missing one skips the block."""

SUBMODULE_NEEDS = {
    "atomic_ckpt.torch": ("torch", "safetensors"),
    "atomic_ckpt.distributed": ("torch",),
    "atomic_ckpt.dcp": ("torch",),
    "atomic_ckpt.testing.dcp": ("torch",),
    "atomic_ckpt.remote": ("fsspec",),
    "atomic_ckpt.integrations.transformers": ("transformers", "accelerate"),
    "atomic_ckpt.integrations.accelerate": ("accelerate",),
    "atomic_ckpt.integrations.lightning": ("lightning",),
}
"""The library's optional modules and the packages they import."""

PAGE_TIMEOUT = 420
"""Seconds for all blocks of one page (the framework pages train tiny models)."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+(?:\s*,\s*[\w.]+)*))", re.M)


@dataclass(frozen=True)
class Block:
    """One ```python block: where it is and its code (dedented as the page shows it)."""

    page: Path
    line: int  # the first line of code, 1-based
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """The ```python blocks of a Markdown page, nested ones (in a list item) included."""
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) == {fence[0]}:
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if info.split()[:1] == ["python"]:
            blocks.append(Block(page, i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def needs(code: str) -> set[str]:
    """The optional packages a block imports, directly or through the library."""
    found: set[str] = set()
    for m in _IMPORT.finditer(code):
        for raw in (m[1] or m[2]).split(","):
            name = raw.strip()
            if name.split(".")[0] in OPTIONAL:
                found.add(name.split(".")[0])
            for module, packages in SUBMODULE_NEEDS.items():
                if name == module or name.startswith(module + "."):
                    found.update(packages)
    return found


@cache
def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


ALL_BLOCKS = [b for page in PAGES for b in python_blocks(page)]

_SERVER = r"""
import importlib, json, os, sys, types
for module in ("torch", "safetensors.torch"):  # what most pages import: once, not per page
    try:
        importlib.import_module(module)
    except ImportError:
        pass
def answer(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()
answer(ready=os.getpid())
request = None
for line in sys.stdin:
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        request = json.loads(line)
        break
    answer(pid=pid)
    _, status = os.waitpid(pid, 0)
    answer(returncode=-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
if request is None:
    sys.exit(0)
# A forked child: one page's blocks, then the interpreter's normal exit.
null = os.open(os.devnull, os.O_RDONLY)
out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for fd, target in ((0, null), (1, out), (2, out)):  # stdout and stderr share one offset
    os.dup2(target, fd)
os.close(null)
os.close(out)
os.chdir(request["cwd"])
os.environ["DOC_SNIPPET_RESULTS"] = request["results"]
main = types.ModuleType("__main__")
main.__dict__["__builtins__"] = __builtins__
sys.modules["__main__"] = main
results = {}
for b in request["blocks"]:
    try:
        code = compile("\n" * (b["line"] - 1) + b["code"], b["page"], "exec")
        exec(code, main.__dict__)
    except BaseException:
        import traceback
        results[b["id"]] = traceback.format_exc()
        break
    results[b["id"]] = None
    sys.stdout.flush()
    sys.stderr.flush()
with open(os.environ["DOC_SNIPPET_RESULTS"], "w") as f:
    json.dump(results, f)
"""
"""The process that runs the pages: it imports torch once (most pages import it; about 2 s
of CPU each time) and forks one child per page, which runs the page's blocks in a fresh
``__main__`` in the page's working directory and ends as an interpreter does (``atexit``
handlers and all). A child is a process of its own, so nothing a page sets up (a process
group, logging, a signal handler) reaches another page."""


class PageServer:
    """The ``_SERVER`` process of this worker, started at its first page."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["HF_HUB_OFFLINE"] = "1"  # a docs example never downloads
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=REPO,
            bufsize=0,
        )
        self.buffer = b""
        assert "ready" in self.answer(PAGE_TIMEOUT)

    def answer(self, timeout: float) -> dict[str, int]:
        """The server's next line (a line read ahead is kept)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            wait = max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select([self.proc.stdout], [], [], wait)
            if not ready:
                raise subprocess.TimeoutExpired("a page's child", timeout)
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            assert chunk, f"the page server ended (exit {self.proc.poll()})"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return dict(json.loads(line))

    def run(self, request: dict[str, object]) -> int:
        """Run one page in a forked child: its exit status as ``subprocess`` gives it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        pid = self.answer(PAGE_TIMEOUT)["pid"]
        try:
            return self.answer(PAGE_TIMEOUT)["returncode"]
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


_SERVERS: list[PageServer] = []


@pytest.fixture(scope="module", autouse=True)
def _page_server() -> Iterator[None]:
    """This module's page server (started by the first page run), ended after its tests."""
    yield
    while _SERVERS:
        _SERVERS.pop().close()


@dataclass
class PageRun:
    """The outcome of one page's run: per block id, None (passed) or the traceback."""

    results: dict[str, str | None]
    output: str
    skipped: dict[str, str]


_RUNS: dict[Path, PageRun] = {}


def run_page(page: Path, workdir: Path) -> PageRun:
    """Run the page's blocks in order in one child process (once per session)."""
    if page in _RUNS:
        return _RUNS[page]
    blocks = [b for b in ALL_BLOCKS if b.page == page]
    skipped: dict[str, str] = {}
    runnable: list[Block] = []
    for b in blocks:
        missing = sorted(OPTIONAL[n] for n in needs(b.code) if not installed(n))
        if missing or skipped:
            skipped[b.id] = (
                f"needs {', '.join(missing)} (not installed)"
                if missing
                else f"an earlier block of this page was skipped ({next(iter(skipped))})"
            )
            continue
        runnable.append(b)
    results_file = workdir / "results.json"
    output_file = workdir.parent / f"{workdir.name}.out"
    request = {
        "blocks": [
            {"id": b.id, "page": str(b.page.relative_to(REPO)), "line": b.line, "code": b.code}
            for b in runnable
        ],
        "cwd": str(workdir),
        "results": str(results_file),
        "out": str(output_file),
    }
    if not _SERVERS:
        _SERVERS.append(PageServer())
    try:
        returncode = _SERVERS[0].run(request)
    except BaseException:
        server = _SERVERS.pop()  # its answers are out of step now: the next page starts anew
        server.proc.kill()
        server.proc.wait()
        raise
    output = output_file.read_text(errors="replace")[-6000:] if output_file.exists() else ""
    if results_file.exists():
        results: dict[str, str | None] = json.loads(results_file.read_text())
    else:
        results = {}
    for b in runnable:
        if b.id not in results:
            results[b.id] = (
                f"not run (the page's child exited {returncode} "
                "before it, or an earlier block failed)"
            )
    _RUNS[page] = PageRun(results, output, skipped)
    return _RUNS[page]


def test_pages_have_blocks() -> None:
    """The collector finds the README's quickstart and blocks in the guides (no silent 0)."""
    pages = {b.page.relative_to(REPO).parts[0] for b in ALL_BLOCKS}
    assert "README.md" in pages
    assert "docs" in pages
    assert len(ALL_BLOCKS) >= 20


def test_block_parser_reads_nested_fences(tmp_path: Path) -> None:
    """A ```python block inside a list item is found and dedented; other tags are not."""
    page = tmp_path / "p.md"
    page.write_text(
        "# t\n\n```console\n$ ls\n```\n\n* item\n\n  ```python\n  x = 1\n  ```\n\n"
        "````python\n```\ny = 2\n````\n"
    )
    blocks = python_blocks(page)
    assert [(b.line, b.code) for b in blocks] == [(10, "x = 1\n"), (14, "```\ny = 2\n")]


def test_needs_sees_library_submodules() -> None:
    """A block that imports only atomic_ckpt.torch still needs torch."""
    assert needs("from atomic_ckpt.torch import save_state\n") == {"torch", "safetensors"}
    assert needs("import os, torch.distributed as dist\n") == {"torch"}
    assert needs("from atomic_ckpt import CheckpointDir\n") == set()


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.id)
def test_doc_block_runs(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The block runs without raising, after the page's earlier blocks, in a temp cwd."""
    key = re.sub(r"\W", "_", str(block.page.relative_to(REPO)))
    if block.page not in _RUNS:
        run_page(block.page, tmp_path_factory.mktemp(key))
    run = _RUNS[block.page]
    if block.id in run.skipped:
        pytest.skip(run.skipped[block.id])
    error = run.results[block.id]
    if error is not None:
        pytest.fail(f"{block.id} failed:\n{error}\n--- page output (tail) ---\n{run.output}")


PUBLIC_MODULES = (
    "atomic_ckpt",
    "atomic_ckpt.torch",
    "atomic_ckpt.distributed",
    "atomic_ckpt.dcp",
    "atomic_ckpt.remote",
    "atomic_ckpt.testing",
    "atomic_ckpt.testing.dcp",
    "atomic_ckpt.integrations.transformers",
    "atomic_ckpt.integrations.accelerate",
    "atomic_ckpt.integrations.lightning",
)
"""The modules the API reference documents (docs/conf.py lists the same)."""

_LITERAL = re.compile(r"::\n\n((?:[ \t]+.*\n|[ \t]*\n)+)")


@dataclass(frozen=True)
class Sketch:
    """A ``::`` code block in a public docstring: an overview with placeholder names."""

    where: str
    module: str
    code: str


def docstring_sketches(module: str) -> list[Sketch]:
    """The literal blocks of a public module's docstring and of its public objects'."""
    import inspect
    import textwrap

    missing = sorted(OPTIONAL[n] for n in needs(f"import {module}\n") if not installed(n))
    if missing:
        return [Sketch(f"{module} (needs {', '.join(missing)})", module, "")]
    mod = importlib.import_module(module)
    found: list[Sketch] = []
    objects = [("", mod)] + [(n, getattr(mod, n)) for n in getattr(mod, "__all__", [])]
    for name, obj in objects:
        doc = inspect.getdoc(obj) if (obj is mod or inspect.isclass(obj) or callable(obj)) else None
        for i, m in enumerate(_LITERAL.finditer((doc or "") + "\n")):
            where = f"{module}{'.' + name if name else ''}#{i}"
            found.append(Sketch(where, module, textwrap.dedent(m[1])))
    return found


ALL_SKETCHES = [s for module in PUBLIC_MODULES for s in docstring_sketches(module)]


@pytest.mark.parametrize("sketch", ALL_SKETCHES, ids=lambda s: s.where)
def test_docstring_sketch_parses_and_imports(sketch: Sketch) -> None:
    """A docstring's example is valid Python and everything it imports exists.

    These overviews use placeholders for the reader's code (``model``, ``step``), so they
    are not run; the guides hold the runnable versions. A renamed or moved name still
    fails here."""
    import ast

    if not sketch.code:
        pytest.skip(sketch.where)
    tree = ast.parse(sketch.code, filename=sketch.where)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    missing = sorted(
        OPTIONAL[n] for n in needs(ast.unparse(ast.Module(imports, []))) if not installed(n)
    )
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    exec(compile(ast.Module(imports, []), sketch.where, "exec"), {})


def test_public_docstrings_have_sketches() -> None:
    """The collector finds the module overviews (a regex that matched nothing would pass)."""
    assert len(ALL_SKETCHES) >= 10


def test_a_sketch_importing_a_missing_name_fails() -> None:
    """The sketch check is not vacuous: an import of a name that moved away raises."""
    sketch = Sketch("x#0", "atomic_ckpt", "from atomic_ckpt import NoSuchName\nrun(model)\n")
    with pytest.raises(ImportError):
        test_docstring_sketch_parses_and_imports(sketch)
