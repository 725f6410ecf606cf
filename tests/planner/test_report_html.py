"""planner/report/html.py and `kvscope report`: the self-contained HTML page of a plan.

One real SQLite store of a synthetic cluster (tests/planner/synthstore.py) whose name carries
markup; the page is rendered from it by the CLI (the store path) and from its Plan by the pure
renderer with hand-made closed-loop outcomes (the score_plans contract). Checked: the decision
and every reason with its source link, nothing loaded from elsewhere, data escaped, and, in
Debian's headless Chromium, that the page loads and every image decodes.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from core.errors import ConfigError
from kvscope.cli import app
from planner.decide.rulestate import Reason
from planner.plan import (
    CapacityCheck,
    Plan,
    PlanOutcome,
    accuracy_summary,
    build_plan,
    plan_records,
)
from planner.report import PLOT_FILES, render_report_html, write_plots
from planner.report.html import CSP, NO_SCORED_PLANS, closed_loop, closed_loop_html
from planner.report.html_parts import _link
from planner.report.plot_tier import tier_curves
from store.store import Store
from tests.chromium import CHROMIUM, chromium
from tests.planner.groupstore import fill_two_models
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url
from tests.tierdoc import SECTION

EVIL = 'prod<script>alert("x")</script>&co'
EVIL_REASON = Reason(
    "R0_test", 'a <b>reason</b> & "quotes" <img src=x onerror=alert(1)>', {"n": 1.5}, "measured"
)
RUNNER = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
CPU_TIER_PNG = "cpu_tier_hit_ratio.png"


def drawn(d: dict[str, Any]) -> list[str]:
    """The plots of a plan's JSON: the synthetic plan runs every fit and forecast; the CPU-tier
    plot needs a reuse curve in its ``cpu_tier`` section (the synthetic store has no residency
    histograms)."""
    return [n for n in PLOT_FILES if n != CPU_TIER_PNG or tier_curves(d.get("cpu_tier"))]


# Scored plans as planner.plan.outcome makes them: a real PlanOutcome, its to_dict() as the
# API passes it on, and a pending one.
SCORED = PlanOutcome(
    plan_id=12,
    cluster=EVIL,
    group="",
    created_at=1_790_000_000.0,
    horizon_end=1_790_604_800.0,
    level=0.9,
    kv_points=30,
    kv_covered=26,
    coverage=26 / 30,
    saturation="earlier",
    saturated_at=1_790_300_000.0,
    capacity=(
        CapacityCheck("native", 1.12, 1.05, 1.2, 1.1, True),
        CapacityCheck("lmcache", 1.3, 1.2, None, 1.1, False),
    ),
)
UNTOLD = replace(
    SCORED,
    plan_id=13,
    group="<img src=x onerror=alert(2)>",
    kv_points=0,
    kv_covered=0,
    coverage=None,
    saturation="unknown",
    saturated_at=None,
    capacity=(CapacityCheck("native", 1.12, 1.05, 1.2, None, None),),
)
PENDING = replace(SCORED, plan_id=14, horizon_end=1_791_000_000.0, pending=True, capacity=())
OUTCOMES: list[Any] = [SCORED, UNTOLD.to_dict(), PENDING]
SUMMARY = accuracy_summary([SCORED, UNTOLD, PENDING])


class _Links(HTMLParser):
    """Every src / href, every tag name, and the text inside <style>."""

    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.hrefs: list[str] = []
        self.tags: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_style = tag == "style"
        for name, value in attrs:
            if name == "src":
                self.srcs.append(value or "")
            elif name == "href":
                self.hrefs.append(value or "")

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def links(page: str) -> _Links:
    parser = _Links()
    parser.feed(page)
    parser.close()
    return parser


def reason_urls(plan: Plan) -> set[str]:
    d = plan.to_dict()
    return {r["source_url"] for r in d["decision"]["reasons"] if r["source_url"]}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = sqlite_url(tmp_path_factory.mktemp("report") / "k.db")
    fill_store(url, shifted_frame(3, 150, seed=11), cluster=EVIL)
    return url


@pytest.fixture(scope="module")
def plan(db: str) -> Plan:
    """The store's plan, with one more reason carrying markup (to check it is escaped)."""
    with Store(db) as store:
        built = build_plan(store, cluster=EVIL, forecast_seconds=1)
    assert built.decision is not None
    decision = dataclasses.replace(built.decision, reasons=(*built.decision.reasons, EVIL_REASON))
    return dataclasses.replace(built, decision=decision)


