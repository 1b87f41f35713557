"""GRPO training of the DR-Generator and DR-Policy, and their co-evolution rounds."""
