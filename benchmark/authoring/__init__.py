"""Re-runnable scripts that write benchmark cases (one per author batch)."""
