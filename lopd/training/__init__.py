"""Training: one run of one arm (``run``), the trainer loop and what it needs."""
