"""Loading targets and drafters (the embedded default target, the shipped drafter, any target by id or folder)."""