@pytest.fixture(scope="module")
def page(plan: Plan) -> str:
    return render_report_html(plan, OUTCOMES, SUMMARY, generated_at=1_790_800_000.0)


@pytest.fixture(scope="module")
def cli_run(db: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report-cli") / "report.html"
    r = RUNNER.invoke(
        app,
        ["report", "--db", db, "--cluster", EVIL, "--since", "all", "--out", str(out),
         "--forecast-seconds", "1"],
    )  # fmt: skip
    assert r.exit_code == 0, r.exception
    return out, r.stderr


def test_report_html_page_has_decision_score_and_every_reason(page: str, plan: Plan) -> None:
    d = plan.to_dict()
    dec = d["decision"]
    assert f"Decision: {dec['mode'].upper()}" in page
    assert f"decision score <b>{dec['score']:.2f}</b>" in page
    assert "a rule score, not a probability" in page
    assert len(dec["reasons"]) >= 3
    for r in dec["reasons"]:
        assert html.escape(r["text"]) in page, r["rule"]
        assert html.escape(r["rule"]) in page
        if r["source_url"]:
            assert f'href="{html.escape(r["source_url"])}"' in page, r["source_id"]
    assert reason_urls(plan), "the synthetic plan cites no published source"


def test_report_html_links_out_only_to_reason_sources(page: str, plan: Plan) -> None:
    found = links(page)
    assert found.srcs and all(s.startswith("data:image/png;base64,") for s in found.srcs)
    outside = {h for h in found.hrefs if not h.startswith("#") and h != "data:,"}
    assert outside == reason_urls(plan)
    assert not {"script", "iframe", "object", "embed", "base"} & set(found.tags)
    style = "".join(found.styles)
    assert style and "url(" not in style and "@import" not in style
    assert f'content="{html.escape(CSP)}"' in page and "default-src 'none'" in CSP


def test_report_html_images_are_the_plots_as_decodable_pngs(page: str, plan: Plan) -> None:
    srcs = links(page).srcs
    assert len(srcs) == len(drawn(plan.to_dict())) >= len(PLOT_FILES) - 1
    for src in srcs:
        raw = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert raw.startswith(PNG)
        with Image.open(io.BytesIO(raw)) as img:
            img.load()
            assert img.width > 300 and img.height > 200


def test_report_html_inlines_the_same_pngs_write_plots_writes(
    page: str, plan: Plan, tmp_path: Path
) -> None:
    written = write_plots(plan, tmp_path)
    assert [p.name for p in written] == drawn(plan.to_dict())
    inline = [base64.b64decode(s.split(",", 1)[1]) for s in links(page).srcs]
    assert inline == [p.read_bytes() for p in written]


def test_report_html_data_with_markup_renders_escaped(page: str) -> None:
    assert html.escape(EVIL) in page and EVIL not in page
    assert html.escape(EVIL_REASON.text) in page and EVIL_REASON.text not in page
    assert "<script" not in page.lower()
    assert "onerror=" not in page.replace("onerror=alert", "")  # only inside escaped text
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page  # the outcome's group


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "data:text/html,<b>x</b>", "//evil.example/x", "", None]
)
def test_report_html_link_to_a_non_http_source_stays_text(url: str | None) -> None:
    out = _link(url, "<src>")
    assert "<a" not in out and out == "&lt;src&gt;"


def test_report_html_link_to_an_https_source_is_escaped() -> None:
    out = _link('https://example.org/a?b=1&c="2"', "id")
    assert out == (
        '<a href="https://example.org/a?b=1&amp;c=&quot;2&quot;" rel="noopener noreferrer">id</a>'
    )


def test_report_html_numbers_carry_intervals_and_basis(page: str, plan: Plan) -> None:
    d = plan.to_dict()
    assert "(90 % interval)" in page and "(95 % interval)" in page
    for line in d["basis"]:
        assert html.escape(line) in page
    kv = d["forecast"]["kv_demand"]
    assert html.escape(kv["method"]) in page and html.escape(kv["capacity_basis"]) in page
    assert "backtest coverage" in page


