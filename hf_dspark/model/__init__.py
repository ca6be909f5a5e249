"""The drafter itself: its config, layers and heads (with HEADS), the fit to a target, the DeepSpec format."""
