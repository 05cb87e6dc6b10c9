#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fail when a docstring, a comment or a doc names a repository path that does not exist.

Files move (issue 31 moved the model parts to `model_executor/layers/`), and prose that names the old
place keeps reading as true. This check reads every backticked token in

- the docs: `README.md` and `docs/**/*.md` (fenced code blocks are skipped: they hold commands and output);
- the module, class and function docstrings and the `#` comments of the Python files under
  `vllm_omni_token2wav/`, `tests/`, `tools/` and `benchmarks/`,

decides whether the token names a repository path, and if so looks for it; and every folder or file that
`CODEOWNERS` names. Usage:

    python tools/check_doc_paths.py            # the whole tree (what pre-commit and CI run)
    python tools/check_doc_paths.py FILE...    # only these files (paths still resolve against the tree)

It prints `file:line: `path` does not exist` per dead path and exits 1 when there is one.

What counts as a path (few false positives matter more than catching every spelling):
- one word (a token with spaces is a command: only its `.py`/`.sh` words that contain `/` are checked);
- ends in a known suffix (`.py`, `.md`, `.yaml`, `.json`, `.sh`, ...), optionally followed by `:symbol`,
  `:line` or `::test`; or ends in `/` (a folder); or has a `/` (`layers/flow`, `platforms/device_graphs`,
  `layers/flow/batched.FlowRowState`: a module, or a module and one of its names); one `{a,b}` group
  is expanded (`layers/flow/{euler,checks}.py` names two files);
