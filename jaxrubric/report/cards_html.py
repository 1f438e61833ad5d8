"""A rubric card as HTML: the prompt, the answers with their rewards and advantages, and each
rubric's verdict grid (items x answers) with the items' weights and the rubric's scores.

The grid gives tests and scripts stable hooks: `<tr class="item" data-criterion=...
data-weight=...>` per item, `<td class="verdict pass|fail" data-answer=... data-p=...>` per
verdict (p: p_yes, or 0/1 for hard verdicts), `<td class="score" data-answer=...>` per score.
Every text is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from jaxrubric.report.data import Card, Query, Rubric


def text(value: Any) -> str:
    return escape(str(value), quote=True)


def number(value: Any, signed: bool = False) -> str:
    """A table cell's value: a number to 4 significant digits, "–" for none, yes / no."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)):
        return text(value)
    if isinstance(value, int):
        return f"{value:+d}" if signed else str(value)
    return f"{value:+.3f}" if signed else f"{value:.4g}"


def shade(p: float) -> str:
    """A soft verdict's background: red at p_yes 0 through yellow to green at 1."""
    return f"hsl({120 * min(max(p, 0.0), 1.0):.0f} 70% 80%)"


def verdict_grid(rubric: Rubric, num_answers: int, soft: bool) -> str:
    """The rubric's items x answers table, coloured by verdict (shaded by p_yes when `soft`),
    with each item's weight, GenRubric's item rewards where present, and a row of scores."""
    rewards = any(i.reward is not None for i in rubric.items)
    head = "".join(f'<th class="answer" data-answer="{a}">{a}</th>' for a in range(num_answers))
    rows = [f'<table class="grid"><thead><tr><th>weight</th><th>criterion</th>{head}'
            + ("<th>item reward</th>" if rewards else "") + "</tr></thead><tbody>"]
    for item in rubric.items:
        cells = []
        for a, (p, passed) in enumerate(zip(item.p, item.passed)):
            style = f' style="background:{shade(p)}"' if soft else ""
            mark = "✓" if passed else "✗"
            cells.append(f'<td class="verdict {"pass" if passed else "fail"}" data-answer="{a}" '
                         f'data-p="{p:.4g}"{style} title="answer {a}: p_yes {p:.3f}">{mark}'
                         + (f" {p:.2f}" if soft else "") + "</td>")
        slot = "" if item.slot is None else f' data-slot="{item.slot}"'
        rows.append(f'<tr class="item" data-criterion="{text(item.criterion)}" '
                    f'data-weight="{item.weight}"{slot}><td class="weight">{item.weight:+d}</td>'
                    f'<td class="criterion">{text(item.criterion)}</td>{"".join(cells)}'
                    + (f'<td class="num">{number(item.reward, True)}</td>' if rewards else "")
                    + "</tr>")
    scores = "".join(f'<td class="score num" data-answer="{a}">{number(s)}</td>'
                     for a, s in enumerate(rubric.scores))
    rows.append(f'<tr class="scores"><td></td><th>score</th>{scores}'
                + ("<td></td>" if rewards else "") + "</tr></tbody></table>")
    return "".join(rows)


def rubric_block(rubric: Rubric, num_answers: int, soft: bool) -> str:
    """A rubric: its label, validity, facts (reward, advantage, ...), text and grid."""
    badges = ""
    if rubric.valid is not None:
        badges = (f'<span class="badge {"valid" if rubric.valid else "invalid"}">'
                  f'{"valid" if rubric.valid else "invalid"}</span>')
    facts = " ".join(f'<span class="fact">{text(k)} {number(v, k == "advantage")}</span>'
                     for k, v in rubric.facts.items())
    written = (f"<details><summary>as written</summary><pre>{text(rubric.text)}</pre></details>"
               if rubric.text is not None else "")
    grid = (verdict_grid(rubric, num_answers, soft) if rubric.items
            else '<p class="empty">no item parsed</p>')
    return (f'<section class="rubric" data-rubric="{text(rubric.label)}"><h5>'
            f'{text(rubric.label)} {badges} {facts}</h5>{written}{grid}</section>')


def card_block(card: Card, anchor: str) -> str:
    """A training card: the prompt, its answers table and its rubrics."""
    answers = card.answers
    optional = [(name, key) for name, key in (("group", "group"), ("oracle", "oracle"),
                                               ("rubric score", "rubric_reward"))
                if any(getattr(a, key) is not None for a in answers)]
    head = "".join(f"<th>{name}</th>" for name, _ in optional)
    rows = []
    for i, a in enumerate(answers):
        extra = "".join(f'<td class="num">{number(getattr(a, key))}</td>' for _, key in optional)
        rewarded = "" if a.rewarded else ' class="unrewarded" title="no reward"'
        rows.append(f'<tr class="answer" data-answer="{i}"><td>{i}</td>'
                    f'<td class="num"{rewarded}>{number(a.reward)}</td>'
                    f'<td class="num">{number(a.advantage, True)}</td>'
                    f'<td class="num">{a.length}</td>{extra}'
                    f'<td class="text"><pre>{text(a.text)}</pre></td></tr>')
    table = (f'<table class="answers"><thead><tr><th>answer</th><th>reward</th><th>advantage'
             f'</th><th>tokens</th>{head}<th>text</th></tr></thead><tbody>{"".join(rows)}'
             "</tbody></table>")
    verdicts = "p_yes" if card.soft_verdicts else "0/1"
    rubrics = "".join(rubric_block(r, len(answers), card.soft_verdicts) for r in card.rubrics)
    return (f'<article class="card" id="{anchor}" data-round="{card.round}" '
            f'data-row="{card.row}"><h4>round {card.round}, row {card.row} '
            f'<span class="fact">{text(card.method)}, verdicts {verdicts}</span></h4>'
            f'<div class="prompt"><pre>{text(card.prompt)}</pre></div>{table}{rubrics}</article>')


def query_block(query: Query, anchor: str) -> str:
    """An evaluate output's query: its responses' score rows and its rubrics' grids (the
    responses' texts are not in the output files, only their indices)."""
    keys = _columns(query.responses)
    head = "".join(f"<th>{text(k)}</th>" for k in keys)
    rows = "".join(f'<tr class="response" data-answer="{r.get("response")}">'
                   + "".join(f"<td>{_cell(r.get(k))}</td>" for k in keys) + "</tr>"
                   for r in query.responses)
    rubrics = "".join(rubric_block(r, len(query.responses), True) for r in query.rubrics)
    return (f'<article class="card query" id="{anchor}" data-query="{text(query.id)}">'
            f'<h4>query {text(query.id)}</h4><table class="answers"><thead><tr>{head}</tr>'
            f'</thead><tbody>{rows}</tbody></table>{rubrics}</article>')


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k != "id" and k not in keys]
    return keys


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"<code>{text(json.dumps(_rounded(value)))}</code>"
    return number(value)


def _rounded(value: Any) -> Any:
    """Nested values with their floats at 4 significant digits (a table cell, not a record)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value
