"""Analyses analysts run on released synthetic data (Rubin's rules, ...)."""
