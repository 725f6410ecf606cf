"""Prometheus file-based service discovery for direct mode (``kvscope collect --file-sd``).

:class:`FileSD` reads JSON/YAML file_sd files named by paths or globs, as Prometheus'
``file_sd_configs`` does, and makes each listed address a Target (url from ``__scheme__``,
``__metrics_path__``, ``__param_*``; name from ``instance``; kind from ``kind`` or ``job``;
engine facts from labels). :meth:`FileSD.poll` re-parses a file when it changed (and every
``refresh_s``); a file that stops parsing keeps its last good targets.

Rules: collector/DESIGN.md#file_sd
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlsplit

import yaml

from collector.scrape import OFFLOAD_MODES, TARGET_KINDS, EngineMeta, Target, TargetKind
from core.errors import ConfigError

log = logging.getLogger(__name__)

REFRESH_S = 300.0  # Prometheus' file_sd refresh_interval default
# Prometheus' own check of file_sd_configs file names (config.go patFileSDName).
_PATTERN = re.compile(r"^[^*]*(\*[^/]*)?\.(json|yml|yaml|JSON|YML|YAML)$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # Prometheus' classic label names
_GROUP_KEYS = ("targets", "labels")
_ENGINE_LABELS = ("model", "gpu", "tensor_parallel", "offload", "pool")
_PARAM = "__param_"
_NULL = "tag:yaml.org,2002:null"
_EXPECTED = "expected a list of target groups ({targets: [host:port, ...], labels: {...}})"
MAX_NAME = 500  # targets.name / engines.source column width
MAX_CLUSTER = 200  # clusters.name column width

Signature = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


@dataclass(frozen=True, slots=True)
class Discovered:
    """One target read from a file_sd file, its cluster, and where it was read."""

    target: Target
    cluster: str
    origin: str  # "PATH: group [i] targets[j]"


@dataclass(frozen=True, slots=True)
class _Group:
    where: str
    targets: tuple[str, ...]
    labels: Mapping[str, str]


def check_pattern(pattern: str) -> str:
    """``pattern`` when Prometheus would take it as a file_sd file name, else ConfigError."""
    if not _PATTERN.match(pattern):
        raise ConfigError(
            f"{pattern!r} is not a file_sd file name or pattern: it must end in .json, .yml "
            "or .yaml, with '*' only in its last path component (e.g. sd/vllm-*.json)"
        )
    return pattern


# --------------------------------------------------------------------------- parsing


def load_file_sd(path: str, *, cluster: str) -> list[Discovered]:
    """Read and check one file_sd file (ConfigError naming file, group and key if wrong)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read file_sd file: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: file_sd file is not UTF-8 (byte {exc.start})") from exc
    return parse_file_sd(text, path=path, cluster=cluster)


