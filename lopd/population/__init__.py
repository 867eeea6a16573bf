"""Population training: the S members of one arm (seeds, or search trials) in one batched process."""
