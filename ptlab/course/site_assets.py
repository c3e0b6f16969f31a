"""The course website's stylesheet and script (no asset from a CDN: the site works opened from disk)."""
from __future__ import annotations

from pygments.formatters import HtmlFormatter

CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --soft: #f6f8fa; --accent: #0b5cad; --bug: #c0392b;
        --fix: #1e8449; --side: 15rem; --toc: 14rem; }
* { box-sizing: border-box; }
html { font-size: 16px; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.55;
       font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
a { color: var(--accent); }
code, pre, kbd { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace; }
code { font-size: 0.9em; background: var(--soft); padding: 0.1em 0.3em; border-radius: 4px; overflow-wrap: anywhere; }
pre { font-size: 13px; line-height: 1.4; overflow-x: auto; padding: 0.6em 0.8em; margin: 0.4em 0;
      background: var(--soft); border-radius: 6px; }
pre code { background: none; padding: 0; overflow-wrap: normal; }
img { max-width: 100%; height: auto; }
.topbar { position: sticky; top: 0; z-index: 5; display: flex; gap: 1rem; align-items: center; flex-wrap: wrap;
          padding: 0.5rem 1rem; background: #24292f; color: #fff; }
.topbar .brand { color: #fff; font-weight: 700; text-decoration: none; font-size: 1.1rem; }
.topbar .tagline { color: #c9d1d9; font-size: 0.9rem; flex: 1 1 12rem; }
.topbar form { display: flex; gap: 0.3rem; flex: 0 1 20rem; min-width: 0; }
.topbar input { flex: 1 1 auto; min-width: 0; padding: 0.35rem 0.5rem; border-radius: 6px; border: 1px solid #57606a;
                font-size: 0.95rem; }
.topbar button { padding: 0.35rem 0.7rem; border-radius: 6px; border: 0; background: #0969da; color: #fff; }
.layout { display: grid; grid-template-columns: var(--side) minmax(0, 1fr) var(--toc); gap: 1.5rem;
          max-width: 100rem; margin: 0 auto; padding: 0 1rem; }
.sidebar { grid-column: 1; grid-row: 1 / span 2; position: sticky; top: 3.2rem; align-self: start;
           max-height: calc(100vh - 3.5rem); overflow-y: auto;
           padding: 1rem 0; font-size: 0.92rem; }
.sidebar h2, .toc h2, .toc summary { font-size: 0.8rem; text-transform: uppercase; letter-spacing: 0.04em;
                                     color: var(--muted); margin: 1rem 0 0.3rem; }
.sidebar ul, .toc ul { list-style: none; padding: 0; margin: 0; }
.sidebar li a, .toc li a { display: block; padding: 0.2rem 0.5rem; border-radius: 4px; text-decoration: none;
                           color: var(--ink); }
.sidebar li a:hover, .toc li a:hover { background: var(--soft); }
.sidebar li a[aria-current="page"] { background: #ddf4ff; font-weight: 600; }
.sidebar > summary, .toc > summary { cursor: pointer; }
.sidebar > summary { display: none; }
.toc { grid-column: 3; grid-row: 1; position: sticky; top: 3.2rem; align-self: start;
       max-height: calc(100vh - 3.5rem); overflow-y: auto;
       padding: 1rem 0; font-size: 0.85rem; }
.toc summary { cursor: pointer; }
.toc li.level-3 a { padding-left: 1.2rem; color: var(--muted); }
main { grid-column: 2; grid-row: 1 / span 2; min-width: 0; padding: 1rem 0 3rem; }
main .page { max-width: 60rem; }
main h1 { font-size: 1.9rem; line-height: 1.25; }
main h2 { margin-top: 2rem; padding-bottom: 0.2rem; border-bottom: 1px solid var(--line); }
main h1, main h2, main h3, main h4 { overflow-wrap: anywhere; }
[id] { scroll-margin-top: 3.8rem; }   /* an anchor's target is not hidden under the sticky top bar */
main p, main li { overflow-wrap: anywhere; }
.anchor-link { margin-left: 0.3rem; text-decoration: none; color: var(--line); font-size: 0.8em; visibility: hidden; }
:hover > .anchor-link, .anchor-link:focus { visibility: visible; }
.table-scroll { overflow-x: auto; margin: 0.6rem 0; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border: 1px solid var(--line); padding: 0.3rem 0.5rem; text-align: left; vertical-align: top; }
th { background: var(--soft); }
.prevnext { display: flex; justify-content: space-between; gap: 1rem; flex-wrap: wrap; margin-top: 3rem;
            padding-top: 1rem; border-top: 1px solid var(--line); max-width: 56rem; }
.prevnext a { text-decoration: none; max-width: 48%; }
.prevnext .next { margin-left: auto; text-align: right; }
.prevnext small { display: block; color: var(--muted); }
.note { border-left: 4px solid var(--accent); background: #f0f7ff; padding: 0.5rem 0.8rem; margin: 0.8rem 0;
        font-size: 0.92rem; }
/* notebook cells (nbconvert's basic template) */
.cell { margin: 0.5rem 0; }
.prompt { display: none; }
.input_area { border: 1px solid var(--line); border-radius: 6px; background: var(--soft); }
.input_area pre { margin: 0; background: none; }
.output_wrapper { margin: 0.2rem 0 0.6rem; }
.output_area pre { background: #fff; border-left: 3px solid var(--line); border-radius: 0; }
.output_area .output_stderr pre { background: #fff5f5; }
.output_png img { display: block; margin: 0.3rem 0; }
.output_html { overflow-x: auto; }
.ansi-red-fg { color: #c0392b; } .ansi-green-fg { color: #1e8449; } .ansi-yellow-fg { color: #9a6700; }
.ansi-blue-fg { color: #0b5cad; } .ansi-cyan-fg { color: #0e7490; } .ansi-bold { font-weight: 700; }
/* a pitfall as recorded, where the notebook has a live widget */
.pitfall-card { border: 1px solid var(--line); border-radius: 8px; padding: 0.7rem 0.9rem; margin: 0.8rem 0;
                background: #fff; }
.pitfall-card .pitfall-title { font-weight: 700; font-size: 1.05rem; margin: 0 0 0.3rem; }
.pitfall-card .meta { color: var(--muted); font-size: 0.85rem; }
.pitfall-code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px;
                line-height: 1.35; overflow-x: auto; border: 1px solid var(--line); border-radius: 6px;
                padding: 0.3rem 0; margin: 0.5rem 0; background: var(--soft); }
.pitfall-code div { white-space: pre; padding-left: 0.5rem; border-left: 3px solid transparent; }
.pitfall-code .BUG { background: #fdecea; border-left-color: var(--bug); }
.pitfall-code .FIX { background: #eafaf1; border-left-color: var(--fix); }
.recorded { font-size: 0.88rem; color: var(--muted); margin: 0.5rem 0 0.2rem; }
.recorded b { color: var(--ink); }
.widget-note { color: var(--muted); font-size: 0.85rem; font-style: italic; margin: 0.2rem 0; }
.badge { display: inline-block; font-size: 0.75rem; padding: 0 0.4rem; border-radius: 999px; background: #ddf4ff;
         color: #0a3069; margin-left: 0.3rem; }
.search-results li { margin: 0.8rem 0; list-style: none; }
.search-results { padding: 0; }
.search-results .where { color: var(--muted); font-size: 0.85rem; }
.search-results mark { background: #fff8c5; }
@media (max-width: 1200px) {
  .layout { grid-template-columns: var(--side) minmax(0, 1fr); }
  .toc { grid-column: 2; grid-row: 1; position: static; max-height: none; padding-bottom: 0; }
  main { grid-column: 2; grid-row: 2; }
}
@media (max-width: 820px) {
  .layout { display: block; padding: 0 0.8rem; }
  .sidebar { position: static; max-height: none; padding: 0.5rem 0; border-bottom: 1px solid var(--line); }
  .sidebar > summary { display: list-item; font-size: 0.8rem; text-transform: uppercase; letter-spacing: 0.04em;
                       color: var(--muted); }
  .sidebar ul { display: flex; flex-wrap: wrap; gap: 0.1rem 0.3rem; }
  .sidebar li a { padding: 0.15rem 0.4rem; }
  .toc { position: static; max-height: none; }
  main h1 { font-size: 1.5rem; }
  .topbar .tagline { display: none; }
}
"""


def stylesheet() -> str:
    """The site's CSS: layout, notebook cells, pitfall cards, and pygments' colours for code."""
    return CSS + HtmlFormatter(style="default").get_style_defs(".highlight")


# Search runs in the browser over search-index.js (a plain <script>, so it works from file:// where fetch()
# of a JSON file is refused). Every word of the query must occur in a section; heading hits rank first.
JS = r"""
(function () {
  "use strict";
  function words(q) { return q.toLowerCase().split(/\s+/).filter(function (w) { return w.length > 0; }); }
  function escapeHtml(s) {
    return s.replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;"}[c];
    });
  }
  function search(query) {
    var ws = words(query), hits = [];
    if (!ws.length || !window.PTLAB_SEARCH) { return hits; }
    window.PTLAB_SEARCH.forEach(function (entry) {
      var head = (entry.p + " " + entry.s).toLowerCase(), body = entry.x.toLowerCase(), score = 0;
      for (var i = 0; i < ws.length; i++) {
        var inHead = head.indexOf(ws[i]) >= 0, inBody = body.indexOf(ws[i]) >= 0;
        if (!inHead && !inBody) { return; }
        score += (inHead ? 10 : 0) + (inBody ? 1 : 0);
      }
      hits.push({entry: entry, score: score});
    });
    hits.sort(function (a, b) { return b.score - a.score; });
    return hits;
  }
  function snippet(text, ws) {
    var lower = text.toLowerCase(), at = lower.indexOf(ws[0]);
    var start = Math.max(0, at - 80), piece = text.slice(start, start + 240);
    var html = escapeHtml(piece);
    ws.forEach(function (w) {
      var re = new RegExp("(" + w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + ")", "ig");
      html = html.replace(re, "<mark>$1</mark>");
    });
    return (start > 0 ? "… " : "") + html + (start + 240 < text.length ? " …" : "");
  }
  function showResults() {
    var box = document.getElementById("search-results");
    if (!box) { return; }
    var query = new URLSearchParams(window.location.search).get("q") || "";
    var input = document.querySelector(".topbar input[name=q]");
    if (input) { input.value = query; }
    var hits = search(query), ws = words(query), root = document.body.dataset.root || "";
    var status = document.getElementById("search-status");
    if (!query) { status.textContent = "Type a word in the search box above."; return; }
    status.textContent = hits.length + (hits.length === 1 ? " section matches " : " sections match ") +
      "\u201c" + query + "\u201d" + (hits.length > 50 ? " (the first 50 are shown)" : "") + ".";
    box.innerHTML = hits.slice(0, 50).map(function (h) {
      var e = h.entry;
      return "<li><a href=\"" + root + e.u + "\">" + escapeHtml(e.s || e.p) + "</a>" +
        "<div class=\"where\">" + escapeHtml(e.p) + "</div><div>" + snippet(e.x, ws) + "</div></li>";
    }).join("");
  }
  function narrowToc() {
    var toc = document.querySelector("details.toc"), nav = document.querySelector("details.sidebar");
    if (toc && window.matchMedia("(max-width: 1200px)").matches) { toc.open = false; }
    if (nav && window.matchMedia("(max-width: 820px)").matches) { nav.open = false; }
  }
  document.addEventListener("DOMContentLoaded", function () { narrowToc(); showResults(); });
})();
"""
