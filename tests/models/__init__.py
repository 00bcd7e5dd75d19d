"""Tests of mapfjax.models."""
