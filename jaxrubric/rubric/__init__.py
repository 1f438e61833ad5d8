"""Rubrics: the grammar of generated rubrics, their parsing, verification and scoring."""
