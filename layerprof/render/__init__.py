"""Rendering: units (the one place that formats numbers), the annotated summary, tables and exports, the trace,
comparisons and plots. Renderers read records and rows; they never import collection or file handling."""
