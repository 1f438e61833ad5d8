"""The report as one self-contained HTML page: inline CSS, SVG and a few lines of script, no
network. Without script every round's cards are shown, reached by anchors; with it a select
shows one round at a time (the latest first).

Stable hooks for tests and scripts: `section.run[data-run]`, `figure.chart[data-title]`,
`tr.warning`, `table.criteria-diff tr[data-round]`, `section.round[data-round]`, and the
card hooks of `cards_html`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrubric.report.cards_html import card_block, number, query_block, text
from jaxrubric.report.charts import charts, short_name
from jaxrubric.report.criteria import top_criteria
from jaxrubric.report.data import Evaluation, Inspected, Run
from jaxrubric.report.svg import colour, dash, line_chart

KIND_TITLES = {"training": "training run", "world": "toy world",
               "evaluate": "jaxrubric evaluate output"}

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;max-width:1500px;padding:0 16px;color:#222}
h1{font-size:22px}h2{border-bottom:2px solid #ccc;margin-top:32px}h3{margin-top:24px}
h4{margin:0 0 6px}h5{margin:10px 0 4px;font-size:13px}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12px/1.35 ui-monospace,monospace}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:2px 6px;
vertical-align:top}th{background:#f4f4f4;text-align:left}.num{text-align:right}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid #e3e3e3;
padding:6px;width:532px}figcaption{font-weight:600}.note{color:#666;font-size:12px;margin:2px 0}
.line-chart .grid{stroke:#eee}.line-chart .axis{stroke:#888}.line-chart .tick{font-size:10px;
fill:#555}.legend{list-style:none;padding:0;margin:2px 0;font-size:12px}.legend li{display:
inline-block;margin-right:10px}.card{border:1px solid #ccc;border-radius:4px;padding:8px;
margin:10px 0;background:#fcfcfc}.prompt{background:#eef3fb;padding:4px;margin-bottom:6px}
td.text{max-width:520px}.grid td.criterion{max-width:520px}td.verdict{text-align:center;
min-width:28px;font-size:12px}td.pass{background:#b9e5b2}td.fail{background:#f3b9b2}
.badge{font-size:11px;padding:0 5px;border-radius:3px}.badge.valid{background:#b9e5b2}
.badge.invalid{background:#f3b9b2}.fact{font-weight:normal;color:#555;font-size:12px;
margin-left:6px}.unrewarded{color:#999}.warning td{background:#fff6dd}
.round-select{display:none}.js .round-select{display:inline}nav.toc a,nav.round-nav a{
margin-right:8px}ol.top{margin:0;padding-left:18px}.entered{color:#17692b}.left{color:#a1271b}
"""

SCRIPT = """
document.body.classList.add('js');
for (const select of document.querySelectorAll('select.round-select')) {
  const rounds = document.querySelectorAll(
    '.rounds[data-run="' + select.dataset.run + '"] > section.round');
  const show = () => rounds.forEach(r => {
    r.hidden = select.value !== 'all' && r.dataset.round !== select.value; });
  select.addEventListener('change', show);
  for (const link of document.querySelectorAll(
      'nav.round-nav[data-run="' + select.dataset.run + '"] a[data-round]'))
    link.addEventListener('click', () => { select.value = link.dataset.round; show(); });
  show();
}
"""


def render(inspected: Inspected, top: int = 10) -> str:
    """The whole page; `top`: how many of a card round's criteria the round-to-round diff
    lists."""
    title = f"jaxrubric inspect: {inspected.folder.name or inspected.folder}"
    body = [(f"<h1>{text(title)}</h1><p>{text(KIND_TITLES[inspected.kind])} "
             f"<code>{text(inspected.folder)}</code></p>")]
    if inspected.evaluation is not None:
        body.append(evaluation_section(inspected.evaluation))
    else:
        body.append(runs_section(inspected.runs, top))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{text(title)}'
            f'</title><style>{STYLE}</style></head><body>{"".join(body)}'
            f"<script>{SCRIPT}</script></body></html>\n")