- not upstream or installed code (`vllm/`, `vllm_omni/`, `vllm_ascend/`, `cosyvoice/`, `stepaudio2/`, ...:
  write upstream paths with their package's name first), not a URL, route, MIME type, glob, `<placeholder>`,
  `$VAR`/`~`/absolute path, and not a model snapshot's or output's runtime folder
  (`RUNTIME_PREFIXES`: `M/`, `assets/token2wav`, `out/`);
- ours: its first folder is a folder of this tree, today or in git history (so `layers/flow/<name>.py` and a
  removed `cosyvoice2/flow/<name>.py` are checked, CosyVoice's `hifigan/generator.py` is not); a bare name
  without a `/` is checked only when git history removed or renamed a file or folder of that name and
  none is left (a bare `config.yaml` or `engine.py` is as often a model snapshot's or upstream's file).

Where a path is looked for (any hit is enough): the repository root, `vllm_omni_token2wav/`,
`vllm_omni_token2wav/model_executor/`, `vllm_omni_token2wav/model_executor/models/`,
`vllm_omni_token2wav/benchmarks/`, `tests/`, `tests/model_executor/`, `tests/model_executor/models/`, then
the file's own folder and each folder above it (docs write `token2wav_core/core.py` relative to models/,
code writes `standin/model_dirs.py`). `model_executor/layers/` is deliberately not a root: write
`layers/flow/` so that `flow/` cannot silently mean another family's flow. `a/.../b.py` exists when a path
starts with `a/` and ends with `/b.py`.

Opting out: a line that carries `doc-paths: ignore` (in a `#` comment, or `<!-- doc-paths: ignore -->` in
Markdown) is not checked; use it for a path that must stay as written (a removed file named on purpose).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vllm_omni_token2wav"
CODE_FOLDERS = (PACKAGE, "tests", "tools", "benchmarks")
# Folders that docs and docstrings write paths relative to (besides the file's own folders).
SEARCH_ROOTS = (
    "",
    PACKAGE,
    f"{PACKAGE}/model_executor",
    f"{PACKAGE}/model_executor/models",
    f"{PACKAGE}/benchmarks",
    "tests",
    "tests/model_executor",
    "tests/model_executor/models",
)
PATH_SUFFIXES = (
    ".py",
    ".pyi",
    ".md",
    ".yaml",
    ".yml",
    ".json",
    ".jsonl",
    ".sh",
    ".toml",
    ".txt",
    ".lst",
    ".cfg",
    ".ini",
)
# Upstream and installed code: named often, never ours to check.
UPSTREAM_PREFIXES = (
    "vllm/",
    "vllm_omni/",
    "vllm_ascend/",
    "vllm-omni/",
    "cosyvoice/",
    "stepaudio2/",
    "s3tokenizer/",
    "transformers/",
    "torch/",
    "torchaudio/",
    "onnxruntime/",
    "matcha/",
    "third_party/",
    "site-packages/",
)
# Folders that exist only at run time (model snapshots, output folders, caches).
RUNTIME_PREFIXES = (
    "M/",
    "out/",
    "out_dir/",
    "work_dir/",
    "generated/",
    "assets/token2wav",
    "assets/HT_ref_audio",
)
# Characters that make a token a pattern, a placeholder or an expression rather than one path.
NOT_A_PATH_CHARS = frozenset("*<>{}[]|$~()=,+\\'\"!?@%^&;")
IGNORE_MARKER = "doc-paths: ignore"
TICKS = re.compile(r"(?<!`)(`+)([^`\n]+?)\1(?!`)")
LOCATION_TAIL = re.compile(r"(::?[A-Za-z_][\w.]*|:\d+(?:[-,]\d+)*)$")
BRACES = re.compile(r"\{([\w.\-]+(?:,[\w.\-]+)+)\}")
MIME = re.compile(r"(audio|video|image|text|application)/[\w.+-]+")
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Finding:
    """One dead path: where it is written and the token as written."""

    file: str
    line: int
    path: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.path}` does not exist"


@dataclass
class Tree:
    """The repository's files and folders, read once, and the names that git history says were ours."""

    root: Path
    paths: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    folder_names: set[str] = field(default_factory=set)
    gone_names: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, root: Path) -> Tree:
        tree = cls(root)
        files = _listed_files(root)
        folders: set[str] = set()
        for rel in files:
            parts = rel.split("/")
            for i in range(1, len(parts)):
                folders.add("/".join(parts[:i]))
        tree.paths = sorted(set(files) | {f + "/" for f in folders})
        tree.names = {p.rstrip("/").rsplit("/", 1)[-1] for p in tree.paths}
        tree.folder_names = {f.rsplit("/", 1)[-1] for f in folders}
        tree.gone_names = {part for rel in _removed_paths(root) for part in rel.split("/")} - tree.names
        return tree

    def is_ours(self, token: str) -> bool:
        """Whether a path-looking token names this repository's tree (today's or a removed file's).

        A bare name is checked only when git history removed or renamed a file or folder of that name and
        none is left (`standin.py`): bare `config.yaml` or `engine.py` are as often a model snapshot's or
        upstream's file. A longer path is checked when its first folder is one of ours, today or in history
        (`layers/flow/<name>.py`, `cosyvoice2/flow/<name>.py`), so `hifigan/generator.py` (CosyVoice's) is
        left alone.
        """
        parts = [p for p in token.rstrip("/").split("/") if p not in ("", "..")]
        if not parts:
            return False
        if len(parts) == 1 and not token.startswith(".."):
            return parts[0] in self.gone_names
        first = parts[0].partition(".")[0] if len(parts) == 1 else parts[0]
        return token.startswith("..") or first in self.folder_names or first in self.gone_names

    def exists(self, token: str, anchors: list[str]) -> bool:
        """Whether `token` names a file or folder under one of `anchors` (folders relative to the root)."""
        clean = token.rstrip("/")
        want_folder = token.endswith("/")
        if "..." in clean:
            return any(self._elided_exists(anchor, clean) for anchor in anchors)
        if "/" not in clean and clean in (self.folder_names if want_folder else self.names):
            return True
        spellings = [clean]
        if not want_folder:
            # `platforms/device_graphs` (a module) and `layers/flow/batched.FlowRowState` (a module's symbol).
            head, _, last = clean.rpartition("/")
            module = (head + "/" if head else "") + last.partition(".")[0]
            spellings += [clean + ".py", module + ".py"]
        return any(self._is(anchor, rel, want_folder) for anchor in anchors for rel in spellings)

    def _is(self, anchor: str, rel: str, want_folder: bool) -> bool:
        target = (self.root / anchor / rel) if anchor else (self.root / rel)
        if not target.resolve().is_relative_to(self.root.resolve()):
            return False  # outside the repository: what a fresh clone has not (the same answer on every checkout)
        return target.is_dir() if want_folder else target.exists()

    def _elided_exists(self, anchor: str, token: str) -> bool:
        head, _, tail = token.partition("...")
        head, tail = head.strip("/"), tail.strip("/")
        prefix = "/".join(p for p in (anchor, head) if p)
        return any(
            (not prefix or p.startswith(prefix + "/")) and (not tail or p.rstrip("/").endswith("/" + tail))
            for p in self.paths
        )


def _listed_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files that exist in the working tree."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [rel for rel in out.splitlines() if (root / rel).exists()]


def _removed_paths(root: Path) -> list[str]:
    """Paths that a commit deleted or renamed away (empty when git history is not available)."""
    proc = subprocess.run(
        ["git", "log", "--name-status", "--format=", "--diff-filter=DR", "-M", "HEAD"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return [line.split("\t")[1] for line in proc.stdout.splitlines() if line.count("\t") >= 1]


def candidate_paths(token: str) -> list[str]:
    """The words of one backticked token that should name a repository path (usually 0 or 1)."""
    token = token.strip()
    if not token:
        return []
    if any(ch.isspace() for ch in token):
        words = token.split()
        return [
            w
            for prev, w in zip(["", *words[:-1]], words, strict=True)
            if "/" in w and w.endswith((".py", ".sh")) and not prev.startswith("-") and _plain(w)
        ]
    token = LOCATION_TAIL.sub("", token) if _has_suffix(LOCATION_TAIL.sub("", token)) else token
    out = []
    for spelled in _expand_braces(token):
        if _plain(spelled) and (_has_suffix(spelled) or "/" in spelled):
            out.append(spelled)
    return out


def _expand_braces(token: str) -> list[str]:
    """`layers/flow/{euler,checks}.py` -> both paths (one `{a,b}` group; other tokens as they are)."""
    match = BRACES.search(token)
    if match is None or BRACES.search(token, match.end()) is not None:
        return [token]
    return [token[: match.start()] + choice + token[match.end() :] for choice in match.group(1).split(",")]


def _has_suffix(token: str) -> bool:
    return token.endswith(PATH_SUFFIXES) and len(PurePosixPath(token).stem) > 0 and not token.startswith(".")


def _plain(token: str) -> bool:
    """False for URLs, globs, placeholders, expressions, upstream code and runtime folders."""
    if "://" in token or token.startswith(("/", "-", "#")) or "…" in token:
        return False
    if any(ch in NOT_A_PATH_CHARS for ch in token):
        return False
    if token.startswith(UPSTREAM_PREFIXES) or "site-packages" in token or token.startswith(RUNTIME_PREFIXES):
        return False
    if token.startswith(".") and not token.startswith(("../", ".ci/", ".pre-commit", ".github/")):
        return False
    if "//" in token or token.count("...") > 1:
        return False
    return all(re.fullmatch(r"[\w.\-]*", part) for part in token.split("/"))


def is_checked(token: str, tree: Tree) -> bool:
    """Whether a path-looking token is specific enough to check (see the module docstring)."""
    if MIME.fullmatch(token):
        return False
    return tree.is_ours(token)


def doc_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of a Markdown file outside fenced code blocks."""
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, line


def code_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each docstring line and each comment of a Python file."""
    source = path.read_text(encoding="utf-8")
    if "`" not in source:
        return
    try:
        module = ast.parse(source)
    except SyntaxError:
        return
    # Statements only (docstrings open a module, class or function body): far cheaper than ast.walk.
    stack: list[ast.AST] = [module]
    while stack:
        node = stack.pop()
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + offset, line
        for name in ("body", "orelse", "finalbody", "handlers"):
            children = getattr(node, name, None)
            if isinstance(children, list):
                stack.extend(child for child in children if isinstance(child, (ast.stmt, ast.excepthandler)))
    # Comments: tokenize only files where a `#` precedes a backtick on some line.
    if not any("#" in line and "`" in line.split("#", 1)[1] for line in source.splitlines()):
        return
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def _ignored_lines(path: Path) -> set[int]:
    text = path.read_text(encoding="utf-8")
    return {n for n, line in enumerate(text.splitlines(), 1) if IGNORE_MARKER in line}


