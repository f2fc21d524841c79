"""Discrete-event simulator that drives the real core (issue 5)."""
