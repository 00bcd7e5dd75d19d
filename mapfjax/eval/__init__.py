"""Evaluation on the benchmark and run reports."""
