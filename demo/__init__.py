"""UI pieces of the app: pure functions from the engine's records (`specdec.records`) to HTML/SVG and plotly figures.

Nothing here imports torch or keeps state in module globals; per-user state is a `Session` held in `gr.State`.
"""