def test_report_html_closed_loop_rows_from_outcomes_and_their_dicts(page: str) -> None:
    section = page[page.index('id="closed-loop"') : page.index('id="basis"')]
    assert "#12" in section and "#13" in section and "#14" in section
    assert '<span class="bad">86.7 %</span> (26 of 30 points inside; nominal 90 %)' in section
    assert '<span class="bad">earlier</span> (saturated 2026-09-25 01:33:20Z)' in section
    assert "<b>native</b>: inside: predicted 1.12 [1.05, 1.20], measured 1.10" in section
    assert '<b>lmcache</b>: <span class="bad">outside</span>: predicted 1.30' in section
    assert "measured n/a (the later windows cannot tell)" in section  # UNTOLD, from its dict
    assert "n/a: no realised point to compare" in section
    assert "pending: the horizon ends 2026-10-03 04:00:00Z" in section
    assert "2026-09-21 14:13:20Z" in section  # created_at 1.79e9 s as a UTC date
    assert "whole cluster" in section and NO_SCORED_PLANS not in section


def test_report_html_closed_loop_summary_pools_with_intervals(page: str) -> None:
    section = page[page.index('id="closed-loop"') : page.index('id="basis"')]
    assert "3 stored: 2 scored, 1 pending (horizon not passed)" in section
    kv = SUMMARY["kv_demand"]
    lo, hi = kv["interval"]["lo"], kv["interval"]["hi"]
    assert "86.7 %: 26 of 30 points, 1 plan(s); nominal 90.0 %" in section
    assert f"[{lo * 100:.1f} %, {hi * 100:.1f} %] (95 % interval, Wilson score)" in section
    assert "earlier 1, unknown 1" in section
    assert "50.0 %: 1 inside, 1 outside, 1 cannot tell (native 1/2 inside; lmcache 0/1" in section
    assert html.escape(kv["note"]) in section


def test_closed_loop_html_without_outcomes_says_no_scored_plans() -> None:
    assert NO_SCORED_PLANS in closed_loop_html([], {})


def test_closed_loop_html_outcome_without_to_dict_is_refused() -> None:
    with pytest.raises(ConfigError, match="mapping or have to_dict"):
        closed_loop_html([object()], None)  # type: ignore[list-item]


def test_closed_loop_store_without_saved_plans_scores_nothing(db: str) -> None:
    with Store(db) as store:
        assert closed_loop(store, EVIL) == ([], {})


def test_closed_loop_saved_plan_past_its_horizon_is_scored_into_the_table(
    db: str, plan: Plan, tmp_path: Path
) -> None:
    copy = tmp_path / "saved.db"
    shutil.copy(db.removeprefix("sqlite:///"), copy)
    (rec,) = plan_records(plan, cluster=EVIL, version="test", created_at=plan.window["last"])
    with Store(sqlite_url(copy)) as store:
        plan_id = store.save_plan(rec)
        outcomes, summary = closed_loop(store, EVIL, now=plan.window["last"] + 30 * 86400)
    assert [(o.plan_id, o.pending) for o in outcomes] == [(plan_id, False)]
    section = closed_loop_html(outcomes, summary)
    assert f"#{plan_id}" in section and "1 stored: 1 scored, 0 pending" in section
    assert "n/a: no realised point to compare" in section  # no window after the plan's


def test_report_html_plan_of_two_model_groups_shows_each_groups_decision(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "groups.db")
    fill_two_models(url, 60, engines=(2, 2))
    with Store(url) as store:
        plan = build_plan(store, cluster="synth", forecast_seconds=0.5)
    assert len(plan.groups) == 2 and plan.decision is None
    page = render_report_html(plan)
    assert "Decided per model group" in page and 'id="pooled"' in page
    for i, g in enumerate(plan.to_dict()["groups"]):
        dec = g["plan"]["decision"]
        assert f"<h2>Model group {html.escape(g['name'])}</h2>" in page
        assert f'id="g{i}-decision"' in page and f"Decision: {dec['mode'].upper()}" in page
        for r in dec["reasons"]:
            assert html.escape(r["text"]) in page
    found = links(page)
    assert found.srcs and all(s.startswith("data:image/png;base64,") for s in found.srcs)
    assert "not drawn (its fit or forecast did not run)" in page  # 60 windows: some fits skip


