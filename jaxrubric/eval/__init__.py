"""Evaluation: rubric-agreement and reward-benchmark metrics."""
