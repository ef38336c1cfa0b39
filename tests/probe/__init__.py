"""Tests for the training-side probe (trainsentry.probe)."""