def run_id(index: int, name: str) -> str:
    """An HTML id for a run: its index and its name's letters and digits."""
    return f"run{index}-" + (re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "run")


def runs_section(runs: Sequence[Run], top: int) -> str:
    """The runs' curves (overlaid), their warnings, then per run its criteria and cards."""
    ids = [run_id(i, run.name) for i, run in enumerate(runs)]
    toc = " ".join(f'<a href="#{i}">{text(run.name)}</a>' for i, run in zip(ids, runs))
    parts = [f'<nav class="toc">runs: {toc}</nav>' if len(runs) > 1 else "",
             "<h2>Curves</h2>", charts_block(runs), warnings_block(runs)]
    parts += [run_block(run, i, top) for run, i in zip(runs, ids)]
    return "".join(parts)


def charts_block(runs: Sequence[Run]) -> str:
    """Every chart the runs have data for (`charts`), each with its note and legend."""
    drawn = charts(runs)
    if not drawn:
        return '<p class="empty">no scalars logged (no metrics.jsonl or eval_history.jsonl)</p>'
    figures = []
    for chart in drawn:
        legend = "".join(
            f'<li><svg width="26" height="8"><line x1="0" x2="26" y1="4" y2="4" '
            f'stroke="{colour(s.colour)}" stroke-width="2" stroke-dasharray="{dash(s.dash)}"/>'
            f"</svg> {text(s.label)}</li>" for s in chart.series)
        figures.append(f'<figure class="chart" data-title="{text(chart.title)}"><figcaption>'
                       f'{text(chart.title)}</figcaption><p class="note">{text(chart.note)}</p>'
                       f'{line_chart(chart)}<ul class="legend">{legend}</ul></figure>')
    return f'<div class="charts">{"".join(figures)}</div>'