def parse_file_sd(text: str, *, path: str, cluster: str) -> list[Discovered]:
    """The targets of a file_sd document; ``path``'s extension says JSON or YAML."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} "
                              f"(column {exc.colno})") from exc  # fmt: skip
        where = [f"{path}: group [{i}]" for i in range(len(doc))] if isinstance(doc, list) else []
    elif ext in (".yml", ".yaml"):
        doc, where = _yaml_doc(text, path)
    else:
        raise ConfigError(f"{path}: a file_sd file ends in .json, .yml or .yaml")
    if doc is None:  # YAML: an empty file; either: null
        return []
    if not isinstance(doc, list):
        raise ConfigError(f"{path}: {_EXPECTED}, got {_kind_of(doc)}")
    strict = ext != ".json"
    return [d for at, raw in zip(where, doc, strict=True)
            for d in _targets_of(_group(raw, at, strict=strict), cluster)]  # fmt: skip


def _group(raw: object, where: str, *, strict: bool) -> _Group:
    """One target group checked as Prometheus decodes it (``strict``: YAML's unknown keys)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping (targets, labels), got {_kind_of(raw)}")
    unknown = sorted(str(k) for k in raw if k not in _GROUP_KEYS)
    if unknown and strict:  # Prometheus decodes YAML strictly
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}: a group has targets and labels")
    if unknown:  # and JSON with Go's encoding/json, which skips them
        log.warning("file_sd: %s: key(s) %s ignored: a group has targets and labels",
                    where, ", ".join(map(repr, unknown)))  # fmt: skip
    targets = raw.get("targets")
    targets = [] if targets is None else targets
    if not isinstance(targets, list):
        raise ConfigError(
            f"{where}: 'targets' must be a list of host:port strings, got {_kind_of(targets)}"
        )
    for j, t in enumerate(targets):
        if not isinstance(t, str):
            raise ConfigError(
                f"{where} targets[{j}]: expected a host:port string, got {_kind_of(t)}"
            )
    labels = raw.get("labels")
    labels = {} if labels is None else labels
    if not isinstance(labels, dict):
        raise ConfigError(f"{where}: 'labels' must be a mapping of names to string values, "
                          f"got {_kind_of(labels)}")  # fmt: skip
    for name, value in labels.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: label {name!r} must be a string, got {_kind_of(value)}")
    values = {str(k): "" if v is None else v for k, v in labels.items()}  # Go: null is ""
    return _Group(where, tuple(targets), values)


def _kind_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    return f"the {type(value).__name__} {value!r}"  # JSON numbers and booleans


def _yaml_doc(text: str, path: str) -> tuple[object, list[str]]:
    """The YAML document with every scalar as written (Go's yaml.v2 decodes any scalar into
    a string field so: ``tensor_parallel: 2`` is "2"), null as None, and each group's place."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        said = [getattr(exc, "context", None), getattr(exc, "problem", None)]
        problem = ", ".join(str(s) for s in said if s) or str(exc)
        raise ConfigError(f"{path}{at}: invalid YAML: {problem}") from exc
    if root is None:
        return None, []
    items = root.value if isinstance(root, yaml.SequenceNode) else []
    where = [f"{path}:{n.start_mark.line + 1}: group [{i}]" for i, n in enumerate(items)]
    return _plain(root, path), where


def _plain(node: yaml.Node, path: str) -> object:
    if isinstance(node, yaml.SequenceNode):
        return [_plain(item, path) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        out: dict[str, object] = {}
        for key_node, value_node in node.value:
            at = f"{path}:{key_node.start_mark.line + 1}"
            key = _plain(key_node, path)
            if not isinstance(key, str | None):
                raise ConfigError(f"{at}: a mapping key must be a scalar, got {_kind_of(key)}")
            if (key or "") in out:  # Prometheus decodes YAML strictly: no repeats
                raise ConfigError(f"{at}: key {key or ''!r} given twice")
            out[key or ""] = _plain(value_node, path)
        return out
    return None if node.tag == _NULL else str(node.value)


# --------------------------------------------------------------------------- targets


def _targets_of(group: _Group, cluster: str) -> list[Discovered]:
    where = group.where
    for name, value in group.labels.items():
        if not _LABEL_NAME.match(name):
            raise ConfigError(
                f"{where}: {name!r} is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*)"
            )
        _utf8(value, f"{where}: label {name!r}")
    labels = {k: v for k, v in group.labels.items() if v != ""}
    scheme = labels.get("__scheme__", "http")
    if scheme not in ("http", "https"):
        raise ConfigError(f"{where}: label '__scheme__' must be http or https, got {scheme!r}")
    path = labels.get("__metrics_path__", "/metrics")
    path = quote(path if path.startswith("/") else f"/{path}", safe="/:@!$&'()*+,;=~")
    params = sorted((k.removeprefix(_PARAM), v) for k, v in labels.items()
                    if k.startswith(_PARAM) and k != _PARAM)  # fmt: skip
    query = f"?{urlencode(params)}" if params else ""
    kind = _kind(labels, where)
    home = _text(labels, "cluster", where) or cluster
    if len(home) > MAX_CLUSTER:
        raise ConfigError(f"{where}: label 'cluster' is longer than {MAX_CLUSTER} characters")
    engine = _engine(labels, where)
    instance = _text(labels, "instance", where)
    out: list[Discovered] = []
    for j, address in enumerate(group.targets):
        at = f"{where} targets[{j}]"
        _check_address(address, at)
        name = instance or address
        if len(name) > MAX_NAME:
            raise ConfigError(f"{at}: target name {name[:40]!r}... is over {MAX_NAME} characters")
        target = Target(name=name, url=f"{scheme}://{address}{path}{query}", kind=kind,
                        engine=engine)  # fmt: skip
        out.append(Discovered(target, home, at))
    return out


def _kind(labels: Mapping[str, str], where: str) -> TargetKind:
    kind = labels.get("kind")
    if kind is None:
        return "lmcache" if "lmcache" in labels.get("job", "").lower() else "vllm"
    if kind not in TARGET_KINDS:
        raise ConfigError(f"{where}: label 'kind' must be one of vllm, lmcache, got {kind!r}")
    return kind


def _engine(labels: Mapping[str, str], where: str) -> EngineMeta | None:
    """The engine labels as the targets file's ``engine`` mapping (None: none given)."""
    if not any(k in labels for k in _ENGINE_LABELS):
        return None
    tp: int | None = None  # not written: as in the targets file
    raw_tp = labels.get("tensor_parallel")
    if raw_tp is not None:
        if not (raw_tp.isascii() and raw_tp.isdigit() and int(raw_tp) >= 1):
            raise ConfigError(
                f"{where}: label 'tensor_parallel' must be an integer >= 1, got {raw_tp!r}"
            )
        tp = int(raw_tp)
    offload = labels.get("offload")
    if offload is not None and offload not in OFFLOAD_MODES:
        modes = ", ".join(OFFLOAD_MODES)
        raise ConfigError(f"{where}: label 'offload' must be one of {modes}, got {offload!r}")
    return EngineMeta(
        model=_text(labels, "model", where),
        gpu=_text(labels, "gpu", where),
        tensor_parallel=tp,
        offload=offload,
        pool=_text(labels, "pool", where),
    )