def check_codeowners(rel: str, tree: Tree) -> list[Finding]:
    """Folders and files that `CODEOWNERS` gives an owner but that are gone (globs are not checked)."""
    findings: list[Finding] = []
    for number, line in enumerate((tree.root / rel).read_text(encoding="utf-8").splitlines(), 1):
        pattern = line.split("#", 1)[0].split()[:1]
        if not pattern or any(ch in pattern[0] for ch in "*?[") or IGNORE_MARKER in line:
            continue
        if not (tree.root / pattern[0].lstrip("/")).exists():
            findings.append(Finding(rel, number, pattern[0]))
    return findings


def check_file(rel: str, tree: Tree) -> list[Finding]:
    """Dead paths in one file (`rel` relative to the tree's root)."""
    if PurePosixPath(rel).name == "CODEOWNERS":
        return check_codeowners(rel, tree)
    path = tree.root / rel
    texts = doc_texts(path) if rel.endswith(".md") else code_texts(path)
    own = PurePosixPath(rel).parent
    anchors = list(SEARCH_ROOTS) + [str(p) for p in [own, *own.parents] if str(p) != "."]
    ignored = _ignored_lines(path)
    findings: list[Finding] = []
    for number, text in texts:
        if number in ignored or IGNORE_MARKER in text:
            continue
        for match in TICKS.finditer(text):
            for token in candidate_paths(match.group(2)):
                if is_checked(token, tree) and not tree.exists(token, anchors):
                    findings.append(Finding(rel, number, token))
    return findings


def checked_files(tree: Tree) -> list[str]:
    """The docs and Python files whose backticked paths this tool checks."""
    out = []
    for rel in tree.paths:
        if rel.endswith("/"):
            continue
        if rel in ("README.md", "CODEOWNERS") or (rel.startswith("docs/") and rel.endswith(".md")):
            out.append(rel)
        elif rel.endswith(".py") and rel.split("/", 1)[0] in CODE_FOLDERS:
            out.append(rel)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("files", nargs="*", help="check only these files (default: every doc and Python file)")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    tree = Tree.read(root)
    if args.files:
        files = [
            str(Path(f).resolve().relative_to(root))
            for f in args.files
            if f.endswith((".py", ".md")) or Path(f).name == "CODEOWNERS"
        ]
    else:
        files = checked_files(tree)
    findings = [finding for rel in files for finding in check_file(rel, tree)]
    for finding in findings:
        print(finding)
    if findings:
        print(
            f"{len(findings)} backticked path(s) do not exist: fix the path, or add `{IGNORE_MARKER}` on the line "
            "if it must stay as written",
            file=sys.stderr,
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
