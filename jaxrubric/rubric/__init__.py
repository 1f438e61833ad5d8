"""Rubrics: the grammar of generated rubrics, their parsing, verification and scoring."""

from jaxrubric.rubric.parse import ParsedRubric, RubricItem, format_rubric, parse_rubric

__all__ = ["ParsedRubric", "RubricItem", "format_rubric", "parse_rubric"]
