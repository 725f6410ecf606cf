"""The bundled scenario files (package data) and how a scenario argument finds its file.

`kvscope simulate SCENARIO` and `kvscope demo --scenario SCENARIO` take a file path or the
name of a bundled scenario, with or without ``.yaml`` (``shared_prefix`` or
``shared_prefix.yaml``); an existing file wins over a bundled name. `kvscope simulate --list`
prints the names. A file a scenario names by a relative path (trace_replay.yaml:
trace.jsonl) lies beside it in this directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from core.errors import ConfigError

SUFFIX = ".yaml"


def bundled_names() -> tuple[str, ...]:
    """The names of the bundled scenarios (their file names without ``.yaml``), sorted."""
    return tuple(
        sorted(
            entry.name.removesuffix(SUFFIX)
            for entry in resources.files(__name__).iterdir()
            if entry.is_file() and entry.name.endswith(SUFFIX)
        )
    )


def bundled_name(arg: str | Path) -> str | None:
    """The bundled scenario ``arg`` names (a bare name, ``.yaml`` optional), else None."""
    text = str(arg)
    if not text or Path(text).name != text:  # a path with a directory part is no name
        return None
    name = text.removesuffix(SUFFIX)
    return name if name in bundled_names() else None


@contextmanager
def bundled_directory() -> Iterator[Path]:
    """This package's directory on disk while the context is open (importlib.resources.as_file
    of the whole directory, so that a relative trace path resolves beside its scenario; a
    package on the file system, as every pip install is, is used in place)."""
    with resources.as_file(resources.files(__name__)) as directory:
        yield Path(directory)


@contextmanager
def scenario_file(arg: str | Path) -> Iterator[Path]:
    """The scenario file ``arg`` means, readable while the context is open.

    An existing file (or directory, which the reader then refuses) is ``arg`` itself; else a
    bundled name is that file in bundled_directory(). A missing path (with a directory part)
    is yielded as is for the reader to refuse; any other bare name raises ConfigError
    listing the bundled scenarios.
    """
    path = Path(arg)
    if path.exists():
        yield path
        return
    name = bundled_name(arg)
    if name is not None:
        with bundled_directory() as directory:
            yield directory / f"{name}{SUFFIX}"
        return
    if path.name != str(arg):  # a path: the reader's "cannot read scenario" names it
        yield path
        return
    names = ", ".join(bundled_names())
    raise ConfigError(f"{arg}: no such scenario file nor bundled scenario (bundled: {names})")
