"""Population training: the members of one arm (seeds, or search trials) in one batched process."""
