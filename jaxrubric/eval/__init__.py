"""Evaluation: the `jaxrubric evaluate` methods (GenRubric on HealthBench rows, DynamicRubric
on preference data), the machinery they share, and the agreement and preference metrics."""
