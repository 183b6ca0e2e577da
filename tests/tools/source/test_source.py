"""The tree-sitter source index on real files and a real `git diff`."""

from __future__ import annotations

import importlib
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tools.source.index import SourceIndex, TreeSitterIndex, commit_changes, diff_paths, open_index, parse_file

KV_CACHE = textwrap.dedent('''\
    """Paged KV cache."""
    import functools

    BLOCK_SIZE = 16


    class BlockManager:
        """Hands out KV-cache blocks."""

        def __init__(self, num_blocks):
            self.free = list(range(num_blocks))

        def can_allocate(self, n):
            return len(self.free) >= n

        def allocate(self, n):
            if not self.can_allocate(n):
                raise MemoryError(n)
            blocks = self.free[:n]
            self.free = self.free[n:]
            return blocks

        @property
        def num_free(self):
            return len(self.free)

        class Stats:
            def report(self):
                return summarize(self)


    @functools.lru_cache(maxsize=None)
    def summarize(obj):
        """Summary line.

        More text."""
        def fmt(x):
            return str(x)
        return fmt(obj)


    async def stream_tokens(engine):
        async for tok in engine.run():
            yield tok


    def make_manager(n):
        return BlockManager(n)
''')

KERNELS = textwrap.dedent("""\
    #include <cuda_runtime.h>
    namespace tinyserve {

    // Applies rotary embedding in place.
    template <typename T>
    __global__ void __launch_bounds__(256) rotary_kernel(T* __restrict__ q, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) q[i] = rotate(q[i]);
    }

    __device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

    class BlockTable {
     public:
      int lookup(int seq) const { return table_[seq]; }
      ~BlockTable() {}
     private:
      int* table_;
    };

    int BlockTable::size() const { return 0; }

    void launch_rotary(float* q, int n, cudaStream_t stream) {
      rotary_kernel<float><<<(n + 255) / 256, 256, 0, stream>>>(q, n);
    }

    }  // namespace tinyserve
""")


def git(repo: Path, *args: str) -> str:
    cmd = [
        "git",
        "-c",
        "user.name=Tester",
        "-c",
        "user.email=t@example.com",
        "-c",
        "init.defaultBranch=main",
        "-c",
        "commit.gpgsign=false",
        "-C",
        str(repo),
        *args,
    ]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def engine_tree(tmp_path) -> Path:
    return write_tree(
        tmp_path / "engine",
        {
            "tinyserve/__init__.py": "",
            "tinyserve/kv_cache.py": KV_CACHE,
            "tinyserve/rotary.py": "class RotaryEmbedding:\n    def forward(self, x):\n        return apply_rotary(x)\n\n\n"
            "def apply_rotary(x):\n    return x\n",
            "csrc/kernels.cu": KERNELS,
            "tests/test_kv.py": "def test_alloc():\n    pass\n",
            "tinyserve/__pycache__/junk.py": "def junk(): pass\n",
        },
    )


def by_qualname(index: TreeSitterIndex, file: str) -> dict[str, object]:
    return {s.qualname: s for s in index.symbols if s.file == file}


def test_python_qualified_names_kinds_lines_and_docs(engine_tree):
    index = open_index(engine_tree)
    syms = by_qualname(index, "tinyserve/kv_cache.py")
    assert {q: s.kind for q, s in syms.items()} == {
        "BlockManager": "class",
        "BlockManager.__init__": "method",
        "BlockManager.can_allocate": "method",
        "BlockManager.allocate": "method",
        "BlockManager.num_free": "method",
        "BlockManager.Stats": "class",
        "BlockManager.Stats.report": "method",
        "summarize": "function",
        "summarize.fmt": "function",
        "stream_tokens": "function",
        "make_manager": "function",
    }
    assert (syms["BlockManager.allocate"].start_line, syms["BlockManager.allocate"].end_line) == (16, 21)
    assert syms["BlockManager.num_free"].start_line == 23  # the decorator line
    assert syms["summarize"].start_line == 32
    assert syms["summarize"].doc == "Summary line." and syms["BlockManager"].doc == "Hands out KV-cache blocks."
    assert "tinyserve/__pycache__/junk.py" not in index.texts
    assert "tests/test_kv.py" in index.texts
    assert "tests/test_kv.py" not in open_index(engine_tree, include_tests=False).texts