def warnings_block(runs: Sequence[Run]) -> str:
    """Every run's watch warnings (also marked on the curves)."""
    rows = [f'<tr class="warning" data-kind="{text(w.kind)}" data-round="{w.round}">'
            f"<td>{text(run.name)}</td><td class=num>{w.round}</td><td>{text(w.kind)}</td>"
            f"<td>{text(w.message)}</td></tr>" for run in runs for w in run.warnings]
    if not rows:
        return "<h3>Warnings</h3><p class=\"empty\">the watch raised no warning</p>"
    return ("<h3>Warnings</h3><table class=\"warnings\"><thead><tr><th>run</th><th>round</th>"
            f"<th>kind</th><th>message</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def run_block(run: Run, anchor: str, top: int) -> str:
    """A run's facts, config, last scalar values, criteria diff and cards by round."""
    rounds = sorted({c.round for c in run.cards})
    facts = [f"<code>{text(run.path)}</code>", f"method {text(run.method or 'unknown')}",
             f"{len(run.cards)} cards in {len(rounds)} rounds", f"{len(run.warnings)} warnings"]
    config = ("" if run.config is None else "<details class=\"config\"><summary>config.json"
              f"</summary><pre>{text(json.dumps(run.config, indent=1))}</pre></details>")
    return (f'<section class="run" id="{anchor}" data-run="{text(run.name)}"><h2>'
            f'{text(run.name)}</h2><p>{", ".join(facts)}</p>{config}{scalars_block(run)}'
            f"{criteria_block(run, top)}{rounds_block(run, anchor, rounds)}</section>")


def scalars_block(run: Run) -> str:
    """Every scalar's last value, folded: what the charts leave out is still here."""
    if not run.scalars:
        return ""
    rows = "".join(f'<tr data-scalar="{text(name)}"><td>{text(short_name(name))}</td>'
                   f"<td class=num>{points[-1][0]}</td><td class=num>{number(points[-1][1])}"
                   f"</td><td class=num>{number(min(y for _, y in points))}</td><td class=num>"
                   f"{number(max(y for _, y in points))}</td></tr>"
                   for name, points in run.scalars.items())
    return ('<details class="scalars"><summary>every scalar: last value</summary><table>'
            "<thead><tr><th>scalar</th><th>last round</th><th>last</th><th>min</th><th>max</th>"
            f"</tr></thead><tbody>{rows}</tbody></table></details>")


def criteria_block(run: Run, top: int) -> str:
    """The generator's most written criteria per card round and what entered or left them."""
    if not run.cards:
        return ""
    rows = []
    for t in top_criteria(run.cards, top):
        listed = "".join(f'<li data-criterion="{text(c)}">{text(c)} <span class="fact">×{n}'
                         f"</span></li>" for c, n in t.top)
        entered = "".join(f'<li class="entered">{text(c)}</li>' for c in t.entered)
        left = "".join(f'<li class="left">{text(c)}</li>' for c in t.left)
        rows.append(f'<tr data-round="{t.round}"><td class=num>{t.round}</td><td><ol class="top">'
                    f"{listed}</ol></td><td><ul>{entered}</ul></td><td><ul>{left}</ul></td></tr>")
    return (f"<h3>Criteria written most (top {top} per card round)</h3><table "
            'class="criteria-diff"><thead><tr><th>round</th><th>most written</th><th>entered'
            f"</th><th>left</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def rounds_block(run: Run, anchor: str, rounds: Sequence[int]) -> str:
    """The run's cards grouped by round, with links to each round and a select (script)."""
    if not rounds:
        return '<p class="empty">no rubric cards (cards.jsonl)</p>'
    links = " ".join(f'<a href="#{anchor}-round-{r}" data-round="{r}">{r}</a>' for r in rounds)
    options = "".join(f'<option value="{r}"{" selected" if r == rounds[-1] else ""}>round {r}'
                      "</option>" for r in rounds)
    sections = []
    for r in rounds:
        cards = "".join(card_block(c, f"{anchor}-round-{r}-row-{c.row}")
                        for c in run.cards if c.round == r)
        sections.append(f'<section class="round" id="{anchor}-round-{r}" data-round="{r}">'
                        f"<h3>Cards of round {r}</h3>{cards}</section>")
    return (f'<h3>Rubric cards</h3><nav class="round-nav" data-run="{anchor}">rounds: {links} '
            f'<select class="round-select" data-run="{anchor}"><option value="all">all rounds'
            f'</option>{options}</select></nav><div class="rounds" data-run="{anchor}">'
            f'{"".join(sections)}</div>')


def evaluation_section(evaluation: Evaluation) -> str:
    """An evaluate output: its metrics, then one card per query."""
    links = " ".join(f'<a href="#query-{i}">{text(q.id)}</a>'
                     for i, q in enumerate(evaluation.queries))
    cards = "".join(query_block(q, f"query-{i}") for i, q in enumerate(evaluation.queries))
    return (f"<h2>Metrics</h2>{metrics_block(evaluation.metrics)}<h2>Queries</h2>"
            f'<nav class="toc">{links}</nav>{cards}')


def metrics_block(metrics: Mapping[str, Any], fold_over: int = 24) -> str:
    """`metrics.json`: its top-level values in one table, each nested section in its own,
    folded when it has more than `fold_over` rows (per-tag scores run to hundreds)."""
    def table(rows: list[tuple[str, str]]) -> str:
        body = "".join(f'<tr data-metric="{text(k)}"><td>{text(k)}</td><td class="num">{v}'
                       "</td></tr>" for k, v in rows)
        return f'<table class="metrics"><tbody>{body}</tbody></table>'

    parts = [table(flatten({k: v for k, v in metrics.items() if not isinstance(v, Mapping)}))]
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            rows = flatten(value, f"{key}/")
            shown = " open" if len(rows) <= fold_over else ""
            parts.append(f"<details{shown}><summary>{text(key)} ({len(rows)} values)</summary>"
                         f"{table(rows)}</details>")
    return "".join(parts)


def flatten(value: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Nested metrics as (`a/b/c`, its value as shown) rows; lists are shown as JSON."""
    out = []
    for key, v in value.items():
        name = f"{prefix}{key}"
        if isinstance(v, Mapping):
            out += flatten(v, name + "/")
        elif isinstance(v, list):
            out.append((name, f"<code>{text(json.dumps(v))}</code>"))
        else:
            out.append((name, number(v)))
    return out
