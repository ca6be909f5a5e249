"""Assisted decoding with a DSpark drafter: routing from generate(), the candidate generator, verify policies,
the scheduler and its device profile, n-gram drafts, the logits observer and the run statistics."""