def test_cpp_and_cuda_functions_methods_and_kernels(engine_tree):
    syms = by_qualname(open_index(engine_tree), "csrc/kernels.cu")
    assert {q: s.kind for q, s in syms.items()} == {
        "rotary_kernel": "function",
        "silu": "function",
        "BlockTable": "class",
        "BlockTable.lookup": "method",
        "BlockTable.~BlockTable": "method",
        "BlockTable.size": "method",
        "launch_rotary": "function",
    }
    kernel = syms["rotary_kernel"]
    assert (kernel.start_line, kernel.end_line, kernel.language) == (5, 9, "cpp")  # template line included
    assert kernel.doc == "Applies rotary embedding in place."


def test_find_read_and_search(engine_tree):
    index: SourceIndex = open_index(engine_tree)
    assert [s.qualname for s in index.find("allocate")] == ["BlockManager.allocate"]
    assert [s.qualname for s in index.find("BlockTable::size")] == ["BlockTable.size"]
    assert index.find("Stats.report")[0].file == "tinyserve/kv_cache.py"
    source = index.read(index.find("BlockManager.can_allocate")[0])
    assert source == "    def can_allocate(self, n):\n        return len(self.free) >= n\n"
    assert index.search("BlockManager")[0].qualname == "BlockManager"
    rotary = {s.qualname for s in index.search("rotary")}
    assert {"RotaryEmbedding", "apply_rotary", "rotary_kernel", "launch_rotary"} <= rotary
    assert [s.qualname for s in index.search("block allocate")] == [
        "BlockManager.allocate",
        "BlockManager.can_allocate",
    ]


def test_call_edges_by_name(engine_tree):
    index = open_index(engine_tree)
    allocate = index.find("BlockManager.allocate")[0]
    assert index.callees(allocate) == ["MemoryError", "can_allocate"]
    assert [s.qualname for s in index.callers("can_allocate")] == ["BlockManager.allocate"]
    assert [s.qualname for s in index.callers("summarize")] == ["BlockManager.Stats.report"]
    assert index.callees(index.find("summarize")[0]) == ["fmt"]  # fmt's own call stays in fmt
    assert [s.qualname for s in index.callers("rotary_kernel")] == ["launch_rotary"]  # <<<…>>> launch
    assert [s.qualname for s in index.callers("rotate")] == ["rotary_kernel"]


def test_hunks_map_to_enclosing_functions_on_a_real_git_diff(tmp_path):
    repo = write_tree(tmp_path / "repo", {"tinyserve/kv_cache.py": KV_CACHE, "csrc/kernels.cu": KERNELS})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    changed = (
        KV_CACHE.replace("BLOCK_SIZE = 16", "BLOCK_SIZE = 32")
        .replace("self.free = self.free[n:]", "self.free = self.free[n + 1:]")
        .replace("\n\ndef make_manager(n):\n    return BlockManager(n)\n", "")
    )
    changed = changed.replace("    return fmt(obj)\n", "")  # body tail removed
    write_tree(
        repo,
        {
            "tinyserve/kv_cache.py": changed,
            "csrc/kernels.cu": KERNELS.replace("q[i] = rotate(q[i])", "q[i] = rotate(q[i]) * 2"),
        },
    )
    git(repo, "commit", "-q", "-am", "change")
    diff = git(repo, "diff", "HEAD~1", "HEAD")

    new, old = open_index(repo, commit="HEAD"), open_index(repo, commit="HEAD~1")
    changes = new.symbols_for_hunks(diff, old=old)
    seen = {(c.file, c.symbol.qualname if c.symbol else None, c.side) for c in changes}
    assert seen == {
        ("csrc/kernels.cu", "rotary_kernel", "new"),
        ("csrc/kernels.cu", "rotary_kernel", "old"),
        ("tinyserve/kv_cache.py", None, "new"),  # BLOCK_SIZE: module level
        ("tinyserve/kv_cache.py", "BlockManager.allocate", "new"),
        ("tinyserve/kv_cache.py", "summarize", "new"),  # its last line removed
        ("tinyserve/kv_cache.py", None, "old"),
        ("tinyserve/kv_cache.py", "BlockManager.allocate", "old"),
        ("tinyserve/kv_cache.py", "summarize", "old"),
        ("tinyserve/kv_cache.py", "make_manager", "old"),  # deleted: only the old side knows it
    }
    module_level = next(c for c in changes if c.module_level and c.side == "new")
    assert 4 in module_level.lines

    # Without the old side, removal runs are placed by where they sit: same new-side answer.
    seen_new_only = {(c.file, c.symbol.qualname if c.symbol else None) for c in new.symbols_for_hunks(diff)}
    assert seen_new_only == {(f, q) for f, q, side in seen if side == "new"}