def test_report_cli_writes_page_and_prints_its_path(cli_run: tuple[Path, str], plan: Plan) -> None:
    out, stderr = cli_run
    assert f"kvscope report: wrote {out}" in stderr
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "Decision: " in page
    assert html.escape(EVIL) in page and "<script" not in page.lower()
    assert NO_SCORED_PLANS in page  # no plan saved in this store
    found = links(page)
    assert len(found.srcs) == len(drawn(plan.to_dict()))
    assert all(h.startswith(("#", "https://", "data:,")) for h in found.hrefs)


def test_report_cli_help_shows_an_example() -> None:
    r = RUNNER.invoke(app, ["report", "--help"])
    assert r.exit_code == 0 and "Example: kvscope report --db" in r.stdout


def test_report_cli_out_in_missing_directory_fails_before_work(db: str, tmp_path: Path) -> None:
    out = tmp_path / "nowhere" / "report.html"
    r = RUNNER.invoke(app, ["report", "--db", db, "--out", str(out)])
    assert isinstance(r.exception, ConfigError) and "no such directory" in str(r.exception)
    assert not out.exists()


# ── the page in a real browser ───────────────────────────────────────────────────────────

IMAGES_JS = """(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map((i) => i.decode().catch(() => null)));
  return {total: imgs.length,
          decoded: imgs.filter((i) => i.complete && i.naturalWidth > 0).length,
          widths: imgs.map((i) => i.naturalWidth),
          title: document.title, scripts: document.scripts.length,
          links: [...document.links].length};
})()"""


@contextmanager
def serving(body: bytes) -> Iterator[tuple[str, list[str]]]:
    """``body`` at http://127.0.0.1:<port>/report.html; the paths requested."""
    requested: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            ok = self.path == "/report.html"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/report.html", requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def served(cli_run: tuple[Path, str]) -> Iterator[tuple[str, list[str]]]:
    """The CLI's page at http://127.0.0.1:<port>/report.html; the paths requested."""
    with serving(cli_run[0].read_bytes()) as got:
        yield got


def load_in_chromium(url: str, profile: Path) -> tuple[dict[str, Any], str, list[Any]]:
    """The page's images and counts (IMAGES_JS), a 1200×1600 screenshot (base64 PNG) and the
    DevTools events seen."""
    with chromium(profile) as cdp:
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Network", "Log"):
            cdp.call(f"{domain}.enable", session=session)
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1200, "height": 1600, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        nav = cdp.call("Page.navigate", {"url": url}, session=session)
        assert "errorText" not in nav, nav
        cdp.wait_event("Page.loadEventFired", session=session)
        got = cdp.call(
            "Runtime.evaluate",
            {"expression": IMAGES_JS, "awaitPromise": True, "returnByValue": True},
            session=session,
        )["result"]["value"]
        shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
    return got, shot, list(cdp.events)


NEEDS_CHROMIUM = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"Debian's chromium is not installed ({CHROMIUM}): `make test` installs it",
)


@NEEDS_CHROMIUM
def test_report_html_loads_in_headless_chromium_and_every_image_decodes(
    served: tuple[str, list[str]], tmp_path: Path, plan: Plan
) -> None:
    url, requested = served
    got, shot, events = load_in_chromium(url, tmp_path / "profile")
    assert got["total"] == len(drawn(plan.to_dict())) and got["decoded"] == got["total"], got
    assert all(w > 300 for w in got["widths"]), got
    assert EVIL in got["title"] and got["scripts"] == 0 and got["links"] > 0
    # nothing but the page itself was fetched: no image, style, font or favicon from elsewhere
    fetched = {e["params"]["request"]["url"] for e in events
               if e["method"] == "Network.requestWillBeSent"}  # fmt: skip
    assert {u for u in fetched if not u.startswith("data:")} == {url}
    assert requested == ["/report.html"]
    refused = [e["params"]["entry"]["text"] for e in events if e["method"] == "Log.entryAdded"]
    assert not [t for t in refused if "Content Security Policy" in t], refused
    with Image.open(io.BytesIO(base64.b64decode(shot))) as img:
        assert img.size == (1200, 1600)
        grey = np.asarray(img.convert("L"))
        colours = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
    dark = int((grey < 128).sum())
    assert int(grey.max()) - int(grey.min()) > 100 and len(colours) > 50, "a blank screenshot"
    assert dark > 0.005 * 1200 * 1600  # text and plots drawn, not an empty page


# ── what a CPU tier would buy (tests/tierdoc.py's section on the synthetic plan) ──────────


