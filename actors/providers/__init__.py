"""Providers turn a run's context into the next plan."""
