"""Decisions about a pair of models: anytime-valid estimates and the TV gate (`sequential`), and
certified lower bounds from text samples alone (`distinguish`)."""