@pytest.fixture(scope="module")
def tier_pages(plan: Plan, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Path]]:
    """The page and the written plots of the synthetic plan carrying tests/tierdoc.py's
    cpu_tier section (its JSON, as planner/plan/tier.py makes it)."""
    real = Plan.to_dict

    def with_tier(self: Plan) -> dict[str, Any]:
        return {**real(self), "cpu_tier": SECTION}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Plan, "to_dict", with_tier)
        page = render_report_html(plan, OUTCOMES, SUMMARY, generated_at=1_790_800_000.0)
        written = write_plots(plan, tmp_path_factory.mktemp("tier-plots"))
    return page, written


def _tier_section(page: str) -> str:
    start = page.index('<section id="cpu-tier">')
    return page[start : page.index("</section>", start)]


def test_report_html_cpu_tier_section_gives_each_size_with_its_model_based_range(
    tier_pages: tuple[str, list[Path]],
) -> None:
    page, _ = tier_pages
    assert '<a href="#cpu-tier">CPU tier</a>' in page
    section = _tier_section(page)
    assert "<h2>What a CPU tier would buy</h2>" in section
    assert "<b>41.0 %</b> measured, 43.0 % by the model" in section
    assert "not a confidence interval" in section
    # native 2× HBM: hit ratio, extra, re-prefill avoided, GPU time, capacity, each with range
    row = section[section.index(">2× HBM</td>") :].split("</tr>", 1)[0]
    for head, span in (("49.0 %", "46.0 %, 52.0 %"), ("+8.0 pp", "+5.0 pp, +11.0 pp"),
                       ("3,100", "1,950, 4,300"), ("1.05×", "1.03×, 1.07×")):  # fmt: skip
        assert f'>{head}<br><span class="small">[{span}]</span>' in row, head
    assert "extrapolated past the HBM eviction time" in row
    assert "Recommended: <b>62 GiB</b> (3.02× HBM) (extrapolated)" in section
    # LMCache 4× cannot tell: its range, no estimate
    lm = section[section.index("LMCache L1 pool: sizes per node pool of 2 engines") :]
    row4 = lm[lm.index(">4× HBM</td>") :].split("</tr>", 1)[0]
    assert '>range<br><span class="small">[+5.0 pp, +22.0 pp]</span>' in row4
    assert "cannot tell" in row4
    assert "+13.0 pp" not in row4
    assert "a lower bound (reuse across engines is not seen)" in lm
    assert "No recommended size." in lm
    assert "Engines without a curve: engine-4" in section


def test_report_html_cpu_tier_plot_inlined_and_written_like_the_others(
    tier_pages: tuple[str, list[Path]],
) -> None:
    page, written = tier_pages
    assert [p.name for p in written] == list(PLOT_FILES)  # every fit, and the tier's curve
    inline = [base64.b64decode(s.split(",", 1)[1]) for s in links(page).srcs]
    assert inline == [p.read_bytes() for p in written]
    with Image.open(written[-1]) as img:
        assert written[-1].name == CPU_TIER_PNG and img.width > 800 and img.height > 300
    assert "What a CPU tier would buy: prefix hit ratio vs CPU tier size" in page
    assert "dashed: extrapolated past the HBM eviction time" in page


def test_report_html_without_a_reuse_curve_says_why_the_tier_plot_is_missing(
    page: str, plan: Plan
) -> None:
    if tier_curves(plan.to_dict().get("cpu_tier")):
        pytest.skip("the synthetic plan has a reuse curve")
    assert "not drawn (no reuse curve: see What a CPU tier would buy)" in page
    assert 'id="cpu-tier"' in page and "<h2>What a CPU tier would buy</h2>" in page


@NEEDS_CHROMIUM
def test_report_html_with_cpu_tier_loads_in_headless_chromium_and_every_image_decodes(
    tier_pages: tuple[str, list[Path]], tmp_path: Path
) -> None:
    with serving(tier_pages[0].encode("utf-8")) as (url, requested):
        got, _, events = load_in_chromium(url, tmp_path / "profile")
    assert got["total"] == len(PLOT_FILES) and got["decoded"] == got["total"], got
    assert all(w > 300 for w in got["widths"]), got
    assert got["scripts"] == 0 and requested == ["/report.html"]
    refused = [e["params"]["entry"]["text"] for e in events if e["method"] == "Log.entryAdded"]
    assert not [t for t in refused if "Content Security Policy" in t], refused
