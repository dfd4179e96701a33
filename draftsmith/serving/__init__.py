"""Serving simulation: measured costs and acceptance traces replayed under load (`draftsmith serve-sim`)."""
