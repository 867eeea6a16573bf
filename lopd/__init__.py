"""LOPD: Latent On-Policy Self-Distillation, with its baselines, as a reproducible pipeline."""

__version__ = "0.1.0"
