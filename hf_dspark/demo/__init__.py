"""The live demo: a generation session that records each token's fate, its HTML rendering, and the Gradio app."""