def _text(labels: Mapping[str, str], key: str, where: str) -> str | None:
    value = labels.get(key)
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{where}: label {key!r} must be a non-empty string, got {value!r}")
    return value.strip()


def _check_address(address: str, where: str) -> None:
    """Prometheus refuses an address with a '/'; we also want a host and a usable port."""
    _utf8(address, where)
    if not address:
        raise ConfigError(f"{where}: empty address: expected host:port")
    parts = urlsplit(f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    odd = any(c in "/?#@\\" or c.isspace() or not c.isprintable() for c in address)
    if odd or port == 0 or address.endswith(":") or not parts.hostname:
        raise ConfigError(
            f"{where}: {address!r} is not a valid address: expected host:port, port 1-65535 "
            "(scheme and path are the __scheme__ and __metrics_path__ labels)"
        )


def _utf8(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. JSON "\ud800"
        raise ConfigError(f"{where}: {value!r} is not valid UTF-8") from exc


# --------------------------------------------------------------------------- watching


@dataclass(frozen=True, slots=True)
class _File:
    signature: Signature | None  # as stat'ed before its last read
    targets: tuple[Discovered, ...]  # of its last good read


class FileSD:
    """The targets of every file matched by ``patterns``, re-read when they change.

    ``cluster``: the cluster of targets without a ``cluster`` label. ``monotonic`` times
    the ``refresh_s`` re-read of unchanged files. Not thread-safe: one collect loop polls it.
    """

    def __init__(
        self,
        patterns: Sequence[str],
        *,
        cluster: str,
        refresh_s: float = REFRESH_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not patterns:
            raise ConfigError("file_sd: no file name or pattern given")
        if not (math.isfinite(refresh_s) and refresh_s > 0):
            raise ConfigError(f"file_sd: refresh interval must be > 0 seconds, got {refresh_s}")
        self.patterns = tuple(check_pattern(p) for p in patterns)
        self.cluster = cluster
        self.refresh_s = refresh_s
        self._monotonic = monotonic
        self._next_refresh = -math.inf
        self._files: dict[str, _File] = {}
        self._targets: tuple[Discovered, ...] = ()
        self._reserved: frozenset[str] = frozenset()
        self._unmatched: set[str] = set()  # patterns logged as matching no file
        self._clashes: set[str] = set()  # name clashes already logged

    @property
    def targets(self) -> tuple[Discovered, ...]:
        """The targets as of the last :meth:`poll`, unique by name, in path/group/target order."""
        return self._targets

    def files(self) -> dict[str, int]:
        """Each file currently matched: how many targets it gives (before name clashes)."""
        return {path: len(f.targets) for path, f in sorted(self._files.items())}

    def poll(self, reserved: Collection[str] = ()) -> list[str]:
        """List the patterns, re-read what changed (DESIGN.md#file_sd); this poll's errors, logged.

        ``reserved``: names another source owns (the targets file's): it wins a clash.
        """
        now = self._monotonic()
        refresh = now >= self._next_refresh
        if refresh:
            self._next_refresh = now + self.refresh_s
        listed = self._list()
        errors: list[str] = []
        changed = False
        for path in listed:
            old = self._files.get(path)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # gone since the listing: the next poll sees it gone
            except OSError:
                signature = None
            else:
                signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if old is not None and old.signature == signature and not refresh:
                continue
            kept = old.targets if old is not None else ()
            try:
                found = tuple(load_file_sd(path, cluster=self.cluster))
            except FileNotFoundError:
                continue
            except ConfigError as exc:
                errors.append(str(exc))
                self._files[path] = _File(signature, kept)  # reported again once it changes
                then = f"keeping the {len(kept)} target(s) of its last good read"
                log.error("file_sd: %s; %s", exc, then if kept else "no targets from it yet")
                continue
            self._files[path] = _File(signature, found)
            changed = changed or found != kept or old is None
        for path in sorted(self._files.keys() - set(listed)):
            gone = self._files.pop(path)
            changed = True
            log.warning(
                "file_sd: %s is gone, and its %d target(s) with it", path, len(gone.targets)
            )
        if changed or self._reserved != frozenset(reserved):
            self._reserved = frozenset(reserved)
            self._merge()
        return errors

    def _list(self) -> list[str]:
        paths: dict[str, None] = {}
        for pattern in self.patterns:
            # Go's filepath.Glob, which Prometheus uses, matches dot files too.
            matched = glob.glob(pattern, include_hidden=True)
            if not matched and pattern not in self._unmatched:
                self._unmatched.add(pattern)
                log.warning("file_sd: no file matches %s (yet)", pattern)
            elif matched:
                self._unmatched.discard(pattern)
            paths.update(dict.fromkeys(matched))
        return sorted(paths)

    def _merge(self) -> None:
        chosen: dict[str, Discovered] = {}
        clashes: list[str] = []
        for path in sorted(self._files):
            for d in self._files[path].targets:
                name = d.target.name
                first = chosen.get(name)
                if name in self._reserved:
                    owner = "the targets file's target of that name"
                elif first is None:
                    chosen[name] = d
                    continue
                elif (first.target, first.cluster) != (d.target, d.cluster):
                    owner = first.origin
                else:
                    continue  # the same target listed twice: one target, as in Prometheus
                clashes.append(f"{d.origin}: name {name!r} is taken, {owner} is scraped instead")
        self._targets = tuple(chosen.values())
        for clash in clashes:
            if clash not in self._clashes:  # once, not at every re-read
                log.warning("file_sd: %s", clash)
        self._clashes = set(clashes)
