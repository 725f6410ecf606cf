"""The reader's cold path (collector/parse.py): label strings of buckets made from their
series' labels, and expositions larger than the reader's caches read without caching.

Each test compares against what the reader gives with its caches warm or without these
shortcuts, so a shortcut that changes an answer fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.exposition import LineError, parse_labels
from collector.parse import ExpositionReader
from core.errors import ParseError

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
TTFT = "vllm:time_to_first_token_seconds_bucket"

# label strings of bucket lines: valid ones, and malformed ones the le-split must not accept
BUCKET_LABELS = [
    'le="0.5"',
    'le="0.5",',
    'engine="0",le="0.5"',
    'engine="0",le="0.5",model_name="m"',
    'engine="0",le="+Inf",model_name="m",',
    'a="1",le="1e+06",z="2"',
    'le="0.5",engine="0"',
    ' engine="0" ,le="0.5"',
    'engine="0",le="x"',  # a non-numeric le: parsed, reported when a bucket line uses it
    'engine="0",le=""',
    # malformed
    ',le="0.5"',
    'engine="0",,le="0.5"',
    'engine="0", ,le="0.5"',
    'engine="0",le="0.5",,',
    'engine="0",le="0.5"x',
    'engine="0",le="0.5" ,model_name="m"',
    'engine="0",le="0.5",le="1"',
    'le="0.5",le="0.5"',
    'engine="0",le="0.5",engine="1"',
    'engine="0,le="0.5"',
    'engine="0",le="0.5',
    'engine="0",le="0.5"",b="1"',
    '__name__="x",le="0.5"',
    'engine="0",le="0.5",1b="2"',
]


def _reference(text: str) -> tuple[object, ...] | str:
    """The entry made from the whole string by the label parser, or its error."""
    try:
        pairs = parse_labels(text)
    except LineError as exc:
        return exc.reason
    full = tuple(sorted(pairs))
    le = dict(full).get("le")
    return full, tuple(p for p in full if p[0] != "le"), le


@pytest.mark.parametrize("text", BUCKET_LABELS)
def test_bucket_label_entry_equals_the_whole_parse(text: str) -> None:
    reader = ExpositionReader()
    try:
        entry = reader._label_entry(text)
    except LineError as exc:
        got: tuple[object, ...] | str = exc.reason
    else:
        got = entry[:3]
    assert got == _reference(text)


def test_bucket_label_entry_parses_the_series_labels_once() -> None:
    reader = ExpositionReader()
    for le in ("0.1", "0.5", "+Inf"):
        reader._label_entry(f'engine="0",le="{le}",model_name="m"')
    # the series' own label string is cached: each bucket's entry was made from it
    assert 'engine="0",model_name="m"' in reader._labels
    entries = [reader._labels[f'engine="0",le="{le}",model_name="m"'] for le in ("0.1", "+Inf")]
    assert entries[0][1] is entries[1][1]  # one interned series label tuple
    assert [e[4] for e in entries] == [0.1, float("inf")]


@pytest.mark.parametrize(
    "fixture", sorted(p.name for p in METRICS.glob("*.txt")), ids=lambda n: n[:-4]
)
def test_exposition_larger_than_the_caches_reads_the_same(fixture: str) -> None:
    text = (METRICS / fixture).read_text()
    small = ExpositionReader(cache_limit=8)  # every fixture has more lines: nothing cached
    warm = ExpositionReader()
    warm.read(text, "t", 0.0)
    want = warm.read(text, "t", 0.0)
    assert small.read(text, "t", 0.0) == want
    assert small.read(text, "t", 0.0) == want
    assert not small._series  # the uncached path caches no line prefix
    assert len(small._labels) <= 8


def test_federation_of_engines_reads_each_engine() -> None:
    """Many engines' samples one after the other, as a federation endpoint serves them."""
    lines = []
    for e in range(30):
        lines += [
            f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {e}',
            f'{TTFT}{{engine="{e}",le="0.5",model_name="m"}} 1',
            f'{TTFT}{{engine="{e}",le="+Inf",model_name="m"}} {e + 1}',
            f'vllm:time_to_first_token_seconds_count{{engine="{e}",model_name="m"}} {e + 1}',
            f'vllm:time_to_first_token_seconds_sum{{engine="{e}",model_name="m"}} 0.25',
            f'python_gc_objects_collected_total{{engine="{e}",generation="0"}} 5',
        ]
    text = "\n".join(lines) + "\n"
    cold = ExpositionReader(cache_limit=16).read(text, "fed", 0.0)
    assert cold == ExpositionReader().read(text, "fed", 0.0)
    running = {s.labels: s.value for s in cold.samples if s.signal == "requests_running"}
    assert len(running) == 30
    ttft = [s for s in cold.samples if s.kind == "histogram"]
    assert len(ttft) == 30
    assert all(s.bounds == (0.5, float("inf")) for s in ttft)
    assert cold.unknown_families == ("python_gc_objects_collected_total",)  # no TYPE line


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (f'{TTFT}{{engine="0",le="0.5"}} x', "bad value 'x'"),
        (f'{TTFT}{{engine="0",le="0.5"}} ', "missing value"),
        (f'{TTFT}{{engine="0",le="0.5"}}\t1', None),  # a tab before the value: accepted
        (f'{TTFT}{{engine="0",le="0.5",,}} 1', "expected a label name"),
        (f'{TTFT}{{engine="0",le="0.5"}} 1 2 3', "unexpected text"),
        (f'{TTFT}{{engine="0",le="0.5"}} 1 1700000000000', None),  # a timestamp
        ('foo{engine="0"} 1_0', "bad value"),
        ('1foo{engine="0"} 1', "missing metric name"),
    ],
)
def test_uncached_line_errors_equal_the_cached_reader(line: str, reason: str | None) -> None:
    """The same line after others, read by a reader that caches (the steady state) and by
    one whose caches are smaller than the exposition (the cold path): the same answer."""
    text = "".join(f'vllm:num_requests_running{{engine="{e}"}} 1\n' for e in range(20)) + line
    answers: list[object] = []
    for reader in (ExpositionReader(), ExpositionReader(cache_limit=4)):
        try:
            answers.append(reader.read(text + "\n", "t", 0.0))
        except ParseError as exc:
            answers.append((exc.line, exc.reason))
    assert answers[0] == answers[1]
    if reason is None:
        assert not isinstance(answers[0], tuple)
    else:
        assert isinstance(answers[0], tuple) and reason in answers[0][1], answers[0]