def test_a_commit_s_changes_are_mapped_on_its_own_tree_not_on_a_later_one(tmp_path):
    """A helper appended after `build` (commit 2); `build` grows later (commit 3). Commit 2's hunk
    lines, read on HEAD's tree, fall inside the grown `build`; on the commit's own tree they are
    the helper's alone. A function the commit touched that HEAD no longer has is left out."""
    build = "def build(x):\n    return x\n"
    repo = write_tree(tmp_path / "repo", {"engine/compile.py": build + "\n\ndef gone():\n    return 0\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    helper = "\n\ndef helper(x):\n    return x + 1\n"
    write_tree(repo, {"engine/compile.py": build + "\n\ndef gone():\n    return 1\n" + helper})
    git(repo, "commit", "-q", "-am", "add a helper")
    added = git(repo, "rev-parse", "HEAD").strip()
    grown = "def build(x):\n    y = x\n    y = y * 1\n    z = y\n    return z\n"
    write_tree(repo, {"engine/compile.py": grown + helper})
    git(repo, "commit", "-q", "-am", "build in steps; drop gone")
    diff = git(repo, "diff", f"{added}~1", added)
    head = open_index(repo, include_tests=False)

    on_head = {c.symbol.qualname for c in head.symbols_for_hunks(diff) if c.symbol}
    assert "build" in on_head  # the misattribution the mapping below avoids
    mapped = commit_changes(repo, added, diff, head)
    assert {c.symbol.qualname for c in mapped if c.symbol} == {"helper"}
    assert all(c.symbol is None or c.symbol == head.find(c.symbol.qualname)[0] for c in mapped)


def test_a_commit_s_index_of_some_paths_sees_those_files_as_the_whole_index_does(tmp_path):
    """A commit's index restricted to a diff's files holds exactly those files, with the whole
    index's symbols, texts and call edges for them, and maps the diff's hunks as the whole index
    does: what commit_changes builds, reading only the files a commit touched."""
    repo = write_tree(tmp_path / "repo", {"tinyserve/kv_cache.py": KV_CACHE, "csrc/kernels.cu": KERNELS})
    write_tree(
        repo, {"tinyserve/rotary.py": "def apply_rotary(x):\n    return x\n", "tests/test_r.py": "def t():\n    pass\n"}
    )
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    write_tree(
        repo, {"tinyserve/rotary.py": "def apply_rotary(x):\n    return -helper(x)\n\n\ndef helper(x):\n    return x\n"}
    )
    write_tree(repo, {"tests/test_r.py": "def t():\n    return 1\n"})
    git(repo, "commit", "-q", "-am", "change")
    diff = git(repo, "diff", "HEAD~1", "HEAD")
    assert diff_paths(diff) == {"tinyserve/rotary.py", "tests/test_r.py"}

    whole = open_index(repo, commit="HEAD", include_tests=False)
    some = open_index(repo, commit="HEAD", include_tests=False, paths=diff_paths(diff))
    assert set(some.texts) == {"tinyserve/rotary.py"}  # the test file stays out, as in the whole index
    assert some.symbols == [s for s in whole.symbols if s.file == "tinyserve/rotary.py"]
    for s in some.symbols:
        assert some.read(s) == whole.read(s) and some.callees(s) == whole.callees(s)
    assert some.symbols_for_hunks(diff) == whole.symbols_for_hunks(diff)
    head = open_index(repo, include_tests=False)
    assert {c.symbol.qualname for c in commit_changes(repo, "HEAD", diff, head) if c.symbol} == {
        "apply_rotary",
        "helper",
    }


def test_runtime_objects_map_to_symbols(engine_tree, monkeypatch):
    monkeypatch.syspath_prepend(str(engine_tree))
    for name in [m for m in list(importlib.sys.modules) if m.startswith("tinyserve")]:
        monkeypatch.delitem(importlib.sys.modules, name)
    kv = importlib.import_module("tinyserve.kv_cache")
    index = open_index(engine_tree)
    manager = kv.make_manager(4)
    assert index.symbol_for(kv.BlockManager).qualname == "BlockManager"
    assert index.symbol_for(kv.BlockManager.allocate).qualname == "BlockManager.allocate"
    assert index.symbol_for(manager.allocate).qualname == "BlockManager.allocate"  # bound method
    assert index.symbol_for(manager).qualname == "BlockManager"  # instance -> class
    assert index.symbol_for(kv.summarize).qualname == "summarize"  # lru_cache wrapper
    assert index.symbol_for(kv.BlockManager.num_free).qualname == "BlockManager.num_free"
    assert index.symbol_for(kv.BlockManager.Stats.report).file == "tinyserve/kv_cache.py"
    assert index.symbol_for("tinyserve.kv_cache:BlockManager.can_allocate").qualname == "BlockManager.can_allocate"
    assert index.symbol_for("tinyserve.kv_cache.BlockManager.Stats").qualname == "BlockManager.Stats"
    assert index.symbol_for("tinyserve/rotary.py:RotaryEmbedding.forward").start_line == 2
    assert index.symbol_for("tinyserve.nowhere:Thing") is None


def test_index_is_cached_until_a_file_changes(engine_tree):
    first = open_index(engine_tree)
    assert open_index(engine_tree) is first
    path = engine_tree / "tinyserve/rotary.py"
    path.write_text(path.read_text() + "\n\ndef added():\n    pass\n")
    second = open_index(engine_tree)
    assert second is not first and second.find("added")


def test_a_commit_s_index_parses_only_the_files_it_does_not_share(tmp_path):
    """The tree, then a commit and its parent: every unchanged file is parsed once, for all three,
    and each index holds what parsing its own files afresh gives."""
    from tools.source import index as source_index

    repo = write_tree(tmp_path / "repo", {"tinyserve/kv_cache.py": KV_CACHE, "csrc/kernels.cu": KERNELS})
    write_tree(repo, {"tinyserve/rotary.py": "def apply_rotary(x):\n    return x\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    write_tree(repo, {"tinyserve/rotary.py": "def apply_rotary(x):\n    return -x\n\n\ndef helper():\n    pass\n"})
    git(repo, "commit", "-q", "-am", "change")
    source_index._PARSED.clear()
    tree = open_index(repo)
    assert len(source_index._PARSED) == 3
    head, parent = open_index(repo, commit="HEAD"), open_index(repo, commit="HEAD~1")
    assert len(source_index._PARSED) == 4  # the parent's rotary.py alone was new
    for index in (tree, head, parent):
        fresh = [
            s for path, data in sorted(index.texts.items()) for s in parse_file(path, data, index_language(path))[0]
        ]
        assert sorted(index.symbols, key=str) == sorted(fresh, key=str)
    assert head.find("helper") and not parent.find("helper")


def test_parse_results_survive_the_process_in_the_cache_and_a_torn_entry_is_parsed_again(engine_tree, monkeypatch):
    """A later diagnosis (a new process: the in-memory parses gone) of the same tree reads each file's
    parse from DIFFDX_CACHE/parsed; what it reads is what parsing gives, and a damaged entry is
    parsed afresh, never trusted."""
    from tools.probe.checkpoints import cache_root
    from tools.source import index as source_index

    monkeypatch.setenv("DIFFDX_CACHE", str(engine_tree.parent / "cache"))
    source_index._PARSED.clear()
    first = TreeSitterIndex(engine_tree, [(p, (engine_tree / p).read_bytes()) for p in ("tinyserve/rotary.py",)])
    entries = sorted((cache_root() / "parsed").rglob("*"))
    entries = [e for e in entries if e.is_file()]
    assert len(entries) == 1
    source_index._PARSED.clear()
    monkeypatch.setattr(source_index, "parse_file", lambda *a: pytest.fail("parsed although cached"))
    again = TreeSitterIndex(engine_tree, [(p, (engine_tree / p).read_bytes()) for p in ("tinyserve/rotary.py",)])
    assert again.symbols == first.symbols and again._calls == first._calls and again.symbols
    monkeypatch.undo()
    monkeypatch.setenv("DIFFDX_CACHE", str(engine_tree.parent / "cache"))
    entries[0].write_bytes(b"torn")
    source_index._PARSED.clear()
    assert (
        TreeSitterIndex(
            engine_tree, [("tinyserve/rotary.py", (engine_tree / "tinyserve/rotary.py").read_bytes())]
        ).symbols
        == first.symbols
    )


def index_language(path: str) -> str:
    from tools.source.index import language_of

    language = language_of(path)
    assert language is not None
    return language


def test_a_prefetched_index_is_the_one_open_index_returns(engine_tree):
    """Built in a background thread while the caller does other things; open_index then waits for it
    (or finds it cached) instead of building a second one, and a file changed since is indexed again."""
    from tools.source.index import prefetch_index

    prefetch_index(engine_tree, include_tests=False)
    first = open_index(engine_tree, include_tests=False)
    prefetch_index(engine_tree, include_tests=False).join()
    assert open_index(engine_tree, include_tests=False) is first and first.find("BlockManager.allocate")
    path = engine_tree / "tinyserve/rotary.py"
    path.write_text(path.read_text() + "\n\ndef added():\n    pass\n")
    prefetch_index(engine_tree, include_tests=False).join()
    assert open_index(engine_tree, include_tests=False).find("added")


def test_module_level_code_and_unknown_files_map_to_no_symbol():
    index = TreeSitterIndex("/nowhere", [("m.py", b"X = 1\n\ndef f():\n    return X\n")])
    diff = (
        "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-X = 0\n+X = 1\n"
        "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-old\n+new\n"
    )
    changes = index.symbols_for_hunks(diff)
    assert [(c.file, c.symbol, c.lines) for c in changes] == [("README.md", None, (1,)), ("m.py", None, (1,))]


def test_indexing_speed_on_a_generated_10k_line_tree(tmp_path):
    """Printed, not asserted: the machine is shared."""
    body = "".join(
        f'class Layer{i}:\n    """Layer {i}."""\n\n    def forward(self, x):\n'
        + "".join(f"        x = helper_{j}(x) + self.scale * {j}\n" for j in range(8))
        + "        return x\n\n"
        for i in range(10)
    )
    body += "".join(f"def helper_{j}(x):\n    return x\n\n\n" for j in range(8))
    files = {f"pkg/mod_{k}.py": body for k in range(60)}
    write_tree(tmp_path, files)
    lines = sum(text.count("\n") for text in files.values())
    started = time.perf_counter()
    index = open_index(tmp_path)
    elapsed = time.perf_counter() - started
    print(f"\nindexed {lines} lines, {len(index.symbols)} symbols in {elapsed:.3f}s")
    assert lines >= 10_000 and len(index.symbols) == 60 * (20 + 8)


def test_parse_file_handles_syntax_errors():
    symbols, _ = parse_file("broken.py", b"def ok():\n    return 1\n\ndef broken(:\n", "python")
    assert "ok" in [s.qualname for s in symbols]


def test_find_by_tables_answers_as_a_scan_of_every_symbol():
    """find() looks names up in tables (a release diff asks once per changed function); on a real tree,
    Python and C++, it returns what a scan of every symbol returns, in the same order."""
    root = Path(__file__).resolve().parents[3]
    index = TreeSitterIndex(
        root,
        (
            (str(p.relative_to(root)), p.read_bytes())
            for top in ("tools/source", "tools/hypotheses", "benchmark/subjects/tinyserve/tinyserve")
            for p in sorted((root / top).rglob("*"))
            if p.suffix in (".py", ".cpp", ".cu", ".h", ".c")
        ),
    )

    def scan(name: str) -> list:
        name = name.replace("::", ".").strip(".")
        exact = [s for s in index.symbols if s.qualname == name]
        return exact or [s for s in index.symbols if s.name == name or s.qualname.endswith("." + name)]

    names = {n for s in index.symbols for n in (s.name, s.qualname, s.qualname.split(".", 1)[-1], s.qualname + "::")}
    names |= {"no_such_symbol", "", ".", "forward", "Config.__init__", "__init__"}
    assert len(index.symbols) > 500
    for name in sorted(names):
        assert index.find(name) == scan(name), name
