"""Validation-only hyper-parameter search (Optuna) and the sensitivity grid around its pick."""
