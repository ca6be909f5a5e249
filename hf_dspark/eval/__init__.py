"""Measuring DSpark: the side-by-side benchmark, replayed τ, and the float32 referee for bf16/fp16 mismatches."""
