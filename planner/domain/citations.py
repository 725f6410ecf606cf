"""The registry of the publications kvscope cites (planner/domain/data/sources.yaml).

Every figure taken from a publication is cited where it enters the code or the output as
``[source: <id>]`` (``tag(id)``); the id resolves here to the title, owner, date, URL and the
figures used, with the hardware each was measured on. ``kvscope sources <id>`` prints one.
Figures without a publication (assumptions, rules of thumb, derivations) carry no id.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from core.errors import ConfigError

WHERE = "planner/domain/data/sources.yaml"
ID_RE = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*")
# How a publication is cited in prose, comments and output text: "[source: gke-tiered-kv-2025]".
TAG_RE = re.compile(r"\[source: ([a-z0-9]+(?:[.-][a-z0-9]+)*)\]")
_REQUIRED = ("title", "owner", "date", "url", "figures")
_FIGURE_KEYS = ("what", "value", "hardware")


@dataclass(frozen=True, slots=True)
class Figure:
    """One number kvscope uses from a publication, and the hardware it was measured on."""

    what: str
    value: str
    hardware: str


@dataclass(frozen=True, slots=True)
class Citation:
    """A registered publication: what ``[source: <id>]`` resolves to."""

    id: str
    title: str
    owner: str
    date: str
    url: str
    figures: tuple[Figure, ...]
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "owner": self.owner,
            "date": self.date,
            "url": self.url,
            "figures": [
                {"what": f.what, "value": f.value, "hardware": f.hardware} for f in self.figures
            ],
            "note": self.note,
        }


def _text(value: object, at: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{at} must be a non-empty string, got {value!r}")
    text = " ".join(str(value).split())
    if not text:
        raise ConfigError(f"{at} must be a non-empty string")
    return text


def _figure(raw: object, at: str) -> Figure:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{at} must be a mapping with {', '.join(_FIGURE_KEYS)}")
    missing = [k for k in _FIGURE_KEYS if k not in raw]
    if missing:
        raise ConfigError(f"{at}: missing {', '.join(missing)}")
    return Figure(*(_text(raw[k], f"{at}.{k}") for k in _FIGURE_KEYS))


def _citation(cid: object, raw: object) -> Citation:
    if not isinstance(cid, str) or not ID_RE.fullmatch(cid):
        raise ConfigError(f"{WHERE}: source id {cid!r} is not kebab-case (a-z, 0-9, '-', '.')")
    at = f"{WHERE}: {cid}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{at} must be a mapping")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{at}: missing {', '.join(missing)}")
    unknown = sorted(set(raw) - {*_REQUIRED, "note"})
    if unknown:
        raise ConfigError(f"{at}: unknown key(s) {', '.join(map(str, unknown))}")
    url = _text(raw["url"], f"{at}.url")
    if not url.startswith("https://"):
        raise ConfigError(f"{at}.url must be an https:// address, got {url!r}")
    figures = raw["figures"]
    if not isinstance(figures, list) or not figures:
        raise ConfigError(f"{at}.figures must be a non-empty list")
    note = raw.get("note")
    return Citation(
        cid,
        _text(raw["title"], f"{at}.title"),
        _text(raw["owner"], f"{at}.owner"),
        _text(raw["date"], f"{at}.date"),
        url,
        tuple(_figure(f, f"{at}.figures[{i}]") for i, f in enumerate(figures)),
        None if note is None else _text(note, f"{at}.note"),
    )


def parse_registry(doc: object) -> dict[str, Citation]:
    """The citations of a parsed sources.yaml document, checked (ConfigError names the entry)."""
    if not isinstance(doc, Mapping) or not doc:
        raise ConfigError(f"{WHERE} must be a non-empty mapping of source id -> entry")
    return {str(cid): _citation(cid, raw) for cid, raw in doc.items()}


@functools.cache
def registry() -> Mapping[str, Citation]:
    """Every registered publication by id, loaded once from the package data."""
    text = resources.files("planner.domain.data").joinpath("sources.yaml").read_text("utf-8")
    return parse_registry(yaml.safe_load(text))


def get_citation(citation_id: str) -> Citation:
    """The registered publication `citation_id`; ConfigError names it and the known ids."""
    citations = registry()
    try:
        return citations[citation_id]
    except KeyError:
        known = ", ".join(sorted(citations))
        raise ConfigError(f"unknown source {citation_id!r}; known: {known}") from None


def citation_url(citation_id: str | None) -> str | None:
    """The URL of a cited publication, None when nothing published is cited."""
    return None if citation_id is None else get_citation(citation_id).url


def tag(citation_id: str) -> str:
    """How `citation_id` is cited in text: "[source: <id>]" (not checked here; tests check)."""
    return f"[source: {citation_id}]"


def cited_ids(text: str) -> list[str]:
    """The citation ids cited in `text` ("[source: <id>]"), in order, without repeats."""
    return list(dict.fromkeys(TAG_RE.findall(text)))


def cite(citation_id: str) -> str:
    """One line for a reader: title, owner, date and URL of the publication."""
    c = get_citation(citation_id)
    return f"[{c.id}] {c.title}. {c.owner}, {c.date}. {c.url}"
