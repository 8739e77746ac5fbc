"""Who contains and stops the ranks: the supervisor seam (docs/architecture.md)."""
